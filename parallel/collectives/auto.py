"""Allreduce choosing its algorithm by message size and rank count, as MPICH does.

`choose` picks recursive doubling for small vectors (one message per round: the
fewest latencies) and a bandwidth-optimal algorithm for large ones: Rabenseifner on
a power-of-two rank count, the ring otherwise (the fold Rabenseifner needs then
sends the whole vector twice more on the critical path). The thresholds and how
they were chosen are next to their values. Conventions as in
`parallel.collectives.base`.
"""
from parallel.collectives.base import allreduce_length
from parallel.collectives.plans import Collective
from parallel.collectives.power_of_two import rabenseifner_schedule, recursive_doubling_schedule
from parallel.collectives.ring import ring_schedule

#: Up to this many bytes, recursive doubling.
SMALL_BYTES = 2048
#: Above `SMALL_BYTES` on a rank count that is not a power of two: Rabenseifner below, ring from here.
RING_BYTES = 1 << 16

SCHEDULES = {"recursive_doubling": recursive_doubling_schedule, "rabenseifner": rabenseifner_schedule,
             "ring": ring_schedule}


def choose(p, nbytes):
    """The name of the algorithm `allreduce_auto` runs for a vector of ``nbytes`` bytes on ``p`` ranks."""
    pow2 = 1 << (p.bit_length() - 1)
    if nbytes <= SMALL_BYTES:
        return "recursive_doubling"
    return "rabenseifner" if p == pow2 or nbytes < RING_BYTES else "ring"


def auto_schedule(rank, p, n, itemsize, in_place=False):
    """Steps of `allreduce_auto` on ``rank`` for ``n`` items of ``itemsize`` bytes (a `Schedule`)."""
    return SCHEDULES[choose(p, n * itemsize)](rank, p, n, itemsize, in_place)


_AUTO = Collective("allreduce_auto", auto_schedule, allreduce_length)


def allreduce_auto(comm, sendbuf, recvbuf, op="sum"):
    """Allreduce by the algorithm `choose` picks for this size and rank count.

    Parameters and return value as `parallel.collectives.ring.allreduce_ring`.

    Notes
    -----
    The cost of the chosen algorithm (recursive doubling up to `SMALL_BYTES`;
    above, Rabenseifner on a power-of-two rank count, on other counts Rabenseifner
    below `RING_BYTES` and the ring from there). Every rank chooses the same, since
    all pass the same length and dtype.
    """
    return _AUTO(comm, sendbuf, recvbuf, op)
