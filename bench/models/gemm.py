"""Model of suite ``gemm`` (`bench.cases.gemm`): the 1D, SUMMA, Cannon and 2.5D products and the libraries."""
import numpy as np

from bench.models import collective_terms
from bench.models.blas import CHUNK_ROWS, GRID, PANEL, REPLICAS, WORD, BlasModel, Cost
from bench.models.terms import log2_ceil
from kernels.gemm_lookahead import summa_panels

#: Largest n whose check compares every entry; above, `SAMPLE_ROWS` rows of each block.
FULL_CHECK_N = 512
SAMPLE_ROWS = 8


def _ceil_div(a, b):
    return -(-a // b)


class GemmModel(BlasModel):
    name = "gemm"
    variants = ("numpy", "cupy", "1d_ring", "1d_allgather", "summa", "summa_lookahead", "summa_shared", "cannon",
                "cannon_overlap", "25d")
    host_only_variants = {"numpy": "one NumPy process on the host (the CPU library reference; cupy on a GPU)",
                          "summa_shared": "its blocks sit in node-shared host memory (summa_lookahead on a GPU)"}
    device_only_variants = {"cupy": "cuBLAS on one GPU (the device library reference; numpy on the CPU)"}
    declared_settings = (GRID, PANEL, REPLICAS)
    work_exponent = 3
    compute_bound = True

    def cost(self, variant, n, p):
        """Messages and words per rank as in kernels.gemm (binomial-tree ``Bcast``).

        1d: ``p - 1`` messages of ``n^2 / p`` words. summa with b = panel:
        ``(ceil(n/b) + pc) log2 pc + (ceil(n/b) + pr) log2 pr`` messages,
        ``n^2 / pr log2 pc + n^2 / pc log2 pr`` words; summa_lookahead the same words
        in ``P (log2 pc + log2 pr)`` messages, P = its number of panels
        (`kernels.gemm_lookahead.summa_panels`); summa_shared on one node none (its
        operands are read in place; `setup` records the words of an axis spanning
        nodes, the largest over ranks). cannon, cannon_overlap (c = 1) and 25d: s = ceil(q / c) steps
        of 2 shifts of ceil(n/q)^2 words (none when q = 1), then the
        depth ``Allreduce``: ``2 log2 c`` messages, ``2 (c - 1) / c ceil(n/q)^2`` words;
        ``2 s ceil(n/q)^3`` flops. Local products: numpy one n x n x n; 1d_allgather one of
        ceil(n/p) rows by all of B, 1d_ring p of ceil(n/p) rows by a block of ceil(n/p) rows of
        B; summa one per panel (m / pr, n / pc, the mean width); Cannon and 25d s of blocks.
        """
        if variant in ("numpy", "cupy"):
            return Cost(0, 0, 2 * n ** 3, 0, (1, n, n, n))
        if variant.startswith("1d"):
            rows = _ceil_div(n, p)
            products = (1, rows, n, n) if variant == "1d_allgather" else (p, rows, n, rows)
            return Cost(p - 1, (p - 1) * n * n / p, 2 * n ** 3 / p, 0, products)
        if variant.startswith("summa"):
            rows, cols = self.grid_dims(variant, p)
            width = min(self.panel, n)
            words = self.summa_words(n, rows, cols)
            panels = summa_panels(n, width, rows, cols)
            products = (len(panels), _ceil_div(n, rows), _ceil_div(n, cols), n / len(panels))
            if variant == "summa_shared":
                return Cost(0, 0, 2 * n ** 3 / p, 0, products)
            if variant == "summa_lookahead":
                return Cost(len(panels) * (log2_ceil(cols) + log2_ceil(rows)), words, 2 * n ** 3 / p, 0, products)
            count = _ceil_div(n, width)
            return Cost((count + cols) * log2_ceil(cols) + (count + rows) * log2_ceil(rows), words,
                        2 * n ** 3 / p, 0, products)
        q, replicas = self.grid_dims(variant, p)[0], (self.replicas if variant == "25d" else 1)
        steps, side = _ceil_div(q, replicas), _ceil_div(n, q)
        shifts = 2 * steps if q > 1 else 0
        return Cost(shifts + 2 * log2_ceil(replicas), (shifts + 2 * (replicas - 1) / replicas) * side ** 2,
                    2 * steps * side ** 3, 0, (steps, side, side, side))

    def communication_seconds(self, calib, cost, variant, size, ranks):
        """MPI's collective calls at their calibrated two-rank times, grown to their ranks as MPI's algorithms grow
        (`collective_terms.library`): 1d_allgather's ``Allgatherv`` of all of B; SUMMA's panel broadcasts along
        each grid axis of two or more ranks, of the mean piece (summa: ``ceil(n / b) + axis - 1`` ``Bcast`` per
        axis at most, a panel across a block boundary sent by each owner; summa_lookahead: one ``Ibcast`` per
        panel of `summa_panels`, priced as a ``Bcast``: no credit for the overlap). The other variants'
        messages as `BlasModel` prices them (in a calibration here, ``MPI_Bcast`` of 128 KiB-2 MiB on 2 ranks took
        3.4-6x a one-way message of its size)."""
        n = size
        if variant == "1d_allgather" and ranks > 1:
            return collective_terms.library(calib, "allgather", n * n * WORD, ranks, collective_terms.allgather)
        if variant not in ("summa", "summa_lookahead"):
            return super().communication_seconds(calib, cost, variant, size, ranks)
        rows, cols = self.grid_dims(variant, ranks)
        width = min(self.panel, n)
        seconds = 0.0
        for axis, block_bytes in ((cols, -(-n // rows) * n * WORD), (rows, n * -(-n // cols) * WORD)):
            if axis > 1:  # A's panels along grid rows (cols ranks), B's along grid columns (rows ranks)
                calls = len(summa_panels(n, width, rows, cols)) if variant == "summa_lookahead" else \
                    _ceil_div(n, width) + axis - 1
                seconds += calls * collective_terms.library(calib, "bcast", block_bytes / calls, axis,
                                                            collective_terms.bcast)
        return seconds

    @staticmethod
    def summa_words(n, rows, cols, shared=(False, False)):
        """Words a rank receives in SUMMA's panel broadcasts on a rows x cols grid: A's along grid rows,
        B's along grid columns, none for an operand whose ``shared`` flag says it is read in place."""
        return (0 if shared[0] else n * n / rows * log2_ceil(cols)) + (0 if shared[1] else n * n / cols *
                                                                        log2_ceil(rows))

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """Blocks of A, B and C with each variant's buffers (see kernels.gemm), in entries:
        numpy and cupy ``3 n^2``; 1d ``3 L`` (``L = n ceil(n / p)``) plus a travelling block and a
        product (ring) or all of B (allgather); summa ``3 L`` and two panels (four with
        look-ahead; summa_shared no panel, but one more block while a block is copied into
        its window); cannon and 25d ``7 s^2`` (``s = ceil(n / q)``: A, B, C, padded copies,
        product; 25d one more for the depth allreduce, cannon_overlap two more for the next
        blocks); `CHUNK_ROWS` rows drawn at a time. The check regenerates the checked
        rows of A (all rows up to `FULL_CHECK_N`) and `CHUNK_ROWS`-row slices of B in float64."""
        n, item = problem, np.dtype(dtype).itemsize
        rows = -(-n // ranks)
        local = n * rows
        if variant in ("numpy", "cupy"):
            entries = 3 * n * n
        elif variant.startswith("1d"):
            entries = 3 * local + (2 * local if variant == "1d_ring" else n * n)
        elif variant.startswith("summa"):
            entries = 3 * local + ({"summa_lookahead": 4 * min(self.panel, n) * n, "summa_shared": local}
                                   .get(variant, 2 * min(self.panel, n) * n))
        else:
            q = self.grid_dims(variant, ranks)[0]
            rows = _ceil_div(n, q)
            entries = {"25d": 8, "cannon_overlap": 9}.get(variant, 7) * rows * rows
        arrays = (entries + CHUNK_ROWS * n) * item + 16 * n
        checked = rows if n <= FULL_CHECK_N else min(rows, SAMPLE_ROWS)
        return arrays + (8 * (3 * CHUNK_ROWS * n + 4 * checked * n) if check else 0)
