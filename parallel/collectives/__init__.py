"""The hand-written allreduce algorithms by variant name (`ALLREDUCE_ALGORITHMS`).

Every entry has the signature ``algorithm(comm, sendbuf, recvbuf, op="sum") -> recvbuf``
and works on point-to-point messages for any rank count and length (conventions in
`parallel.collectives.base`; each algorithm's cost next to its code):

- ``ring``: `parallel.collectives.ring` (bandwidth-optimal; also home of the ring
  reduce-scatter and allgather),
- ``recursive_doubling`` (latency-optimal) and ``rabenseifner`` (bandwidth-optimal
  in ``2 log2 p'`` messages): `parallel.collectives.power_of_two` (both fold
  non-powers of two),
- ``tree``: `parallel.collectives.tree` (binomial reduce and broadcast),
- ``hierarchical``: `parallel.collectives.hierarchical` (two levels: inside each node,
  then between the nodes),
- ``auto``: `parallel.collectives.auto` (one of the above by size and rank count).

`ALLREDUCE_SCHEDULES` gives the steps of each but ``hierarchical`` (which composes sub-communicators), for the
cost models. The other collectives' hand-written algorithms are in their own packages, each with its
``*_ALGORITHMS`` (and ``*_SCHEDULES`` for the cost models): `parallel.collectives.allgather`,
`parallel.collectives.reduce_scatter`, `parallel.collectives.alltoall`,
`parallel.collectives.bcast`, `parallel.collectives.reduce`.

Each algorithm lays out its steps once per shape and reuses them
(`parallel.collectives.plans`: persistent requests when the same buffers come back;
`release_plans` frees them).
"""
from parallel.collectives.auto import allreduce_auto, auto_schedule
from parallel.collectives.hierarchical import allreduce_hierarchical
from parallel.collectives.plans import release_plans
from parallel.collectives.power_of_two import (allreduce_rabenseifner, allreduce_recursive_doubling,
                                               rabenseifner_schedule, recursive_doubling_schedule)
from parallel.collectives.ring import allreduce_ring, ring_schedule
from parallel.collectives.tree import allreduce_tree, tree_schedule

ALLREDUCE_ALGORITHMS = {
    "ring": allreduce_ring,
    "recursive_doubling": allreduce_recursive_doubling,
    "rabenseifner": allreduce_rabenseifner,
    "tree": allreduce_tree,
    "hierarchical": allreduce_hierarchical,
    "auto": allreduce_auto,
}

#: ``(rank, p, n, itemsize, in_place) -> Schedule`` of the algorithms above but ``hierarchical``.
ALLREDUCE_SCHEDULES = {
    "ring": ring_schedule,
    "recursive_doubling": recursive_doubling_schedule,
    "rabenseifner": rabenseifner_schedule,
    "tree": tree_schedule,
    "auto": auto_schedule,
}

__all__ = ["ALLREDUCE_ALGORITHMS", "ALLREDUCE_SCHEDULES", "release_plans"]
