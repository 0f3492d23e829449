"""The hand-written broadcasts by variant name (`BCAST_ALGORITHMS`).

Every entry has the signature ``algorithm(comm, sendbuf, recvbuf, root=0) -> recvbuf``
(``sendbuf`` read on the root only, ``MPI.IN_PLACE`` there: the data is already in its
``recvbuf``; ``recvbuf`` of ``n`` items on every rank gets the root's vector) and works
on point-to-point messages for any rank count, root and length (conventions in
`parallel.collectives.base`; schedules for root 0 run for any root by
`parallel.collectives.rooted`; each algorithm's cost next to its code):

- ``binomial``: `parallel.collectives.bcast.binomial` (``ceil(log2 p)`` rounds of the
  whole vector; best for short vectors),
- ``scatter_allgather``: `parallel.collectives.bcast.scatter_allgather` (van de
  Geijn: binomial scatter of the blocks, ring allgather; best for long vectors),
- ``chain``: `parallel.collectives.bcast.chain` (pipelined in segments along the ranks),
- ``auto``: `parallel.collectives.bcast.auto` (binomial or scatter-allgather by size and
  rank count).

`BCAST_SCHEDULES` holds their schedule builders (``(virtual_rank, p, n, itemsize, in_place)
-> Schedule``, root 0; the chain with its default segment) under the same names, for the
cost models.
"""
from parallel.collectives.bcast.auto import auto_schedule, bcast_auto
from parallel.collectives.bcast.binomial import bcast_binomial, binomial_schedule
from parallel.collectives.bcast.chain import bcast_chain, chain_schedule
from parallel.collectives.bcast.scatter_allgather import bcast_scatter_allgather, scatter_allgather_schedule

BCAST_ALGORITHMS = {
    "binomial": bcast_binomial,
    "scatter_allgather": bcast_scatter_allgather,
    "chain": bcast_chain,
    "auto": bcast_auto,
}

BCAST_SCHEDULES = {
    "binomial": binomial_schedule,
    "scatter_allgather": scatter_allgather_schedule,
    "chain": chain_schedule,
    "auto": auto_schedule,
}

__all__ = ["BCAST_ALGORITHMS", "BCAST_SCHEDULES"]
