"""Hand-written allreduce, reduce-scatter and allgather on point-to-point messages.

Any rank count ``p``, any length (also below ``p``, and zero), 1-D contiguous float32 /
float64 arrays; ``op`` "sum" or "max", reduced by NumPy ufuncs in place; messages are
contiguous views, never copies. Costs are per rank, alpha per message, beta per byte
sent, gamma per byte reduced; ``n`` is the vector size in bytes, ``p' = 2**floor(log2 p)``.
"""
import numpy as np
from mpi4py import MPI

from kernels.distribution import block_offsets, block_range
from kernels.errors import InputError

REDUCE_OPS = {"sum": np.add, "max": np.maximum}
SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
# Tag of every message sent here, apart from the user's own traffic on ``comm``.
COLLECTIVE_TAG = 0x6D6C


def _reduce_ufunc(op):
    try:
        return REDUCE_OPS[op]
    except (KeyError, TypeError):
        raise InputError(f"unknown reduction op {op!r}; choose one of: {', '.join(REDUCE_OPS)}") from None


def _operands(sendbuf, recvbuf):
    """Validate both buffers and return the input array (``recvbuf`` when in place)."""
    source = recvbuf if sendbuf is MPI.IN_PLACE else sendbuf
    for name, array in (("recvbuf", recvbuf), ("sendbuf", source)):
        if not isinstance(array, np.ndarray) or array.ndim != 1 or not array.flags.c_contiguous:
            raise InputError(f"{name} must be a 1-D contiguous NumPy array")
        if array.dtype not in SUPPORTED_DTYPES:
            raise InputError(f"{name} has dtype {array.dtype}; supported: float32, float64")
    if source.dtype != recvbuf.dtype:
        raise InputError(f"sendbuf is {source.dtype} but recvbuf is {recvbuf.dtype}")
    return source


def _check_size(name, array, size, meaning):
    if array.size != size:
        raise InputError(f"{name} has {array.size} items, expected {size} ({meaning})")


def _check_block(name, array, n, comm):
    """``array`` must have the length of this rank's block of ``n`` items."""
    start, stop = block_range(n, comm.size, comm.rank)
    _check_size(name, array, stop - start, f"block {comm.rank} of {n} items over {comm.size} ranks")


def _allreduce_operands(sendbuf, recvbuf, op, copy_input=True):
    """Validate allreduce arguments; return the input array and the ufunc.

    With ``copy_input`` an out-of-place input is first copied into ``recvbuf``.
    """
    ufunc = _reduce_ufunc(op)
    source = _operands(sendbuf, recvbuf)
    _check_size("sendbuf", source, recvbuf.size, "the length of recvbuf")
    if copy_input and source is not recvbuf:
        np.copyto(recvbuf, source)
    return source, ufunc


def _block_slices(n, parts):
    """Slices of the ``parts`` blocks of ``n`` items (layout of `block_range`)."""
    bounds = block_offsets(n, parts) + [n]
    return [slice(start, stop) for start, stop in zip(bounds, bounds[1:])]


def _exchange(comm, outgoing, dest, incoming, source):
    """Send ``outgoing`` to ``dest`` while receiving ``incoming`` from ``source``."""
    comm.Sendrecv(outgoing, dest, COLLECTIVE_TAG, recvbuf=incoming, source=source, recvtag=COLLECTIVE_TAG)


def _exchange_and_reduce(comm, outgoing, dest, incoming, source, local, ufunc, out=None):
    """`_exchange`, then ``out = local (op) incoming`` (``out`` defaults to ``local``); return ``out``."""
    _exchange(comm, outgoing, dest, incoming, source)
    return ufunc(local, incoming, out=local if out is None else out)


