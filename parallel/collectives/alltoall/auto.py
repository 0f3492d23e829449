"""Alltoall choosing its algorithm by block size and rank count, as MPICH does.

MPICH (``maint/tuning/coll/mpir/generic.json``; ``MPIR_CVAR_ALLTOALL_SHORT_MSG_SIZE``
256 and ``MPIR_CVAR_ALLTOALL_MEDIUM_MSG_SIZE`` 32768, per-destination bytes) runs
Bruck for blocks of at most 256 bytes on 8 ranks or more, the scattered algorithm
up to 32 KiB, and pairwise exchange above. `choose` does the same on the largest
block (``ceil(n/p)`` items: the same on every rank, so all choose alike).

How the thresholds were chosen
    Measured on this 2-core machine (MPICH 5.0.2, shared memory; other jobs kept the load
    average at 8-9, so single figures vary by 10-20 %), float64 out of place, the same
    buffers every call (persistent plans), with an interleaved loop kept outside the
    repository: per block size (8 B to 4 MiB in powers of two) and sample, a barrier and
    about 2 ms of calls of each algorithm in turn (order rotated every sample), 15-21
    samples, the median (and minimum) of the slowest rank's time per call::

        mpiexec -n P python bench_alltoall.py 21   # P = 2, 3, 4, 8 (8: blocks up to 32 KiB, twice)

    Time / pairwise's, medians. 2 ranks: scattered 0.95-1.08 everywhere (it is the same
    single exchange), Bruck 1.1-1.4 up to 64 KiB and 1.6-2.6 above (its pack and unpack
    copies, for no message saved). 3 ranks: scattered 0.83-1.00 up to 128 KiB, 0.93-1.05
    above; Bruck 0.9-1.3 up to 4 KiB, 1.2-1.9 above. 4 ranks: scattered 0.73-0.81 up to
    64 KiB, 0.87-0.95 up to 4 MiB; Bruck 0.96-1.05 up to 2 KiB, 1.5-2.4 above 32 KiB.
    8 ranks (four per core): scattered 0.57-0.66 up to 2 KiB, 0.61-0.79 to 32 KiB; Bruck
    0.77-0.88 up to 1 KiB (fewer steps than pairwise), 0.8-1.45 above, and 1.27-1.45 times
    scattered's time up to 1 KiB (1.14-1.97 above). ``mlscale sweep alltoall --np 4 --ranks 4 --sizes 256:4M``
    (not interleaved) agrees: scattered at or below pairwise at every size. So here the
    scattered algorithm won at every size and rank count, but only where ranks share
    cores: each of pairwise's and Bruck's ``p - 1`` or ``log2 p`` steps waits for a partner
    that may not be running, while scattered waits once. Where pairwise pays off (one
    message in flight per rank, no contention for links and memory; Bruck: fewer
    latencies on many ranks) needs a core per rank, which 2 cores give only on 2 ranks,
    where the algorithms coincide. The measurement cannot decide either switch, so both
    keep MPICH's values.
"""
from parallel.collectives.alltoall.blocks import alltoall_length
from parallel.collectives.alltoall.bruck import bruck_schedule
from parallel.collectives.alltoall.pairwise import pairwise_schedule
from parallel.collectives.alltoall.scattered import scattered_schedule
from parallel.collectives.plans import Collective

#: Bruck for blocks of at most this many bytes, on `BRUCK_MIN_RANKS` ranks or more.
SHORT_BYTES = 256
#: Bruck only from this many ranks (below, its copies cost more than the latencies it saves).
BRUCK_MIN_RANKS = 8
#: The scattered algorithm for blocks up to this many bytes, pairwise exchange above.
MEDIUM_BYTES = 32768

SCHEDULES = {"bruck": bruck_schedule, "scattered": scattered_schedule, "pairwise": pairwise_schedule}


def choose(p, block_bytes):
    """The name of the algorithm `alltoall_auto` runs for blocks of at most ``block_bytes`` on ``p`` ranks."""
    if block_bytes <= SHORT_BYTES and p >= BRUCK_MIN_RANKS:
        return "bruck"
    return "scattered" if block_bytes <= MEDIUM_BYTES else "pairwise"


def auto_schedule(rank, p, n, itemsize, in_place=False, counts=None):
    """Steps of `alltoall_auto` on ``rank`` for ``n`` items of ``itemsize`` bytes (a `Schedule`); the
    v-variant (``counts``) takes the scattered algorithm, as MPICH's alltoallv does at any size
    (``MPIR_Alltoallv_intra_scattered``; a rank knows its own counts only, so ranks could not
    agree on a choice by size without a message more)."""
    if counts is not None:
        return scattered_schedule(rank, p, n, itemsize, in_place, counts)
    return SCHEDULES[choose(p, -(-n // p) * itemsize)](rank, p, n, itemsize, in_place)


_AUTO = Collective("alltoall_auto", auto_schedule, alltoall_length, reduces=False)


def alltoall_auto(comm, sendbuf, recvbuf, counts=None):
    """Alltoall by the algorithm `choose` picks for this block size and rank count.

    Parameters (``counts`` too: then the scattered algorithm) and return value as
    `parallel.collectives.alltoall.pairwise.alltoall_pairwise`.

    Notes
    -----
    The cost of the chosen algorithm (`parallel.collectives.alltoall.bruck`,
    `parallel.collectives.alltoall.scattered`,
    `parallel.collectives.alltoall.pairwise`).
    """
    return _AUTO(comm, sendbuf, recvbuf, None, counts)
