"""Allreduce choosing its algorithm by message size and rank count, as MPICH does.

`choose` picks recursive doubling for small vectors (one message per round: the
fewest latencies) and a bandwidth-optimal algorithm for large ones: Rabenseifner on
a power-of-two rank count, the ring otherwise. Conventions as in
`parallel.collectives.base`.

How the thresholds were chosen
    MPICH switches from recursive doubling to Rabenseifner above 2 KiB
    (``MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE``). Measured here on 2 ranks (MPICH 5.0.2,
    shared memory, same buffers every call; `mlscale sweep allreduce --np 2 --ranks 2
    --sizes 8:16M` and an interleaved min-over-samples loop, under load), recursive
    doubling beat Rabenseifner and the ring by 1.2-1.8x from 16 KiB to 256 KiB, tied
    at 8 KiB and 512 KiB, and lost from 1 MiB up (0.75-0.9x of their speed): each
    extra message costs a hand-shake that the halved volume repays only for vectors
    near a megabyte. So recursive doubling runs while the bytes it sends,
    ``log2 p' n``, stay within `SMALL_BYTES` = 512 KiB (on more ranks it sends more
    than the ``2 n`` of the others, so it stops earlier). Above, a rank count that
    is not a power of two takes the ring: Rabenseifner's fold and unfold send the
    whole vector twice more on the critical path, while the ring's extra messages
    (``2 (p-1)`` against ``2 log2 p' + 2``; equal on 3 ranks) matter little at that
    size.
"""
from functools import partial

from parallel.collectives.base import allreduce_length
from parallel.collectives.plans import Collective
from parallel.collectives.power_of_two import rabenseifner_schedule, recursive_doubling_schedule
from parallel.collectives.ring import ring_schedule
from parallel.collectives.schedule import chosen_schedule

#: Recursive doubling while it sends at most this many bytes per rank (``log2 p' n``).
SMALL_BYTES = 1 << 19

SCHEDULES = {"recursive_doubling": recursive_doubling_schedule, "rabenseifner": rabenseifner_schedule,
             "ring": ring_schedule}


def choose(p, nbytes):
    """The name of the algorithm `allreduce_auto` runs for a vector of ``nbytes`` bytes on ``p`` ranks."""
    pow2 = 1 << (p.bit_length() - 1)
    if nbytes * max(pow2.bit_length() - 1, 1) <= SMALL_BYTES:
        return "recursive_doubling"
    return "rabenseifner" if p == pow2 else "ring"


#: Steps of `allreduce_auto` on ``rank`` (``(rank, p, n, itemsize, in_place) -> Schedule``):
#: those of the algorithm `choose` picks for the vector's bytes and the rank count.
auto_schedule = partial(chosen_schedule, choose, SCHEDULES)

_AUTO = Collective("allreduce_auto", auto_schedule, allreduce_length)


def allreduce_auto(comm, sendbuf, recvbuf, op="sum"):
    """Allreduce by the algorithm `choose` picks for this size and rank count.

    Parameters and return value as `parallel.collectives.ring.allreduce_ring`.

    Notes
    -----
    The cost of the chosen algorithm: recursive doubling while ``log2 p' n`` is at
    most `SMALL_BYTES`, else Rabenseifner on a power-of-two rank count and the ring
    on others. Every rank chooses the same, since all pass the same length and dtype.
    """
    return _AUTO(comm, sendbuf, recvbuf, op)
