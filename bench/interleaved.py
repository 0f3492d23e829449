"""Interleaved timing of callables (`bench.local_rates`, `bench.message_tables`, `bench.load`): each sample
loops a callable until it lasts about ``least`` seconds, and rounds visit every callable in turn, so that a
burst of load on a shared machine spreads over many entries instead of spoiling one.
"""
import numpy as np
from mpi4py import MPI

#: Rounds per entry and the seconds a sample lasts at least.
ROUNDS, LEAST_S = 3, 0.01


def measure_interleaved(items, comm=None, rounds=ROUNDS, least=LEAST_S):
    """Median seconds per call of each callable of the dict ``items`` over `interleaved_samples`."""
    return medians(interleaved_samples(items, comm, rounds, least))


def medians(samples):
    """The median of each key's samples."""
    return {key: float(np.median(values)) for key, values in samples.items()}


def interleaved_samples(items, comm=None, rounds=ROUNDS, least=LEAST_S, warm=()):
    """Seconds per call of each callable of the dict ``items``, one sample (`sampler`) per round of ``rounds``
    rounds that call each in turn."""
    return rounds_of(items, sampler(items, comm, least, warm), rounds)


def rounds_of(items, sample, rounds):
    """``{key: [seconds, ...]}``: ``sample(key)`` of each key of ``items`` in turn, ``rounds`` times."""
    samples = {key: [] for key in items}
    for _ in range(rounds):
        for key in items:
            samples[key].append(sample(key))
    return samples


def sampler(items, comm, least, warm):
    """A callable giving the seconds per call of ``items[key]`` over a sample that loops ``least / (one call)``
    times (the largest count over ``comm``'s ranks, which start each sample together), after as many untimed
    calls for the keys in ``warm`` (as a sweep's point runs its warm-up right before its timed runs, and repeats
    one call). Collective over ``comm``: the loop counts agreed now, a barrier per sample."""
    loops = {}
    for key, function in items.items():
        function()  # the first call may build caches: not timed
        start = MPI.Wtime()
        function()
        loops[key] = max(1, int(least / max(MPI.Wtime() - start, 1e-7)))
    if comm is not None:
        counts = np.array(list(loops.values()), np.int64)
        comm.Allreduce(MPI.IN_PLACE, counts, op=MPI.MAX)
        loops = dict(zip(loops, counts.tolist()))

    def sample(key):
        function = items[key]
        for _ in range(loops[key] if key in warm else 0):
            function()
        if comm is not None:
            comm.Barrier()
        start = MPI.Wtime()
        for _ in range(loops[key]):
            function()
        return (MPI.Wtime() - start) / loops[key]
    return sample
