"""Reduce to a root choosing its algorithm by vector size and rank count, as MPICH does.

MPICH (``maint/tuning/coll/mpir/generic.json``; ``MPIR_CVAR_REDUCE_SHORT_MSG_SIZE``) takes the
binomial tree for vectors up to 2 KiB (or fewer items than ``p'``) and the reduce-scatter and
gather (Rabenseifner) above. Here `choose` takes `parallel.collectives.reduce.binomial` up to
`SHORT_BYTES`, on 3 ranks up to `THREE_RANKS_BYTES`, and
`parallel.collectives.reduce.rabenseifner` above (a vector of fewer items than ``p'`` is far
below `SHORT_BYTES` on any real rank count, so MPICH's count rule holds by itself).
Conventions as in `parallel.collectives.base`.

How the thresholds were measured
    On this 2-core machine (MPICH 5.0.2, shared memory; 3 and 4 ranks oversubscribe it, and
    other jobs kept the load average at 2.5-4.5, so single figures vary by 10-30 %), float64
    out of place to root 0, the same buffers every call (persistent plans), run as
    ``mpiexec -n P python loop.py`` for P = 2, 3, 4 with the interleaved loop of
    `parallel.collectives.reduce_scatter.auto` over ``reduce_binomial`` and
    ``reduce_rabenseifner`` (8 B to 16 MiB in powers of two; 9-25 samples, each at least ~1 ms
    of repeated calls; the minimum over samples of the slowest rank; four runs at 64 KiB and up).
    Rabenseifner / binomial: 1.5-3.5 below 64 KiB on every rank count (two messages per level and
    the Python path of each); on 2 ranks 1.2-1.3 at 512 KiB, 0.75-0.9 from 1 MiB up; on 4 ranks
    1.0-1.4 at 256 KiB, 0.8-0.9 at 512 KiB (one run 1.4), 0.55-0.8 from 1 MiB up (one run 1.1);
    on 3 ranks, where the fold sends a whole vector more and the binomial tree is only two
    levels deep, 1.0-1.7 up to 4 MiB, 0.96-1.06 at 8 MiB, 0.84-0.91 at 16 MiB. So the binomial
    tree runs up to `SHORT_BYTES` = 512 KiB (MPICH's 2 KiB is far below what one more message
    costs here) and on 3 ranks up to `THREE_RANKS_BYTES` = 8 MiB; 5-8 ranks cannot be measured
    on two cores and take `SHORT_BYTES`, as MPICH has one threshold for every rank count (their
    binomial tree is three levels deep, so the fold costs relatively less than on 3 ranks).
"""
from functools import partial

from parallel.collectives.base import allreduce_length
from parallel.collectives.reduce.binomial import binomial_schedule
from parallel.collectives.reduce.rabenseifner import rabenseifner_reduce_schedule
from parallel.collectives.rooted import RootedCollective
from parallel.collectives.schedule import chosen_schedule

#: The binomial tree for vectors of at most this many bytes.
SHORT_BYTES = 1 << 19
#: The binomial tree on 3 ranks for vectors of at most this many bytes.
THREE_RANKS_BYTES = 1 << 23

SCHEDULES = {"binomial": binomial_schedule, "rabenseifner": rabenseifner_reduce_schedule}


def choose(p, nbytes):
    """The name of the algorithm `reduce_auto` runs for a vector of ``nbytes`` bytes on ``p`` ranks."""
    return "binomial" if nbytes <= (THREE_RANKS_BYTES if p == 3 else SHORT_BYTES) else "rabenseifner"


#: Steps of `reduce_auto` on virtual rank ``rank`` (root 0) (``(rank, p, n, itemsize, in_place) -> Schedule``):
#: those of the algorithm `choose` picks for the vector's bytes and the rank count.
auto_schedule = partial(chosen_schedule, choose, SCHEDULES)

_AUTO = RootedCollective("reduce_auto", auto_schedule, allreduce_length)


def reduce_auto(comm, sendbuf, recvbuf, op="sum", root=0):
    """Reduce to ``root`` by the algorithm `choose` picks for this size and rank count.

    Parameters and return value as `parallel.collectives.reduce.binomial.reduce_binomial`
    (``recvbuf`` is workspace on the ranks other than ``root``).

    Notes
    -----
    The cost of the chosen algorithm: the binomial tree (critical path ``ceil(log2 p) (alpha +
    n beta + n gamma)``) up to `SHORT_BYTES` (`THREE_RANKS_BYTES` on 3 ranks), else
    Rabenseifner (``2 log2 p' alpha + 2 (p'-1)/p' n beta + (p'-1)/p' n gamma``, folding adds
    ``alpha + n beta + n gamma``). Every rank chooses the same, since all pass the same length
    and dtype.
    """
    return _AUTO(comm, sendbuf, recvbuf, op, root)
