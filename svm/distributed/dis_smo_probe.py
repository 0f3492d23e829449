"""Seconds of one Dis-SMO iteration as a solve runs it, for the cost model of suite ``svm`` (`bench.local_rates`).

A solve's iteration is a few dozen small NumPy and MPI calls between kernel rows: the row
(``K(x_i, X_block)``, `svm.solver.gram.KernelRowCache`) streams the block's samples through the
caches, and the calls after it find their arrays, and the interpreter its own data, cold. Timed in
a tight loop the same calls took a half to a third of their time in a solve here (a candidates
``Allreduce`` on one rank: 3.5 us against 9-10 us), so the model's constants, measured in tight loops,
priced the iterations 1.5-2.6x low. `IterationProbe` times the solver's own iterations in that state.
"""
import time

import numpy as np
from mpi4py import MPI

from kernels.comm.counting import CountingComm
from svm.distributed.dis_smo import _BlockSolver
from svm.solver.gram import make_kernel

#: Iterations after which the probe's solve starts again from ``alpha = 0`` (the same pairs each time).
RESTART = 64


class _TimedKernel:
    """A `svm.solver.gram.Kernel` whose ``block`` adds its seconds to ``seconds``."""

    def __init__(self, kernel):
        self.kernel, self.seconds = kernel, 0.0

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def block(self, *args):
        start = time.perf_counter()
        try:
            return self.kernel.block(*args)
        finally:
            self.seconds += time.perf_counter() - start


class IterationProbe:
    """Dis-SMO iterations of one rank owning all ``samples`` random samples of ``features`` features (RBF,
    C = 1, random labels), each timed as in a solve, less the kernel row it computes.

    Each iteration's two candidate ``Allreduce`` run on a `kernels.comm.counting.CountingComm` over
    ``MPI.COMM_SELF`` (a solve's Python path, without other ranks). Each computes one kernel row through the
    cache, as a solve does on most iterations (a first use of a sample's row: 0.55-0.65 per iteration on
    MNIST here), alternately its ``i`` and its ``j``; the row's product and element-wise steps
    (`svm.solver.gram.Kernel.block`, priced apart by the kernel-row rate) are timed and left out, the
    cache's own work on the miss is not. The solve restarts from ``alpha = 0`` every `RESTART` iterations
    (or when it converges), so it repeats the pairs of its first pass, whose rows the constructor caches.
    Calling the probe runs one iteration and returns its seconds.
    """

    def __init__(self, samples, features, seed=0):
        rng = np.random.default_rng(seed)
        X = rng.random((samples, features))
        y = np.where(rng.random(samples) < 0.5, -1.0, 1.0)
        self.kernel = _TimedKernel(make_kernel("rbf", X))
        self.solver = _BlockSolver(CountingComm(MPI.COMM_SELF), X, y, self.kernel, 1.0, 1e-3,
                                   cache_bytes=2 * RESTART * 8 * samples)
        self.pairs = []
        for _ in range(RESTART):  # the first pass: records the pairs and caches their rows
            _, _, pair = self.solver.step()
            if pair is None:
                break
            self.pairs.append(pair)
        if not self.pairs:
            raise ValueError(f"the probe's solve of {samples} samples converged before its first pair: give more")
        self.done = len(self.pairs)

    def __call__(self):
        if self.done == len(self.pairs):
            self.solver.restart()
            self.done = 0
        pair = self.pairs[self.done]
        self.solver.cache.forget(pair[self.done % 2])
        self.done += 1
        kernel_before, start = self.kernel.seconds, time.perf_counter()
        self.solver.step()
        return time.perf_counter() - start - (self.kernel.seconds - kernel_before)
