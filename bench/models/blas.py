"""What the models of ``blas1``, ``gemv`` and ``gemm`` share (see `bench.families.blas` for the suites).

The library variants (``numpy*``, ``cupy``) run on one rank; the grid variants on
the grid `GRID` sets (default: as square as ``MPI_Dims_create`` makes it), Cannon on
a square one, 25d on ``c`` replicas of a square one (`REPLICAS`). Weak scaling
multiplies n by p^(1/e) for work growing as n^e. A suite's model states its cost per
rank as a `Cost` (`BlasModel.cost`); `BlasModel.predict` prices it.
"""
import math
from collections import namedtuple

from bench.models import terms
from bench.models.base import Model, balanced_dims
from bench.settings import Setting, integer
from kernels.errors import InputError

WORD = 8                  # the cost models count float64 words
VECTOR_ROW = 1 << 16      # a seeded vector is the rows of a matrix this wide, read in order
CHUNK_ROWS = 256          # rows generated at a time (bounds the temporaries)
GRID_VARIANTS = ("2d", "summa", "summa_lookahead", "summa_shared")
CANNON_VARIANTS = ("cannon", "cannon_overlap")
LIBRARY_REFERENCE = "one NumPy process on the host (the CPU library reference)"

#: Per rank: messages, words sent, flops, words streamed through memory, and (compute-bound
#: suites) the local products ``(count, m, n, k)``: ``count`` GEMMs of (m, k) by (k, n).
Cost = namedtuple("Cost", "messages words flops stream_words products", defaults=(None,))


def is_library(variant):
    """Whether ``variant`` is a one-process library call (``numpy*`` on the host, ``cupy`` on one GPU)."""
    return variant.startswith("numpy") or variant == "cupy"


def grid(variable, text, allowed):
    """``(pr, pc)`` from ``PRxPC`` text such as ``2x1``; None for empty text."""
    text = text.lower()
    parts = text.split("x")
    if text and (len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts)):
        raise InputError(f"{variable} must be rows x columns such as 2x1, got {text!r}")
    return tuple(int(p) for p in parts) if text else None


GRID = Setting("GRID", grid, None, "PRxPC", "grid of gemv 2d and gemm summa (default: as square as "
                                              "MPI_Dims_create makes it)")
PANEL = Setting("GEMM_PANEL", integer, 256, 1, "SUMMA panel width")
REPLICAS = Setting("GEMM_REPLICAS", integer, 2, 1, "replicas c of gemm 25d")


class BlasModel(Model):
    """What the three models share: settings, which rank counts fit, grids, the weak rule and `predict`.

    A suite sets ``work_exponent`` (work grows as n to that power) and ``compute_bound``
    (GEMM: modelled by its flop rate, else by memory traffic), and implements
    ``cost(variant, n, p)`` (a `Cost`).
    """

    size_unit = "n"
    work_exponent = 1
    compute_bound = False

    def __init__(self, settings=None):
        super().__init__(settings)
        self.grid, self.panel, self.replicas = (self.settings.get(s.name) for s in (GRID, PANEL, REPLICAS))

    def check_ranks(self, ranks, variant):
        """Raise `InputError` when ``variant`` cannot run on ``ranks`` ranks (see the module)."""
        if is_library(variant) and ranks != 1:
            raise InputError(f"{variant} is one process using every core (implicit parallelism): "
                             f"it runs on 1 rank, not {ranks}")
        if variant in GRID_VARIANTS and self.grid and self.grid[0] * self.grid[1] != ranks:
            raise InputError(f"MLSCALE_GRID={self.grid[0]}x{self.grid[1]} does not fit {ranks} ranks")
        if variant in CANNON_VARIANTS and math.isqrt(ranks) ** 2 != ranks:
            raise InputError(f"{variant} needs a perfect square rank count, not {ranks}")
        if variant == "25d" and (ranks % self.replicas or math.isqrt(ranks // self.replicas) ** 2 * self.replicas
                                 != ranks):
            raise InputError(f"25d needs c | p and p / c a perfect square with c = MLSCALE_GEMM_REPLICAS = "
                             f"{self.replicas}; p = {ranks} does not fit")

    def problem_size(self, size, ranks, scaling):
        return size if scaling == "strong" else int(round(size * ranks ** (1 / self.work_exponent)))

    def grid_dims(self, variant, ranks):
        """Process-grid shape of ``variant`` on ``ranks`` ranks; None for the 1D layouts."""
        if variant in GRID_VARIANTS:
            return self.grid or balanced_dims(ranks, 2)
        if variant in CANNON_VARIANTS:
            return (math.isqrt(ranks),) * 2
        if variant == "25d":
            return (math.isqrt(ranks // self.replicas),) * 2 + (self.replicas,)
        return None

    def cost(self, variant, n, p):
        """The `Cost` per rank of one run of ``variant`` at size ``n`` on ``p`` ranks."""
        raise NotImplementedError

    def predict(self, variant, size, ranks, calib):
        """Cost of the messages and words of `cost` (float64) plus the computation.

        Computation: the local products of ``cost.products`` at the calibrated GEMM rate of
        their shapes (else ``flops`` at the rate of a rank's block size, n / sqrt p), at the
        threads and sharing of one of ``ranks`` ranks (`bench.models.terms.gemm`);
        memory-bound suites stream their words as a copy of half as many (a copy reads and
        writes each byte; gemv: its calibrated GEMVs, `compute_seconds`). Messages (`communication_seconds`): the
        calibrated one-way time of a message of the mean size (gemm: MPI's collective calls at their calibrated
        times); one Python call per run. None when ``variant`` cannot run on ``ranks`` ranks.
        """
        try:
            self.check_ranks(ranks, variant)
        except InputError:
            return None
        cost = self.cost(variant, size, ranks)
        return calib["overhead_s"] + self.communication_seconds(calib, cost, variant, size, ranks) + \
            self.compute_seconds(calib, cost, variant, size, ranks)

    def communication_seconds(self, calib, cost, variant, size, ranks):
        """Seconds of one rank's messages of ``cost``: each at the calibrated one-way time of the mean size."""
        if not cost.messages:
            return 0.0
        return cost.messages * terms.message(calib, cost.words * WORD / cost.messages)

    def compute_seconds(self, calib, cost, variant, size, ranks):
        """Seconds of one rank's computation of ``cost`` (see `predict`)."""
        if self.compute_bound and cost.products:
            count, m, n, k = cost.products
            return count * terms.gemm(calib, m, n, k, ranks)
        if self.compute_bound:
            side = size / math.sqrt(ranks)  # a rank's blocks of the product
            return terms.gemm(calib, side, side, side, ranks) * cost.flops / (2 * side**3)
        return terms.copy(calib, cost.stream_words * WORD / 2)
