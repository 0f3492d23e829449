"""Alltoall by pairwise exchange: ``p - 1`` steps, one partner each way per step (MPICH's pairwise).

At step ``s`` rank ``r`` sends its block for ``(r + s) % p`` and receives from
``(r - s) % p``; on a power-of-two rank count both partners are ``r XOR s`` (every
step pairs the ranks off). Block layout, in place and empty blocks as in
`parallel.collectives.alltoall.blocks`; cost notation of `parallel.collectives.base`.
"""
from parallel.collectives.alltoall.blocks import AlltoallBlocks, alltoall_length
from parallel.collectives.plans import Collective


def pairwise_schedule(rank, p, n, itemsize=None, in_place=False, counts=None):
    """Steps of `alltoall_pairwise` on ``rank`` for a send vector of ``n`` items (a `Schedule`;
    ``counts``: the v-variant's, `parallel.collectives.alltoall.blocks`)."""
    blocks = AlltoallBlocks(rank, p, n, in_place, counts)
    schedule = blocks.start()
    power_of_two = p & (p - 1) == 0
    for step in range(1, p):
        dest, source = (rank ^ step,) * 2 if power_of_two else ((rank + step) % p, (rank - step) % p)
        sends, recvs = blocks.messages(dest, source)
        if sends or recvs:
            schedule.step(sends, recvs)
    return schedule


_PAIRWISE = Collective("alltoall_pairwise", pairwise_schedule, alltoall_length, reduces=False)


def alltoall_pairwise(comm, sendbuf, recvbuf, counts=None):
    """Alltoall by ``p - 1`` pairwise exchanges.

    Parameters
    ----------
    comm : MPI.Comm
        Every rank calls with the same ``n`` and dtype.
    sendbuf : buffer, shape (n,), or MPI.IN_PLACE
        Block ``block_range(n, p, j)`` goes to rank ``j``. ``MPI.IN_PLACE``: the blocks
        are in ``recvbuf`` (``n`` a multiple of ``p`` only).
    recvbuf : buffer, shape (p * c,)
        ``c``: the length of this rank's block, ``block_range(n, p, rank)``. Gets rank
        ``i``'s block for this rank at ``i c .. (i+1) c``.
    counts : tuple, optional
        The v-variant (``MPI_Alltoallv``): ``(sendcounts, recvcounts)``, each a tuple of ``p``
        items; the blocks lie one after another in ``sendbuf`` and ``recvbuf``
        (`parallel.collectives.alltoall.blocks`). Out of place only.

    Returns
    -------
    recvbuf

    Notes
    -----
    Cost per rank: ``(p-1) alpha + (p-1)/p n beta`` (empty blocks, when ``n < p``, are
    not sent), plus the local copy of the own block (``n / p`` bytes). No scratch out
    of place; in place, ``n`` bytes (a copy of ``recvbuf``). One message in flight
    each way: long messages keep the links busy without flooding any rank.
    """
    return _PAIRWISE(comm, sendbuf, recvbuf, None, counts)
