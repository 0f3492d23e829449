"""Suite ``blas1``: distributed dot, nrm2 and axpy (kernels.blas1) against NumPy on one process.

Size n is the vector length in elements; rank r holds entries ``block_range(n, p, r)``
of x and y. Variants: ``numpy_dot`` (``np.dot``), ``numpy_nrm2``
(``np.linalg.norm``) and ``numpy_axpy`` (BLAS ``?axpy``, `kernels.blas1.add_scaled`) on the whole vectors, one
process with every core -- one library variant per operation, so that each kernel
has its counterpart (``numpy_dot`` comes first: the report's ``vs_ref`` reference) --
then the kernels ``dot``, ``nrm2`` and ``axpy``. See `bench.families.blas` for
inputs, checks, settings, metrics and backends (the ``numpy_*`` variants are
host-only; on ``cupy`` the kernels run on device blocks).

Check: dot and nrm2 compare each rank's scalar with the reference rank 0 computes
from the regenerated vectors (1M entries at a time; nrm2 allows n + 3 rounding
terms for its scaling and square root); axpy compares each rank's block of y.
``axpy`` alternates a = +0.5 and -0.5 from run to run, so y is y0 or y0 + 0.5 x
after any number of runs.

Metrics: gflops (2n flops for each operation), items_per_s = n / time, comm_share.
"""
from functools import partial

import numpy as np

from bench.families.blas import BlasCase, count_wrong, library_kernel, seeded_vector
from bench.models.blas1 import CHECK_CHUNK, Blas1Model
from kernels import blas1
from kernels.distribution import block_range

AXPY_ALPHA = 0.5


def axpy_alpha(run):
    """a of run number ``run`` (from 0): +0.5 on even runs, -0.5 on odd ones."""
    return AXPY_ALPHA if run % 2 == 0 else -AXPY_ALPHA


def reference_sums(n):
    """``(x . y, |x| . |y|, x . x)`` of the seeded vectors of length ``n``, in float64."""
    sums = np.zeros(3)
    for start in range(0, n, CHECK_CHUNK):
        x, y = (seeded_vector(name, start, min(n, start + CHECK_CHUNK)) for name in "xy")
        sums += (x @ y, np.abs(x) @ np.abs(y), x @ x)
    return sums


class Blas1(BlasCase):
    model_class = Blas1Model
    benchmark = "blas1"
    size_help = "vector length n in elements (weak scaling: n per rank)"
    default_sizes = "64K:16M"
    metrics_help = "gflops (2n flops), items_per_s = n/s, metric comm_share"
    description = ("Distributed dot product, 2-norm and axpy on block vectors against NumPy on one process using "
                   "every core. Each kernel has its one-process counterpart (numpy_dot, numpy_nrm2, numpy_axpy); "
                   "dot and nrm2 end in one small allreduce, axpy does not communicate.")

    def build(self, state):
        comm, dtype = state.comm, np.dtype(state.dtype)
        block = block_range(state.size, comm.size, comm.rank)
        x, y = (state.backend.from_host(seeded_vector(name, *block, dtype)) for name in "xy")
        state.data.update(layout="blocks", block=block, x=x, y=y)
        kernels = {
            "numpy_dot": library_kernel(np.dot, x, y),
            "numpy_nrm2": library_kernel(np.linalg.norm, x),
            "numpy_axpy": library_kernel(lambda: blas1.add_scaled(dtype.type(axpy_alpha(state.runs)), x, y)),
            "dot": partial(blas1.dot, comm, x, y),
            "nrm2": partial(blas1.nrm2, comm, x),
            "axpy": lambda timings: blas1.axpy(axpy_alpha(state.runs), x, y, timings),
        }
        state.kernel = kernels[state.variant]

    def check(self, state):
        operation, n = state.variant.replace("numpy_", ""), state.size
        result = state.backend.to_host(state.result)
        if operation == "axpy":
            x, y0 = (seeded_vector(name, *state.data["block"]) for name in "xy")
            step = AXPY_ALPHA * (state.runs % 2) * x
            return count_wrong(result, y0 + step, np.abs(y0) + np.abs(step), 1, state.dtype)
        sums = state.comm.bcast(reference_sums(n) if state.comm.rank == 0 else None, root=0)
        if operation == "dot":
            return count_wrong(result, sums[0], sums[1], n, state.dtype)
        return count_wrong(result, np.sqrt(sums[2]), np.sqrt(sums[2]), n + 3, state.dtype)

    def flops(self, n):
        return 2 * n

    def rates(self, state, seconds):
        return {"items_per_s": state.size / seconds}
