"""Alltoall with every message in flight at once (MPICH's "scattered", the whole job one batch).

Rank ``r`` posts its receives from ``(r + i) % p`` and its sends to ``(r - i) % p``,
``i = 1 .. p-1`` (staggered, so no rank is every rank's first peer), then waits for
all of them. Block layout, in place and empty blocks as in
`parallel.collectives.alltoall.blocks`; cost notation of `parallel.collectives.base`.
"""
from parallel.collectives.alltoall.blocks import AlltoallBlocks, alltoall_length
from parallel.collectives.plans import Collective


def scattered_schedule(rank, p, n, itemsize=None, in_place=False, counts=None):
    """Steps of `alltoall_scattered` on ``rank`` for a send vector of ``n`` items (a `Schedule`;
    ``counts``: the v-variant's, `parallel.collectives.alltoall.blocks`)."""
    blocks = AlltoallBlocks(rank, p, n, in_place, counts)
    schedule = blocks.start()
    sends, recvs = [], []
    for offset in range(1, p):
        outgoing, incoming = blocks.messages((rank - offset) % p, (rank + offset) % p)
        sends += outgoing
        recvs += incoming
    if sends or recvs:
        schedule.step(sends, recvs)
    return schedule


_SCATTERED = Collective("alltoall_scattered", scattered_schedule, alltoall_length, reduces=False)


def alltoall_scattered(comm, sendbuf, recvbuf, counts=None):
    """Alltoall posting all ``p - 1`` receives and sends at once, then one wait.

    Parameters and return value as
    `parallel.collectives.alltoall.pairwise.alltoall_pairwise`.

    Notes
    -----
    Cost per rank: ``(p-1) alpha + (p-1)/p n beta`` as pairwise, but the latencies
    overlap (about one ``alpha`` plus the per-message overheads on the critical
    path), while ``2 (p-1)`` messages compete for the rank's memory and links.
    Plus the local copy of the own block (``n / p`` bytes). No scratch out of place;
    in place, ``n`` bytes (a copy of ``recvbuf``).
    """
    return _SCATTERED(comm, sendbuf, recvbuf, None, counts)