def _ring_reduce_scatter(comm, source, slices, ufunc, out, landing=None):
    """Reduce ``source`` around the ring so that ``out`` gets block ``comm.rank`` reduced.

    At step ``s`` rank ``r`` sends its partial of block ``r-1-s`` to the right and
    reduces the partial of block ``r-2-s`` coming from the left. Partials land in
    ``landing[slices[block]]`` (a full-length array free to overwrite, ``out`` its own
    block), or in two alternating scratch blocks when ``landing`` is None.
    """
    p, rank = comm.size, comm.rank
    if p == 1:
        if not np.may_share_memory(out, source):
            np.copyto(out, source[slices[rank]])
        return
    left, right = (rank - 1) % p, (rank + 1) % p
    if landing is None:
        width = max(part.stop - part.start for part in slices)
        scratch = np.empty((2, width), dtype=source.dtype)
    outgoing = source[slices[(rank - 1) % p]]
    for step in range(p - 1):
        part = slices[(rank - 2 - step) % p]
        count = part.stop - part.start
        incoming = landing[part] if landing is not None else scratch[step % 2, :count]
        target = out if step == p - 2 else incoming
        outgoing = _exchange_and_reduce(comm, outgoing, right, incoming, left, source[part], ufunc, target)


def _ring_allgather(comm, work, slices):
    """Fill every block of ``work`` from block ``comm.rank``, passing blocks to the right."""
    p, rank = comm.size, comm.rank
    left, right = (rank - 1) % p, (rank + 1) % p
    for step in range(p - 1):
        _exchange(comm, work[slices[(rank - step) % p]], right, work[slices[(rank - step - 1) % p]], left)


class _PowerOfTwoFold:
    """Fold ``p`` ranks onto ``p' = 2**floor(log2 p)`` virtual ranks (MPICH's scheme).

    Of the first ``2 (p - p')`` ranks, each even one sends its whole ``work`` to the
    odd one above it, which reduces it and stands for both; the even ones wait in
    `unfold` for the result. Other ranks keep going as virtual rank ``rank - (p - p')``.
    """

    def __init__(self, comm, work, scratch, ufunc):
        self.comm, self.scratch, self.ufunc = comm, scratch, ufunc
        self.size = 1 << (comm.size.bit_length() - 1)
        self.extra = comm.size - self.size
        rank = comm.rank
        self.rank = None
        if rank < 2 * self.extra:
            if rank % 2 == 0:
                comm.Send(work, dest=rank + 1, tag=COLLECTIVE_TAG)
                return
            comm.Recv(scratch, source=rank - 1, tag=COLLECTIVE_TAG)
            ufunc(work, scratch, out=work)
            self.rank = rank // 2
        else:
            self.rank = rank - self.extra

    @classmethod
    def start(cls, comm, sendbuf, recvbuf, op):
        """Validate an allreduce, copy its input into ``recvbuf`` and fold; None when nothing is to reduce.

        The fold gets a scratch vector as long as ``recvbuf`` for incoming data.
        """
        ufunc = _allreduce_operands(sendbuf, recvbuf, op)[1]
        if recvbuf.size == 0 or comm.size == 1:
            return None
        return cls(comm, recvbuf, np.empty_like(recvbuf), ufunc)

    def real_rank(self, virtual_rank):
        """Rank in ``comm`` of a virtual rank."""
        return 2 * virtual_rank + 1 if virtual_rank < self.extra else virtual_rank + self.extra

    def unfold(self, work):
        """Hand the finished ``work`` back to the ranks folded away."""
        rank = self.comm.rank
        if rank < 2 * self.extra:
            if rank % 2:
                self.comm.Send(work, dest=rank - 1, tag=COLLECTIVE_TAG)
            else:
                self.comm.Recv(work, source=rank + 1, tag=COLLECTIVE_TAG)


