"""Model of suite ``gemv`` (`bench.cases.gemv`): y = A x on row blocks, column blocks or a grid."""
import numpy as np

from bench.models import collective_terms, terms
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

    def communication_seconds(self, calib, cost, variant, size, ranks):
        """MPI's calls at their calibrated two-rank times, grown to their ranks as MPI's algorithms grow
        (`collective_terms.library`; the point's item size, float16 partial sums in float32): rows' ``Allgatherv``
        of x on all ranks, cols' ``Reduce_scatter`` of y on all ranks, 2d's ``Allgatherv`` of ``n / pc`` entries of
        x in each grid column (``pr`` ranks) and ``Reduce_scatter`` of ``n / pr`` partial sums in each grid row
        (``pc`` ranks, a call also on one). The one-way message of `BlasModel` missed most of a small call here:
        at n = 16-256 on 2 ranks the kernels' calls took 5-12 us in all, a one-way message 1.5-3 us."""
        if variant == "numpy":
            return 0.0
        item = terms.itemsize(calib)
        rows, cols = self.grid_dims(variant, ranks) or ({"rows": (ranks, 1), "cols": (1, ranks)}[variant])
        gather = collective_terms.library(calib, "allgather", -(-size // cols) * item, rows,
                                          collective_terms.allgather) if variant != "cols" else 0.0
        partial = max(item, 4)  # float16 blocks sum in float32 (kernels.dtypes.accumulator)
        scatter = collective_terms.library(calib, "reduce_scatter", -(-size // rows) * partial, cols,
                                           collective_terms.reduce_scatter) if variant != "rows" else 0.0
        return gather + scatter

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
