"""Model of suite ``blas1`` (`bench.cases.blas1`): dot, nrm2 and axpy on block vectors."""
import numpy as np

from bench.models.blas import LIBRARY_REFERENCE, BlasModel, Cost
from bench.models.terms import log2_ceil

#: Entries of the seeded vectors the check of dot and nrm2 sums at a time.
CHECK_CHUNK = 1 << 20
VARIANTS = ("numpy_dot", "numpy_nrm2", "numpy_axpy", "dot", "nrm2", "axpy")


class Blas1Model(BlasModel):
    name = "blas1"
    variants = VARIANTS
    host_only_variants = {variant: LIBRARY_REFERENCE for variant in VARIANTS if variant.startswith("numpy")}

    def cost(self, variant, n, p):
        """dot: one Allreduce of 2 words; nrm2: two (3 and 1 words); axpy none (see kernels.blas1).

        Memory traffic: dot reads x and y, nrm2 reads x three times (max, min and the squares; NumPy's
        norm twice), axpy
        reads x, y and writes y.
        """
        rounds = log2_ceil(p)
        return {"numpy_dot": Cost(0, 0, 2 * n, 2 * n), "numpy_nrm2": Cost(0, 0, 2 * n, n),
                "numpy_axpy": Cost(0, 0, 2 * n, 3 * n), "dot": Cost(rounds, 2 * rounds, 2 * n / p, 2 * n / p),
                "nrm2": Cost(2 * rounds, 4 * rounds, 3 * n / p, 3 * n / p),
                "axpy": Cost(0, 0, 2 * n / p, 3 * n / p)}[variant]

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """x and y blocks of ``ceil(n / p)`` entries (each drawn through a copy); the check
        regenerates the blocks in float64 (axpy: about 7 block-long float64 temporaries) or
        sums 1M-entry chunks on rank 0 (dot, nrm2)."""
        block = -(-problem // ranks)
        arrays = 3 * block * np.dtype(dtype).itemsize
        if not check:
            return arrays
        return arrays + 8 * (7 * block if variant.endswith("axpy") else 5 * min(problem, CHECK_CHUNK))
