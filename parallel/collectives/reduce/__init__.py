"""The hand-written reductions to a root by variant name (`REDUCE_ALGORITHMS`).

Every entry has the signature ``algorithm(comm, sendbuf, recvbuf, op="sum", root=0) -> recvbuf``
(``sendbuf``: this rank's vector of ``n`` items or ``MPI.IN_PLACE``, the input then in
``recvbuf``; ``recvbuf``: ``n`` items on every rank, the reduction over all ranks on
``root``, workspace with unspecified contents afterwards on the others) and works on
point-to-point messages for any rank count, root and length (conventions in
`parallel.collectives.base`; schedules for root 0 run for any root by
`parallel.collectives.rooted`; each algorithm's cost next to its code):

- ``binomial``: `parallel.collectives.reduce.binomial` (``ceil(log2 p)`` levels of the
  whole vector; best for short vectors),
- ``rabenseifner``: `parallel.collectives.reduce.rabenseifner` (recursive-halving
  reduce-scatter, then a binomial gather of the blocks; bandwidth-optimal, for long vectors),
- ``auto``: `parallel.collectives.reduce.auto` (one of the above by size and rank count).

`REDUCE_SCHEDULES` holds their schedule builders (``(virtual_rank, p, n, itemsize, in_place)
-> Schedule``, root 0) under the same names, for the cost models.
"""
from parallel.collectives.reduce.auto import auto_schedule, reduce_auto
from parallel.collectives.reduce.binomial import binomial_schedule, reduce_binomial
from parallel.collectives.reduce.rabenseifner import rabenseifner_reduce_schedule, reduce_rabenseifner

REDUCE_ALGORITHMS = {
    "binomial": reduce_binomial,
    "rabenseifner": reduce_rabenseifner,
    "auto": reduce_auto,
}

REDUCE_SCHEDULES = {
    "binomial": binomial_schedule,
    "rabenseifner": rabenseifner_reduce_schedule,
    "auto": auto_schedule,
}

__all__ = ["REDUCE_ALGORITHMS", "REDUCE_SCHEDULES"]
