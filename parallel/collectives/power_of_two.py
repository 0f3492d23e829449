"""Allreduce on ``p' = 2**floor(log2 p)`` virtual ranks: recursive doubling and Rabenseifner.

Both pair ranks whose virtual ranks differ in one bit, so they need a power-of-two
rank count; other counts fold the surplus ranks in first (`_PowerOfTwoFold`,
MPICH's scheme) and hand them the result at the end. Conventions and cost
notation as in `parallel.collectives.base`.
"""
import numpy as np

from kernels.distribution import block_offsets
from parallel.collectives.base import (COLLECTIVE_TAG, accepts_buffers, allreduce_operands, exchange,
                                      exchange_and_reduce)


class _PowerOfTwoFold:
    """Fold ``p`` ranks onto ``p' = 2**floor(log2 p)`` virtual ranks (MPICH's scheme).

    Of the first ``2 (p - p')`` ranks, each even one sends its whole input to the
    odd one above it, which reduces both into ``recvbuf`` and stands for both; the
    even ones wait in `unfold` for the result. Other ranks keep going as virtual
    rank ``rank - (p - p')``. ``data`` is where this rank's contribution now is:
    ``recvbuf`` after a fold, else the input itself. Out of place the input is not
    copied: the algorithms' first step reads ``data`` and writes ``recvbuf``.
    """

    def __init__(self, comm, source, recvbuf, scratch, ufunc):
        self.comm, self.scratch, self.ufunc = comm, scratch, ufunc
        self.size = 1 << (comm.size.bit_length() - 1)
        self.extra = comm.size - self.size
        rank = comm.rank
        self.rank, self.data = None, source
        if rank < 2 * self.extra:
            if rank % 2 == 0:
                comm.Send(source, dest=rank + 1, tag=COLLECTIVE_TAG)
                return
            comm.Recv(scratch, source=rank - 1, tag=COLLECTIVE_TAG)
            ufunc(source, scratch, out=recvbuf)
            self.rank, self.data = rank // 2, recvbuf
        else:
            self.rank = rank - self.extra

    @classmethod
    def start(cls, comm, sendbuf, recvbuf, op):
        """Validate an allreduce and fold; None when nothing is to reduce (one rank: input copied).

        The fold gets a scratch vector as long as ``recvbuf`` for incoming data.
        """
        source, ufunc = allreduce_operands(sendbuf, recvbuf, op, copy_input=comm.size == 1)
        if recvbuf.size == 0 or comm.size == 1:
            return None
        return cls(comm, source, recvbuf, np.empty_like(recvbuf), ufunc)

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


@accepts_buffers
def allreduce_recursive_doubling(comm, sendbuf, recvbuf, op="sum"):
    """Allreduce by recursive doubling: ``log2 p'`` full-vector exchanges.

    Parameters and return value as `parallel.collectives.ring.allreduce_ring`.

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
        data, distance = fold.data, 1
        while distance < fold.size:
            partner = fold.real_rank(fold.rank ^ distance)
            exchange_and_reduce(comm, data, partner, fold.scratch, partner, data, fold.ufunc, out=recvbuf)
            data, distance = recvbuf, distance << 1
    fold.unfold(recvbuf)
    return recvbuf


@accepts_buffers
def allreduce_rabenseifner(comm, sendbuf, recvbuf, op="sum"):
    """Allreduce by recursive-halving reduce-scatter and recursive-doubling allgather.

    Parameters and return value as `parallel.collectives.ring.allreduce_ring`.

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

        distances, data = [1 << k for k in range(fold.size.bit_length() - 1)], fold.data
        for distance in reversed(distances):
            partner = fold.rank ^ distance
            mine, theirs = group(fold.rank, distance), group(partner, distance)
            real = fold.real_rank(partner)
            incoming = fold.scratch[: mine.stop - mine.start]
            exchange_and_reduce(comm, data[theirs], real, incoming, real, data[mine], fold.ufunc, out=recvbuf[mine])
            data = recvbuf
        for distance in distances:
            partner = fold.rank ^ distance
            real = fold.real_rank(partner)
            exchange(comm, recvbuf[group(fold.rank, distance)], real, recvbuf[group(partner, distance)], real)
    fold.unfold(recvbuf)
    return recvbuf
