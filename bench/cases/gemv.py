"""Suite ``gemv``: distributed y = A x (kernels.gemv) against NumPy on one process.

Size n: A is n x n. Variants: ``numpy`` (``A @ x``, one process with every core;
the report's reference), ``rows`` (`gemv_rows`: allgather x, local GEMV), ``cols``
(`gemv_cols`: local GEMV, reduce-scatter y) and ``2d`` (`gemv_2d` on a pr x pc
grid, setting ``GRID``). GEMV does 2 flops per matrix entry read once: it is
memory-bound, and the ranks of a node share its memory bandwidth. See
`bench.families.blas` for inputs, settings, metrics and backends (``numpy`` is
host-only; on ``cupy`` the kernels run on device blocks).

Check: every entry of each rank's block of y, against rows of A regenerated
``CHUNK_ROWS`` at a time times the whole x (float32 in TF32, param ``tf32``: with
TF32's looser eps).

Metrics: gflops (2 n^2 flops), algbw = bytes sent per rank (cost model) / time,
comm_share.
"""
from functools import partial

import numpy as np

from bench.families.blas import (CHUNK_ROWS, BlasCase, count_wrong, library_kernel, seeded_matrix, seeded_rows,
                                 seeded_vector)
from bench.models.gemv import GemvModel
from kernels.gemv import gemv_2d, gemv_cols, gemv_rows, vector_ranges

KERNELS = {"rows": gemv_rows, "cols": gemv_cols, "2d": gemv_2d}


class Gemv(BlasCase):
    model_class = GemvModel
    benchmark = "gemv"
    size_help = "n of the n x n matrix A in y = A x (weak scaling: n sqrt(p))"
    default_sizes = "1K:8K"
    metrics_help = "gflops (2n^2 flops), algbw = bytes sent per rank / s, metric comm_share"
    description = ("Distributed matrix-vector product y = A x of a seeded n x n matrix against one NumPy process "
                   "using every core. Row blocks allgather x, column blocks reduce-scatter y, and the 2D layout "
                   "does both on a grid of the ranks; GEMV is memory-bound, so ranks on one node share its "
                   "memory bandwidth.")
    matrix_products = True

    def build(self, state):
        layout = self.layout(state.comm, state.variant, "cols" if state.variant == "cols" else "rows")
        A = seeded_matrix("A", state.size, state.comm, layout, state.dtype, state.backend)
        x = state.backend.from_host(seeded_vector("x", *vector_ranges(A)[0], state.dtype))
        state.data.update(layout=layout, A=A, x=x)
        state.kernel = library_kernel(np.dot, A.local, x) if state.variant == "numpy" else partial(
            KERNELS[state.variant], A, x)

    def check(self, state):
        n = state.size
        first, last = vector_ranges(state.data["A"])[1]
        x, result, eps = seeded_vector("x", 0, n), state.backend.to_host(state.result), self.check_eps(state)
        wrong = 0
        for start in range(first, last, CHUNK_ROWS):
            a = seeded_rows("A", range(start, min(last, start + CHUNK_ROWS)), n)
            wrong += count_wrong(result[start - first:start - first + len(a)], a @ x, np.abs(a) @ np.abs(x),
                                 n, state.dtype, eps)
        return wrong

    def flops(self, n):
        return 2 * n * n
