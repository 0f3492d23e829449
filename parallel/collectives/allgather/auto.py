"""Allgather choosing its algorithm by vector size and rank count, as MPICH does.

`choose` takes, for a full vector of ``nbytes`` bytes on ``p`` ranks: recursive doubling
on a power of two below `LONG_BYTES`; Bruck's algorithm on other rank counts below
`SHORT_BYTES` where it needs fewer steps than the ring (``ceil(log2 p) < p - 1``: from
5 ranks); else the ring. MPICH (``MPIR_Allgather_intra_auto``, tuning file
``maint/tuning/coll/mpir/generic.json``) takes the same three with
``MPIR_CVAR_ALLGATHER_LONG_MSG_SIZE`` 512 KiB and ``MPIR_CVAR_ALLGATHER_SHORT_MSG_SIZE``
80 KiB, and Bruck on 3 ranks too. Conventions as in `parallel.collectives.base`.

How the thresholds were chosen
    Measured on this 2-core machine (MPICH 5.0.2, shared memory, float64, the same
    buffers every call: persistent plans), under load from other jobs (load average
    4-7 on 2 cores), so only large and repeated gaps count. Command:
    ``mpiexec -n P python measure.py allgather SAMPLES SIZES...``, a loop that per
    sample runs every algorithm in rotating order, each after a barrier for as many
    calls as take about 3 ms, and keeps the slowest rank's seconds per call; minimum
    over 40-100 samples, in microseconds (ring / recursive doubling / Bruck):

    - 4 ranks, recursive doubling against the ring: 256 KiB 84.9 / 67.1, 512 KiB
      137.9 / 109.9, 1 MiB 265 / 242, 2 MiB 495 / 469, 4 MiB 789 / 768, 8 MiB 1403 /
      1356 (medians alike): one hand-shake per message, so the fewer messages win at
      every size, by 3-5 % (within the noise) from 4 MiB. On 8 ranks (4 per core)
      1.5-1.9x from 4 KiB to 2 MiB. The far partners that make MPICH stop at 512 KiB
      cost nothing in shared memory; `LONG_BYTES` is 4 MiB, where the gain ends.
    - 3 ranks: 64 B 8.5 / 6.1 / 11.1, 1 KiB 9.1 / 6.1 / 11.1, 4 KiB 9.7 / 8.6 / 12.3,
      16 KiB 12.7 / 13.0 / 16.0, 64 KiB 30.6 / 23.4 / 38.4, 256 KiB 54 / 75 / 80: Bruck,
      with the ring's 2 messages and a copy of the vector more, never won, so 3 ranks
      take the ring.
    - Bruck against the ring on 5, 6, 7 ranks (2.5-3.5 per core): 5 ranks tied to
      16 KiB (4 KiB 41.2 / 40.8, 16 KiB 48.0 / 46.5) and lost at 32 KiB (62.9 / 47.8);
      6 ranks won to 16 KiB (4 KiB 48.8 / 61.2, 16 KiB 68.4 / 80.4) and lost at 24-32
      KiB; 7 ranks won to 48 KiB (16 KiB 66.2 / 92.5, 48 KiB 110.0 / 113.5). The
      crossover moves between 16 KiB and past 48 KiB from run to run: this machine
      cannot place it, so `SHORT_BYTES` keeps MPICH's 80 KiB.

    - Checked again after the early copies (the out-of-place ring sends its own block while
      copying it; one sweep, ``mlscale sweep allgather --np 4 --ranks 3,4 --sizes 64:8M``,
      medians in us, ring / recursive doubling / Bruck): 4 ranks 1 MiB 292 / 282 / 422, 4 MiB
      1012 / 963 / 1464, 8 MiB 1950 / 1656 / 3059 (recursive doubling still ahead by 3-15 %,
      as noisy as before); 3 ranks 4 KiB 14.1 / 17.1 / 17.8, 1 MiB 229 / 281 / 398: the
      thresholds stand.

    Recursive doubling with its fold was often fastest on the other rank counts too,
    but there its folded ranks idle on oversubscribed cores; MPICH does not use it
    there, nor does `choose`.
"""
from functools import partial

from parallel.collectives.allgather.bruck import bruck_schedule
from parallel.collectives.allgather.recursive_doubling import recursive_doubling_schedule
from parallel.collectives.plans import Collective
from parallel.collectives.ring import allgather_length, allgather_schedule
from parallel.collectives.schedule import chosen_schedule

#: Recursive doubling on a power-of-two rank count for vectors below this many bytes.
LONG_BYTES = 4 << 20
#: Bruck's algorithm on other rank counts (from 5) for vectors below this many bytes.
SHORT_BYTES = 80 << 10

SCHEDULES = {"recursive_doubling": recursive_doubling_schedule, "bruck": bruck_schedule, "ring": allgather_schedule}


def choose(p, nbytes):
    """The name of the algorithm `allgather_auto` runs for a full vector of ``nbytes`` bytes on ``p`` ranks."""
    if p & (p - 1) == 0:
        return "recursive_doubling" if nbytes < LONG_BYTES else "ring"
    fewer_steps = (p - 1).bit_length() < p - 1
    return "bruck" if fewer_steps and nbytes < SHORT_BYTES else "ring"


#: Steps of `allgather_auto` on ``rank`` (``(rank, p, n, itemsize, in_place) -> Schedule``):
#: those of the algorithm `choose` picks for the vector's bytes and the rank count.
auto_schedule = partial(chosen_schedule, choose, SCHEDULES)

_AUTO = Collective("allgather_auto", auto_schedule, allgather_length, reduces=False)


def allgather_auto(comm, sendbuf, recvbuf, counts=None):
    """Allgather by the algorithm `choose` picks for this size and rank count.

    Parameters (``counts`` too) and return value as `parallel.collectives.ring.allgather_ring`.

    Notes
    -----
    The cost and scratch of the chosen algorithm (`allgather_recursive_doubling`,
    `allgather_bruck` or `allgather_ring`). Every rank chooses the same, since all pass
    the same length and dtype.
    """
    return _AUTO(comm, sendbuf, recvbuf, None, counts)