def allreduce_ring(comm, sendbuf, recvbuf, op="sum"):
    """Allreduce by a ring reduce-scatter followed by a ring allgather.

    Parameters
    ----------
    comm : MPI.Comm
        Every rank calls with the same length, dtype and ``op``.
    sendbuf : ndarray, shape (n,), or MPI.IN_PLACE
        This rank's contribution; ``MPI.IN_PLACE`` takes it from ``recvbuf``.
    recvbuf : ndarray, shape (n,)
        Gets the elementwise reduction over all ranks (same on every rank).
    op : {"sum", "max"}

    Returns
    -------
    recvbuf

    Notes
    -----
    Blocks follow `block_range` (uneven splits). Out of place, partial results land
    in ``recvbuf`` itself, so no scratch memory is used. Cost per rank:
    ``2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma`` (bandwidth-optimal).
    """
    source, ufunc = _allreduce_operands(sendbuf, recvbuf, op, copy_input=False)
    if recvbuf.size == 0:
        return recvbuf
    slices = _block_slices(recvbuf.size, comm.size)
    landing = None if source is recvbuf else recvbuf
    _ring_reduce_scatter(comm, source, slices, ufunc, recvbuf[slices[comm.rank]], landing)
    _ring_allgather(comm, recvbuf, slices)
    return recvbuf


def allreduce_recursive_doubling(comm, sendbuf, recvbuf, op="sum"):
    """Allreduce by recursive doubling: ``log2 p'`` full-vector exchanges.

    Parameters and return value as `allreduce_ring`.

    Notes
    -----
    For ``p`` not a power of two the first ``2 (p - p')`` ranks fold pairwise first
    and get the result back at the end (`_PowerOfTwoFold`). Cost per rank:
    ``log2 p' (alpha + n beta + n gamma)``; folding adds ``2 (alpha + n beta) + n gamma``
    to the critical path. Latency-optimal; best for small vectors.
    """
    fold = _PowerOfTwoFold.start(comm, sendbuf, recvbuf, op)
    if fold is None:
        return recvbuf
    if fold.rank is not None:
        distance = 1
        while distance < fold.size:
            partner = fold.real_rank(fold.rank ^ distance)
            _exchange_and_reduce(comm, recvbuf, partner, fold.scratch, partner, recvbuf, fold.ufunc)
            distance <<= 1
    fold.unfold(recvbuf)
    return recvbuf


def allreduce_rabenseifner(comm, sendbuf, recvbuf, op="sum"):
    """Allreduce by recursive-halving reduce-scatter and recursive-doubling allgather.

    Parameters and return value as `allreduce_ring`.

    Notes
    -----
    The vector is split into ``p'`` blocks (`block_range`; some are empty when
    ``n < p'``). At distance ``d = p'/2, ..., 1`` each virtual rank keeps the group of
    ``d`` blocks holding its own block and sends its partner the other group; the
    allgather retraces the steps with ``d = 1, ..., p'/2``. Extra ranks fold as in
    `allreduce_recursive_doubling`. Cost per rank:
    ``2 log2 p' alpha + 2 (p'-1)/p' n beta + (p'-1)/p' n gamma``; folding adds
    ``2 (alpha + n beta) + n gamma`` to the critical path.
    """
    fold = _PowerOfTwoFold.start(comm, sendbuf, recvbuf, op)
    if fold is None:
        return recvbuf
    if fold.rank is not None:
        bounds = block_offsets(recvbuf.size, fold.size) + [recvbuf.size]

        def group(virtual_rank, distance):
            first = virtual_rank // distance * distance
            return slice(bounds[first], bounds[first + distance])

        distances = [1 << k for k in range(fold.size.bit_length() - 1)]
        for distance in reversed(distances):
            partner = fold.rank ^ distance
            mine, theirs = group(fold.rank, distance), group(partner, distance)
            real = fold.real_rank(partner)
            incoming = fold.scratch[: mine.stop - mine.start]
            _exchange_and_reduce(comm, recvbuf[theirs], real, incoming, real, recvbuf[mine], fold.ufunc)
        for distance in distances:
            partner = fold.rank ^ distance
            real = fold.real_rank(partner)
            _exchange(comm, recvbuf[group(fold.rank, distance)], real, recvbuf[group(partner, distance)], real)
    fold.unfold(recvbuf)
    return recvbuf


