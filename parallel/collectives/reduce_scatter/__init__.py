"""The hand-written reduce-scatter algorithms by variant name (`REDUCE_SCATTER_ALGORITHMS`).

Every entry has the signature ``algorithm(comm, sendbuf, recvbuf, op="sum") -> recvbuf`` of
`parallel.collectives.ring.reduce_scatter_ring` (``sendbuf``: the full vector of ``n`` items
or ``MPI.IN_PLACE``; ``recvbuf``: this rank's block of `block_range` out of place, the full
vector in place, its own block then holding the result) and works on point-to-point
messages for any rank count and length (conventions in `parallel.collectives.base`; each
algorithm's cost next to its code):

- ``ring``: `parallel.collectives.ring` (bandwidth-optimal, ``p - 1`` messages between
  neighbours),
- ``recursive_halving``: `parallel.collectives.reduce_scatter.recursive_halving`
  (``log2 p`` messages on powers of two; pairwise exchange,
  `parallel.collectives.reduce_scatter.pairwise`, on other rank counts),
- ``auto``: `parallel.collectives.reduce_scatter.auto` (one of the above by size and rank count).

Each also takes ``counts`` (a tuple of ``p`` block lengths, the blocks one after another:
``MPI_Reduce_scatter``'s ``recvcounts``) in place of `block_range`'s blocks.

`REDUCE_SCATTER_SCHEDULES` holds their schedule builders (``(rank, p, n, itemsize, in_place)
-> Schedule``) under the same names, for the cost models.
"""
from parallel.collectives.reduce_scatter.auto import auto_schedule, reduce_scatter_auto
from parallel.collectives.reduce_scatter.recursive_halving import (recursive_halving_schedule,
                                                                   reduce_scatter_recursive_halving)
from parallel.collectives.ring import reduce_scatter_ring, reduce_scatter_schedule

REDUCE_SCATTER_ALGORITHMS = {
    "ring": reduce_scatter_ring,
    "recursive_halving": reduce_scatter_recursive_halving,
    "auto": reduce_scatter_auto,
}

REDUCE_SCATTER_SCHEDULES = {
    "ring": reduce_scatter_schedule,
    "recursive_halving": recursive_halving_schedule,
    "auto": auto_schedule,
}

__all__ = ["REDUCE_SCATTER_ALGORITHMS", "REDUCE_SCATTER_SCHEDULES"]
