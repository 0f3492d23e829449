"""The hand-written allgather algorithms by variant name (`ALLGATHER_ALGORITHMS`).

Every entry has the signature ``algorithm(comm, sendbuf, recvbuf) -> recvbuf`` of
`parallel.collectives.ring.allgather_ring` (``sendbuf``: this rank's block of
`block_range` or ``MPI.IN_PLACE``; ``recvbuf``: the full vector) and works on
point-to-point messages for any rank count and length (conventions in
`parallel.collectives.base`; each algorithm's cost next to its code):

- ``ring``: `parallel.collectives.ring` (bandwidth-optimal, ``p - 1`` messages),
- ``recursive_doubling``: `parallel.collectives.allgather.recursive_doubling`
  (``log2 p'`` messages; non-powers of two fold pairs first),
- ``bruck``: `parallel.collectives.allgather.bruck` (``ceil(log2 p)`` messages on any
  rank count, and a rotation through scratch),
- ``auto``: `parallel.collectives.allgather.auto` (one of the above by size and rank count).

Each also takes ``counts`` (a tuple of ``p`` block lengths, the blocks one after another:
``MPI_Allgatherv``'s layout) in place of `block_range`'s blocks; tensor parallelism's row
blocks of a matrix are such blocks.

`ALLGATHER_SCHEDULES` holds their schedule builders (``(rank, p, n, itemsize, in_place)
-> Schedule``) under the same names, for the cost models.
"""
from parallel.collectives.allgather.auto import allgather_auto, auto_schedule
from parallel.collectives.allgather.bruck import allgather_bruck, bruck_schedule
from parallel.collectives.allgather.recursive_doubling import allgather_recursive_doubling, recursive_doubling_schedule
from parallel.collectives.ring import allgather_ring, allgather_schedule

ALLGATHER_ALGORITHMS = {
    "ring": allgather_ring,
    "recursive_doubling": allgather_recursive_doubling,
    "bruck": allgather_bruck,
    "auto": allgather_auto,
}

ALLGATHER_SCHEDULES = {
    "ring": allgather_schedule,
    "recursive_doubling": recursive_doubling_schedule,
    "bruck": bruck_schedule,
    "auto": auto_schedule,
}

__all__ = ["ALLGATHER_ALGORITHMS", "ALLGATHER_SCHEDULES"]
