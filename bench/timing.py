"""OSU-style timing: warm-up, barrier, per-iteration times, statistics of the slowest rank."""
import math
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from bench import stability

#: A timed sample repeats the work until it lasts at least this long, so that
#: microsecond operations are not lost in barrier skew and timer overhead.
MIN_SAMPLE_SECONDS = 1e-3
MAX_REPEATS = 1000


@dataclass
class Timing:
    """Seconds per run of the slowest rank: minimum, median and maximum over iterations.

    ``repeats`` is how many runs each timed sample averaged (1 unless one run is
    shorter than `MIN_SAMPLE_SECONDS`). ``spread``: the samples' interquartile range
    over their median (`bench.stability.spread`); ``samples``: how many were taken
    (``iters``, or more for a point sampled again).
    """

    t_min: float
    t_med: float
    t_max: float
    iters: int
    warmup: int
    repeats: int
    spread: float = 0.0
    samples: int = 0

    def stable(self, max_spread=stability.MAX_SPREAD):
        """Whether the point's samples agree: `spread` at most ``max_spread``."""
        return self.spread <= max_spread


def measure(comm, run, iters, warmup, synchronize=None, clock=MPI.Wtime, resampling=None):
    """Time ``run()`` on every rank of ``comm`` and return the `Timing` of the slowest rank.

    Each of ``iters`` samples starts after a barrier and times ``repeats`` calls of
    ``run``; a sample's time on each rank is its elapsed time divided by ``repeats``,
    and the sample's time is the maximum over ranks (one ``Allreduce`` of the
    ``iters`` times at the end, outside the timed region). ``repeats`` is chosen
    after the warm-up from the slowest rank's time of one run, the same on every rank.
    With ``resampling`` (a `bench.stability.Resampling`), samples whose spread exceeds
    its ``max_spread`` are followed by more batches of ``iters`` (`bench.stability`);
    the `Timing` is over all of them (its ``samples``: how many).

    Parameters
    ----------
    comm : MPI.Comm
        The ranks taking part.
    run : callable
        The timed work; it must leave no device work pending, or pass ``synchronize``.
    iters, warmup : int
        Timed iterations (>= 1) and untimed warm-up runs (>= 0).
    synchronize : callable, optional
        Called after each sample's runs, inside the timed region (device streams).
    clock : callable, optional
        Seconds since some fixed point (`MPI.Wtime`; tests pass a deterministic clock).
    resampling : bench.stability.Resampling, optional
        None: ``iters`` samples, whatever their spread.

    Notes
    -----
    Every rank makes the same collective calls in the same order (``repeats`` is
    agreed by an allreduce; the spread is computed from the same reduced samples on
    every rank, and the extra sampling time is agreed by an allreduce before each
    batch), so no rank can wait for another that left the loop.
    An error raised by ``run`` on one rank leaves the others in a collective,
    with no point where they could hear of it: the caller must end the job
    (`bench.sweep` aborts it).
    """
    synchronize = synchronize or (lambda: None)
    for _ in range(warmup):
        run()
    synchronize()
    comm.Barrier()
    start = clock()
    run()
    synchronize()
    one_run = comm.allreduce(clock() - start, op=MPI.MAX)
    repeats = 1
    if one_run < MIN_SAMPLE_SECONDS:
        repeats = min(MAX_REPEATS, math.ceil(MIN_SAMPLE_SECONDS / max(one_run, 1e-9)))

    def slowest_of(count):
        samples = np.empty(count)
        for index in range(count):
            comm.Barrier()
            begin = clock()
            for _ in range(repeats):
                run()
            synchronize()
            samples[index] = (clock() - begin) / repeats
        slowest = np.empty_like(samples)
        comm.Allreduce(samples, slowest, op=MPI.MAX)
        return slowest

    slowest = slowest_of(iters)
    if resampling is not None:
        began, most = clock(), resampling.factor * iters
        while stability.spread(slowest) > resampling.max_spread and slowest.size < most:
            if comm.allreduce(clock() - began, op=MPI.MAX) >= resampling.max_seconds:
                break
            slowest = np.concatenate([slowest, slowest_of(min(iters, most - slowest.size))])
    return Timing(
        t_min=float(slowest.min()),
        t_med=float(np.median(slowest)),
        t_max=float(slowest.max()),
        iters=iters,
        warmup=warmup,
        repeats=repeats,
        spread=stability.spread(slowest),
        samples=int(slowest.size),
    )
