"""Model of suite ``blas1`` (`bench.cases.blas1`): dot, nrm2 and axpy on block vectors."""
import math

import numpy as np

from bench.models import collective_terms, terms
from bench.models.blas import LIBRARY_REFERENCE, WORD, BlasModel, Cost
from bench.models.terms import log2_ceil
from kernels.errors import InputError

#: Entries of the seeded vectors the check of dot and nrm2 sums at a time.
CHECK_CHUNK = 1 << 20
VARIANTS = ("numpy_dot", "numpy_nrm2", "numpy_axpy", "dot", "nrm2", "axpy")
#: Python and NumPy calls of one run, in units of `terms.calls`: the kernels' block and dtype checks, timing
#: contexts, partial-sum buffers, casts and result scalar (`kernels.blas1`; one run of each at 8 entries took
#: 4-5, 6-9 and 15 us here, 5, 8 and 17 calls of 0.86 us), the library calls' own (1.7-2.2 us).
CALLS = {"numpy_dot": 2, "numpy_nrm2": 3, "numpy_axpy": 3, "dot": 8, "nrm2": 17, "axpy": 5}
#: Bytes of each ``MPI_Allreduce`` a kernel makes (`kernels.blas1`).
ALLREDUCE_BYTES = {"dot": (16,), "nrm2": (24, 8)}


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

    def predict(self, variant, size, ranks, calib):
        """The run's calls (`CALLS`), its ``MPI_Allreduce`` (`ALLREDUCE_BYTES`, `collective_terms.allreduce`) and its
        passes over a rank's block of ``B = 8 ceil(n / p)`` bytes as NumPy makes them: dot reads x and y (a read of
        2 B, `terms.read`: the calibrated GEMV of as many bytes), nrm2 reads x three times (max, min, the sum of
        squares: three reads of B, x staying in the cache where it fits; ``numpy.linalg.norm`` one), axpy is one
        BLAS ``?axpy`` over x and y (`kernels.blas1.add_scaled`: the traffic of an in-place addition, a
        reduction of B; on one thread 0.88-1.14x its time here from 64 KiB to 64 MiB). None when ``variant``
        cannot run on ``ranks`` ranks."""
        try:
            self.check_ranks(ranks, variant)
        except InputError:
            return None
        block = WORD * math.ceil(size / ranks)
        passes = {"dot": terms.read(calib, 2 * block, ranks), "numpy_dot": terms.read(calib, 2 * block, ranks),
                  "nrm2": 3 * terms.read(calib, block, ranks), "numpy_nrm2": terms.read(calib, block, ranks),
                  "axpy": terms.reduction(calib, block)}
        passes["numpy_axpy"] = passes["axpy"]
        reduces = sum(collective_terms.allreduce(calib, nbytes, ranks) for nbytes in ALLREDUCE_BYTES.get(variant, ()))
        return terms.calls(calib, CALLS[variant]) + reduces + passes[variant]

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """x and y blocks of ``ceil(n / p)`` entries (each drawn through a copy); the check
        regenerates the blocks in float64 (axpy: about 7 block-long float64 temporaries) or
        sums 1M-entry chunks on rank 0 (dot, nrm2)."""
        block = -(-problem // ranks)
        arrays = 3 * block * np.dtype(dtype).itemsize
        if not check:
            return arrays
        return arrays + 8 * (7 * block if variant.endswith("axpy") else 5 * min(problem, CHECK_CHUNK))
