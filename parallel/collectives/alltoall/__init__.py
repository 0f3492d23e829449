"""The hand-written alltoall algorithms by variant name (`ALLTOALL_ALGORITHMS`).

Every entry has the signature ``algorithm(comm, sendbuf, recvbuf) -> recvbuf``:
``sendbuf`` (``n`` items) holds ``p`` blocks laid out by `block_range`, block ``j``
for rank ``j``; ``recvbuf`` (``p c`` items, ``c`` this rank's block length) gets
every rank's block for this rank in rank order; in place for ``n`` a multiple of
``p`` (`parallel.collectives.alltoall.blocks`). Uneven blocks make it an alltoallv,
as MoE's token routing needs. Point-to-point messages, any rank count; each
algorithm's cost next to its code:

- ``pairwise``: `parallel.collectives.alltoall.pairwise` (``p - 1`` exchanges; long blocks),
- ``bruck``: `parallel.collectives.alltoall.bruck` (``ceil(log2 p)`` packed messages; short blocks),
- ``scattered``: `parallel.collectives.alltoall.scattered` (every message in flight at once; medium blocks),
- ``auto``: `parallel.collectives.alltoall.auto` (one of the above by block size and rank count).

`ALLTOALLV_ALGORITHMS`: those that also take ``counts = (sendcounts, recvcounts)``, blocks
that differ from pair to pair (``MPI_Alltoallv``): pairwise, scattered and auto (then
scattered). Bruck's packing needs every pair's count on every rank, which an alltoallv
rank does not have.

Steps are laid out once per shape and run from cached plans
(`parallel.collectives.plans`; `parallel.collectives.release_plans` frees them).
`ALLTOALL_SCHEDULES` holds their schedule builders (``(rank, p, n, itemsize, in_place)
-> Schedule``) under the same names, for the cost models.
"""
from parallel.collectives.alltoall.auto import alltoall_auto, auto_schedule
from parallel.collectives.alltoall.bruck import alltoall_bruck, bruck_schedule
from parallel.collectives.alltoall.pairwise import alltoall_pairwise, pairwise_schedule
from parallel.collectives.alltoall.scattered import alltoall_scattered, scattered_schedule

ALLTOALL_ALGORITHMS = {
    "pairwise": alltoall_pairwise,
    "bruck": alltoall_bruck,
    "scattered": alltoall_scattered,
    "auto": alltoall_auto,
}

ALLTOALL_SCHEDULES = {
    "pairwise": pairwise_schedule,
    "bruck": bruck_schedule,
    "scattered": scattered_schedule,
    "auto": auto_schedule,
}

ALLTOALLV_ALGORITHMS = {name: ALLTOALL_ALGORITHMS[name] for name in ("pairwise", "scattered", "auto")}

__all__ = ["ALLTOALL_ALGORITHMS", "ALLTOALLV_ALGORITHMS", "ALLTOALL_SCHEDULES"]
