"""Model of suite ``gemv`` (`bench.cases.gemv`): y = A x on row blocks, column blocks or a grid."""
import numpy as np

from bench.models import terms
from bench.models.blas import CHUNK_ROWS, GRID, LIBRARY_REFERENCE, VECTOR_ROW, BlasModel, Cost


class GemvModel(BlasModel):
    name = "gemv"
    variants = ("numpy", "rows", "cols", "2d")
    host_only_variants = {"numpy": LIBRARY_REFERENCE}
    declared_settings = (GRID,)
    work_exponent = 2

    def cost(self, variant, n, p):
        """rows: ``Allgatherv`` of x, cols: ``Reduce_scatter`` of y, ``(p - 1) n / p`` words in p - 1
        messages; 2d: ``pr + pc - 2`` messages of ``n / p`` words (see kernels.gemv). Each rank
        reads its n^2 / p matrix entries once."""
        work = Cost(0, 0, 2 * n * n / p, n * n / p)
        if variant == "2d":
            rows, cols = self.grid_dims(variant, p)
            return work._replace(messages=rows + cols - 2, words=(rows + cols - 2) * n / p)
        return work if variant == "numpy" else work._replace(messages=p - 1, words=(p - 1) * n / p)

    def compute_seconds(self, calib, cost, variant, size, ranks):
        """The local GEMV of the busiest rank's block (``ceil(n / p) x n``, ``n x ceil(n / p)`` or
        ``ceil(n / pr) x ceil(n / pc)``) at the calibrated GEMV time of its bytes (`bench.models.terms.gemv`);
        a calibration without that table prices the read as a copy of half the bytes (`BlasModel`)."""
        rows, cols = self.grid_dims(variant, ranks) or ({"rows": (ranks, 1), "cols": (1, ranks)}.get(variant, (1, 1)))
        block = -(-size // rows) * -(-size // cols)
        seconds = terms.gemv(calib, block * terms.itemsize(calib), ranks)
        return super().compute_seconds(calib, cost, variant, size, ranks) if seconds is None else seconds

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """This rank's ``n^2 / p`` entries of A (all of A for ``numpy``), rows drawn
        `CHUNK_ROWS` at a time, and vectors of up to n (padded to whole seeded rows); the
        check regenerates x and `CHUNK_ROWS`-row slices of A in float64."""
        n, item = problem, np.dtype(dtype).itemsize
        vector = max(n, VECTOR_ROW)
        arrays = (n * -(-n // ranks) + n + CHUNK_ROWS * n) * item + 4 * vector * item
        return arrays + ((2 * vector + 3 * CHUNK_ROWS * n) * 8 if check else 0)
