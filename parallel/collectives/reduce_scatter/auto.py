"""Reduce-scatter choosing its algorithm by vector size and rank count, as MPICH does.

MPICH (``maint/tuning/coll/mpir/generic.json``, commutative ops) takes recursive halving
below ``MPIR_CVAR_REDUCE_SCATTER_COMMUTATIVE_LONG_MSG_SIZE`` (512 KiB of the whole vector)
and pairwise exchange above. Here `choose` takes
`parallel.collectives.reduce_scatter.recursive_halving` (pairwise exchange on rank counts
that are not powers of two) up to `LONG_BYTES` and on two ranks always, and the ring
(`parallel.collectives.ring.reduce_scatter_ring`, bandwidth-optimal in ``p - 1`` messages
between neighbours, as pairwise exchange is) above. Conventions as in
`parallel.collectives.base`.

How the thresholds were measured
    On this 2-core machine (MPICH 5.0.2, shared memory; 3 and 4 ranks oversubscribe it, and
    other jobs kept the load average at 2.5-4.5, so single figures vary by 10-30 %), float64
    out of place, the same buffers every call (persistent plans), run as
    ``mpiexec -n P python loop.py`` for P = 2, 3, 4 with this loop (8 B to 32 MiB in powers of
    two; 15-21 samples, each at least ~1 ms of repeated calls; three runs at 256 KiB and up)::

        for sample in range(samples):  # both algorithms alternated, the order reversed every other sample
            for f in (reduce_scatter_ring, reduce_scatter_recursive_halving)[::(-1) ** sample]:
                comm.Barrier(); start = perf_counter()
                for _ in range(repeats): f(comm, send, recv)
                seconds[f].append(comm.allreduce((perf_counter() - start) / repeats, op=MPI.MAX))
        # compared: min(seconds[recursive halving]) / min(seconds[ring]) per size

    Recursive halving / ring: on 2 ranks (the same single message) 0.9-1.2 below 16 KiB,
    0.8-0.97 up to 256 KiB and 0.6-0.85 above (the half lands in ``recvbuf`` directly; the
    ring's goes through scratch); on 4 ranks 0.6-0.93 up to 1 MiB (one run 1.03), 0.8-0.98 at
    2-16 MiB (one run 1.01), 0.87-1.10 at 32 MiB; on 3 ranks (pairwise exchange against the
    ring: the same ``p - 1`` messages) 0.7-1.0 from 512 B to 4 MiB (0.6-2.5 below: noise),
    0.93-1.13 at 8-16 MiB, 0.99-1.24 at 32 MiB. So recursive halving runs while the vector has
    at most `LONG_BYTES` = 16 MiB (where the runs tie), well above MPICH's 512 KiB, below which
    it won or tied every run; 2 ranks never take the ring. 5-8 ranks cannot be measured on two
    cores and take the same threshold.
"""
from functools import partial

from parallel.collectives.plans import Collective
from parallel.collectives.reduce_scatter.recursive_halving import recursive_halving_schedule
from parallel.collectives.ring import reduce_scatter_length, reduce_scatter_schedule
from parallel.collectives.schedule import chosen_schedule

#: Recursive halving (or pairwise exchange) while the whole vector has at most this many bytes.
LONG_BYTES = 1 << 24

SCHEDULES = {"recursive_halving": recursive_halving_schedule, "ring": reduce_scatter_schedule}


def choose(p, nbytes):
    """The name of the algorithm `reduce_scatter_auto` runs for a vector of ``nbytes`` bytes on ``p`` ranks."""
    return "recursive_halving" if p <= 2 or nbytes <= LONG_BYTES else "ring"


#: Steps of `reduce_scatter_auto` on ``rank`` (``(rank, p, n, itemsize, in_place) -> Schedule``):
#: those of the algorithm `choose` picks for the vector's bytes and the rank count.
auto_schedule = partial(chosen_schedule, choose, SCHEDULES)

_AUTO = Collective("reduce_scatter_auto", auto_schedule, reduce_scatter_length)


def reduce_scatter_auto(comm, sendbuf, recvbuf, op="sum", counts=None):
    """Reduce-scatter by the algorithm `choose` picks for this size and rank count.

    Parameters (``counts`` too) and return value as `parallel.collectives.ring.reduce_scatter_ring`.

    Notes
    -----
    The cost of the chosen algorithm: recursive halving (``log2 p alpha + (p-1)/p n beta +
    (p-1)/p n gamma``; pairwise exchange, ``(p-1) alpha + ...``, on other rank counts) while ``n``
    is at most `LONG_BYTES` or on two ranks, else the ring (``(p-1) alpha + (p-1)/p n beta +
    (p-1)/p n gamma``). Every rank chooses the same, since all pass the same length and dtype.
    """
    return _AUTO(comm, sendbuf, recvbuf, op, counts)
