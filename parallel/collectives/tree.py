"""Allreduce by a binomial-tree reduce to rank 0 and a binomial-tree broadcast.

Any rank count; laid out once per shape (`parallel.collectives.schedule`) and run
from cached plans (`parallel.collectives.plans`); conventions and cost notation as
in `parallel.collectives.base`.
"""
from parallel.collectives.base import allreduce_length
from parallel.collectives.plans import Collective
from parallel.collectives.schedule import Schedule


def tree_schedule(rank, p, n, itemsize=None, in_place=False):
    """Steps of `allreduce_tree` on ``rank`` for ``n`` items (a `Schedule`)."""
    whole = slice(0, n)
    out = ("out", whole)
    schedule = Schedule()
    if n and not in_place:
        schedule.copy(("in", whole), out)
    if n == 0 or p == 1:
        return schedule
    distance = 1
    while distance < p and not rank & distance:
        if rank + distance < p:
            schedule.step(recvs=[(("tmp", whole), rank + distance)], ops=[("reduce", out, ("tmp", whole), out)])
        distance <<= 1
    if distance < p:
        schedule.step(sends=[(out, rank - distance)])
        schedule.step(recvs=[(out, rank - distance)])
    # ``distance`` is now this rank's lowest set bit (p rounded up to a power of two on rank 0).
    children = []
    distance >>= 1
    while distance:
        if rank + distance < p:
            children.append((out, rank + distance))
        distance >>= 1
    if children:
        schedule.step(sends=children)
    return schedule


_TREE = Collective("allreduce_tree", tree_schedule, allreduce_length)


def allreduce_tree(comm, sendbuf, recvbuf, op="sum"):
    """Allreduce by a binomial-tree reduce to rank 0 and a binomial-tree broadcast.

    Parameters and return value as `parallel.collectives.ring.allreduce_ring`.

    Notes
    -----
    Critical path ``2 ceil(log2 p) (alpha + n beta) + ceil(log2 p) n gamma``; each
    rank sends one message in the reduce and up to ``ceil(log2 p)`` (rank 0) in the
    broadcast, posted together. Simple, but neither latency- nor bandwidth-optimal.
    Scratch: ``n`` bytes.
    """
    return _TREE(comm, sendbuf, recvbuf, op)
