"""Where an alltoall's blocks lie, its length rule, and the steps every algorithm shares.

``sendbuf`` (``n`` items) holds ``p`` blocks laid out by `block_range`: block ``j``
goes to rank ``j`` and has ``c_j`` items. ``recvbuf`` gets, from every rank ``i``, that
rank's block ``rank`` (``c = c_rank`` items), at ``i c .. (i+1) c``: ``p c`` items. With
``n`` a multiple of ``p`` this is ``MPI_Alltoall`` (``n / p`` items per pair), else
``MPI_Alltoallv`` with counts ``c_j`` from every rank to rank ``j``. In place
(``MPI.IN_PLACE``) only for ``n`` a multiple of ``p``: ``recvbuf`` (``n`` items) holds the
send blocks and is overwritten; the algorithms then send from a copy of it in scratch
(``n`` bytes copied and held). Every rank must pass the same ``n`` and dtype.

The v-variant (``MPI_Alltoallv`` with displacements one after another, as MoE's token
routing needs: counts that depend on the data) takes ``counts = (sendcounts, recvcounts)``,
two tuples of ``p`` items: ``sendbuf`` holds ``sendcounts[j]`` items for rank ``j``, one block
after another, and ``recvbuf`` gets ``recvcounts[i]`` items from rank ``i`` (each rank's
``sendcounts[j]`` equal to rank ``j``'s ``recvcounts[rank]``, as MPI requires); out of place only.
"""
from kernels.distribution import block_counts
from parallel.collectives.base import block_slices, check_counts
from parallel.collectives.schedule import Schedule


def alltoall_length(comm, source, recvbuf, counts=None):
    """Check ``recvbuf`` against the send length ``n`` (the rule above, or ``counts``) and return ``n``."""
    p = comm.size
    if counts is not None:
        if source is recvbuf:
            raise ValueError("alltoallv (counts given) runs out of place only")
        if not isinstance(counts, tuple) or len(counts) != 2:
            raise ValueError(f"alltoallv counts must be a pair (sendcounts, recvcounts), got {counts!r}")
        check_counts(comm, counts[0], source.size)
        check_counts(comm, counts[1], recvbuf.size)
        return source.size
    if source is recvbuf:
        if recvbuf.size % p:
            raise ValueError(f"alltoall in place needs a length that is a multiple of the rank count: "
                             f"recvbuf has {recvbuf.size} items over {p} ranks")
        return recvbuf.size
    count = block_counts(source.size, p)[comm.rank]
    if recvbuf.size != p * count:
        raise ValueError(f"recvbuf has {recvbuf.size} items, expected {p * count} ({p} blocks of {count}: "
                         f"block {comm.rank} of the {source.size} items of sendbuf over {p} ranks)")
    return source.size


class AlltoallBlocks:
    """One rank's blocks: views to send, views to receive into, and where scratch begins.

    Parameters
    ----------
    rank, p : int
    n : int
        Items of the send vector.
    in_place : bool
        Whether the send blocks are in "out" (then `start` copies them to "tmp" first).
    counts : tuple, optional
        ``(sendcounts, recvcounts)`` of the v-variant (out of place).

    Attributes
    ----------
    counts : list of int
        ``c_j``: items of block ``j`` (what any rank sends to rank ``j``); `block_range`'s
        blocks also for the v-variant (whose blocks are the ``counts`` given).
    scratch : int
        First item of "tmp" free for the algorithm (after the in-place copy).
    """

    def __init__(self, rank, p, n, in_place, counts=None):
        self.rank, self.p, self.n, self.in_place = rank, p, n, in_place
        self.counts = block_counts(n, p)
        send_counts, recv_counts = counts if counts is not None else (self.counts, (self.counts[rank],) * p)
        self._sends = block_slices(n, p, send_counts)
        self._recvs = block_slices(sum(recv_counts), p, recv_counts)
        self._source = "tmp" if in_place else "in"
        self.scratch = n if in_place else 0

    def send(self, dest):
        """The view of the block for rank ``dest``."""
        return self._source, self._sends[dest]

    def recv(self, source):
        """The view of "out" that gets rank ``source``'s block."""
        return "out", self._recvs[source]

    def start(self):
        """A schedule holding the local part: in place, the copy of the send blocks to scratch (this
        rank's own block is already where it belongs); out of place, the copy of the own block."""
        schedule = Schedule()
        if self.in_place and self.n:
            schedule.copy(("out", slice(0, self.n)), ("tmp", slice(0, self.n)))
        elif self._sizes(self.rank)[0]:
            schedule.copy(self.send(self.rank), self.recv(self.rank))
        return schedule

    def messages(self, dest, source):
        """``(sends, recvs)`` of exchanging blocks with ``dest`` / ``source``; empty blocks are not sent."""
        sends = [(self.send(dest), dest)] if self._sizes(dest)[0] else []
        recvs = [(self.recv(source), source)] if self._sizes(source)[1] else []
        return sends, recvs

    def _sizes(self, peer):
        """Items of the block for ``peer`` and of the block from ``peer``."""
        sent, received = self._sends[peer], self._recvs[peer]
        return sent.stop - sent.start, received.stop - received.start