def allreduce_tree(comm, sendbuf, recvbuf, op="sum"):
    """Allreduce by a binomial-tree reduce to rank 0 and a binomial-tree broadcast.

    Parameters and return value as `allreduce_ring`.

    Notes
    -----
    Critical path ``2 ceil(log2 p) (alpha + n beta) + ceil(log2 p) n gamma``; each
    rank sends one message in the reduce and up to ``ceil(log2 p)`` (rank 0) in the
    broadcast. Simple, but neither latency- nor bandwidth-optimal.
    """
    ufunc = _allreduce_operands(sendbuf, recvbuf, op)[1]
    p, rank = comm.size, comm.rank
    if recvbuf.size == 0 or p == 1:
        return recvbuf
    scratch = np.empty_like(recvbuf)
    distance = 1
    while distance < p and not rank & distance:
        if rank + distance < p:
            comm.Recv(scratch, source=rank + distance, tag=COLLECTIVE_TAG)
            ufunc(recvbuf, scratch, out=recvbuf)
        distance <<= 1
    if distance < p:
        comm.Send(recvbuf, dest=rank - distance, tag=COLLECTIVE_TAG)
        comm.Recv(recvbuf, source=rank - distance, tag=COLLECTIVE_TAG)
    # ``distance`` is now this rank's lowest set bit (p rounded up to a power of two on rank 0).
    distance >>= 1
    while distance:
        if rank + distance < p:
            comm.Send(recvbuf, dest=rank + distance, tag=COLLECTIVE_TAG)
        distance >>= 1
    return recvbuf


def reduce_scatter_ring(comm, sendbuf, recvbuf, op="sum"):
    """Reduce ``n`` items over all ranks and leave block ``comm.rank`` on each rank (ring).

    Parameters
    ----------
    comm : MPI.Comm
    sendbuf : ndarray, shape (n,), or MPI.IN_PLACE
        This rank's full-length contribution.
    recvbuf : ndarray
        Out of place: shape ``(block_counts(n, p)[rank],)``, gets the reduced block
        ``block_range(n, p, rank)``. In place: shape ``(n,)``, holds the input; on
        return its block ``block_range(n, p, rank)`` holds the result and the other
        blocks are left as they were.
    op : {"sum", "max"}

    Returns
    -------
    recvbuf

    Notes
    -----
    Cost per rank: ``(p-1) alpha + (p-1)/p n beta + (p-1)/p n gamma``; scratch: two blocks.
    """
    ufunc = _reduce_ufunc(op)
    source = _operands(sendbuf, recvbuf)
    slices = _block_slices(source.size, comm.size)
    if source is not recvbuf:
        _check_block("recvbuf", recvbuf, source.size, comm)
    out = recvbuf[slices[comm.rank]] if source is recvbuf else recvbuf
    if source.size:
        _ring_reduce_scatter(comm, source, slices, ufunc, out)
    return recvbuf


def allgather_ring(comm, sendbuf, recvbuf):
    """Gather every rank's block into the full vector on every rank (ring).

    Parameters
    ----------
    comm : MPI.Comm
    sendbuf : ndarray, shape (block_counts(n, p)[rank],), or MPI.IN_PLACE
        This rank's block; ``MPI.IN_PLACE``: it already sits in ``recvbuf`` at
        ``block_range(n, p, rank)``.
    recvbuf : ndarray, shape (n,)
        Gets block ``r`` of every rank ``r`` at ``block_range(n, p, r)``.

    Returns
    -------
    recvbuf

    Notes
    -----
    Cost per rank: ``(p-1) alpha + (p-1)/p n beta``.
    """
    source = _operands(sendbuf, recvbuf)
    slices = _block_slices(recvbuf.size, comm.size)
    if source is not recvbuf:
        _check_block("sendbuf", source, recvbuf.size, comm)
        np.copyto(recvbuf[slices[comm.rank]], source)
    if recvbuf.size:
        _ring_allgather(comm, recvbuf, slices)
    return recvbuf


ALLREDUCE_ALGORITHMS = {
    "ring": allreduce_ring,
    "recursive_doubling": allreduce_recursive_doubling,
    "rabenseifner": allreduce_rabenseifner,
    "tree": allreduce_tree,
}
