"""Broadcast choosing its algorithm by vector size and rank count, as MPICH does.

`choose` takes the binomial tree for vectors below `SHORT_BYTES` or on fewer than
`MIN_RANKS` ranks, else the scatter and ring allgather: MPICH's choice
(``MPIR_Bcast_intra_auto``, tuning file ``maint/tuning/coll/mpir/generic.json``:
``MPIR_CVAR_BCAST_SHORT_MSG_SIZE`` 12288, ``MPIR_CVAR_BCAST_MIN_PROCS`` 8; its scatter
and recursive-doubling allgather for medium vectors on powers of two is not written
here, so those take the ring too). The pipelined chain is never chosen, as in MPICH.
Conventions as in `parallel.collectives.base`.

How the thresholds were chosen
    Measured on this 2-core machine (MPICH 5.0.2, shared memory, float64, root 0, the
    same buffers every call: persistent plans), under load from other jobs (load
    average 4-7 on 2 cores). Command: ``mpiexec -n P python measure.py bcast SAMPLES
    SIZES... --segments=...``, a loop that per sample runs every algorithm in rotating
    order, each after a barrier for as many calls as take about 3 ms, and keeps the
    slowest rank's seconds per call; minimum over 20-40 samples, in microseconds
    (binomial / scatter-allgather / chain of 1 MiB segments):

    - 2 ranks: 32 KiB 5.3 / 11.9, 512 KiB 30.2 / 63.3, 2 MiB 287 / 343;
    - 3 ranks: 12 KiB 9.2 / 14.2, 512 KiB 63.2 / 125.3, 4 MiB 982 / 1402 / 1365,
      16 MiB 2499 / 3460 / 3745;
    - 4 ranks: 12 KiB 20.2 / 27.0, 512 KiB 125 / 178, 4 MiB 906 / 1207 / 1240,
      16 MiB 4763 / 5035 / 5104;
    - 8 ranks (4 per core): 12 KiB 56.5 / 174.4, 512 KiB 304 / 623 / 359, 2 MiB 963 /
      1797 / 2128.

    The binomial tree was fastest at every size from 1 KiB to 16 MiB on 2, 3, 4 and 8
    ranks: below 8 ranks as MPICH has it; on 8 ranks four share a core, so the
    scatter-allgather's ``log2 p + p - 1`` steps pay a scheduling delay each, and the
    crossover MPICH puts at 12 KiB on 8 or more ranks cannot be measured here:
    `SHORT_BYTES` and `MIN_RANKS` keep MPICH's values. The chain never beat the
    tree beyond the noise (its segment size: `parallel.collectives.bcast.chain`).
"""
from functools import partial

from parallel.collectives.base import allreduce_length
from parallel.collectives.bcast.base import root_or_in_place
from parallel.collectives.bcast.binomial import binomial_schedule
from parallel.collectives.bcast.scatter_allgather import scatter_allgather_schedule
from parallel.collectives.rooted import RootedCollective
from parallel.collectives.schedule import chosen_schedule

#: The binomial tree for vectors below this many bytes.
SHORT_BYTES = 12288
#: The binomial tree on fewer ranks than this.
MIN_RANKS = 8

SCHEDULES = {"binomial": binomial_schedule, "scatter_allgather": scatter_allgather_schedule}


def choose(p, nbytes):
    """The name of the algorithm `bcast_auto` runs for a vector of ``nbytes`` bytes on ``p`` ranks."""
    return "binomial" if nbytes < SHORT_BYTES or p < MIN_RANKS else "scatter_allgather"


#: Steps of `bcast_auto` on virtual rank ``rank`` (root 0) (``(rank, p, n, itemsize, in_place) -> Schedule``):
#: those of the algorithm `choose` picks for the vector's bytes and the rank count.
auto_schedule = partial(chosen_schedule, choose, SCHEDULES)

_AUTO = RootedCollective("bcast_auto", auto_schedule, allreduce_length, reduces=False)


def bcast_auto(comm, sendbuf, recvbuf, root=0):
    """Broadcast by the algorithm `choose` picks for this size and rank count.

    Parameters and return value as `parallel.collectives.bcast.binomial.bcast_binomial`.

    Notes
    -----
    The cost of the chosen algorithm (`bcast_binomial` or `bcast_scatter_allgather`).
    Every rank chooses the same, since all pass the same length and dtype.
    """
    return _AUTO(comm, root_or_in_place(comm, sendbuf, root), recvbuf, None, root)
