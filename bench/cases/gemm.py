"""Suite ``gemm``: distributed C = A B (kernels.gemm) against NumPy on one process.

Size n: A, B and C are n x n. Variants: ``numpy`` (``A @ B``, one process with
every core; the report's reference; host-only), ``cupy`` (``cupy.matmul`` on one
GPU: cuBLAS, the device's library reference; device-only; param ``tf32`` says
whether CuPy uses TF32 for float32), ``1d_ring`` and ``1d_allgather`` (`gemm_1d`,
row blocks), ``summa`` (`gemm_summa` on a pr x pc grid, setting ``GRID``, panel
``GEMM_PANEL``), ``summa_lookahead`` (`gemm_summa_lookahead`: the same with the
broadcast of panel t + 1 overlapping the GEMM of panel t), ``summa_shared`` (the
look-ahead with A and B in node-shared memory, `kernels.node_shared`: a grid axis
whose ranks share a node reads its panels in place, no message; an axis spanning
nodes broadcasts as summa_lookahead; host-only; param ``node_shared`` names the
operands read in place), ``cannon``
(`gemm_cannon`; p a perfect square), ``cannon_overlap`` (`gemm_cannon_overlap`:
each shift overlapping a GEMM) and ``25d`` (`gemm_25d` on a q x q x c grid, c =
``GEMM_REPLICAS``; c | p and p / c a perfect square). See `bench.families.blas`
for inputs, settings, metrics and backends.

Check: every entry of each rank's block of C for n <= `FULL_CHECK_N`; above, the
entries of `SAMPLE_ROWS` rows spread over the block (first and last included),
against those rows of A times B regenerated ``CHUNK_ROWS`` rows at a time (each
rank regenerates all of B: n^2 draws, no n x n temporary). 25d checks C on every layer.
float32 products in TF32 (param ``tf32``) are checked with TF32's looser eps.

Metrics: gflops (2 n^3 flops), algbw = bytes sent per rank (cost model) / time,
comm_share (exposed communication / busy time; params ``exposed_comm_s`` beside
``busy_s``, see `bench.families.blas`).
"""
from functools import partial

import numpy as np
from mpi4py import MPI

from bench.families.blas import (CHUNK_ROWS, GRID, PANEL, REPLICAS, BlasCase, Cost, count_wrong,
                                 library_kernel, seeded_matrix, seeded_rows)
from bench.report.model import log2_ceil
from kernels.distmatrix import DistMatrix
from kernels.gemm import gemm_1d, gemm_25d, gemm_cannon, gemm_cannon_overlap, gemm_summa, gemm_summa_lookahead
from kernels.gemm_lookahead import summa_panels
from kernels.node_shared import share_on_node

FULL_CHECK_N = 512
SAMPLE_ROWS = 8


def _ceil_div(a, b):
    return -(-a // b)


class Gemm(BlasCase):
    name = "gemm"
    benchmark = "gemm"
    variants = ("numpy", "cupy", "1d_ring", "1d_allgather", "summa", "summa_lookahead", "summa_shared", "cannon",
                "cannon_overlap", "25d")
    host_only_variants = {"numpy": "one NumPy process on the host (the CPU library reference; cupy on a GPU)",
                          "summa_shared": "its blocks sit in node-shared host memory (summa_lookahead on a GPU)"}
    device_only_variants = {"cupy": "cuBLAS on one GPU (the device library reference; numpy on the CPU)"}
    size_help = "n of C = A B, all n x n (weak scaling: n p^(1/3))"
    default_sizes = "256:2K"
    metrics_help = "gflops (2n^3 flops), algbw = bytes sent per rank / s, metric comm_share"
    description = ("Distributed matrix product C = A B of seeded n x n matrices against one NumPy process using "
                   "every core (on a GPU: cupy, cuBLAS on one device). The kernels are 1D row blocks (B passed "
                   "round a ring, or allgathered), SUMMA on a 2D grid (plain; with look-ahead: the next panels "
                   "broadcast during the current GEMM; or with the blocks in node-shared memory, panels read "
                   "in place), Cannon on a square grid (plain, or with each shift "
                   "overlapping a GEMM) and the 2.5D algorithm with c replicas; each rank pins its share of the BLAS "
                   "threads and splits its time into exposed communication and computation.")
    declared_settings = (GRID, PANEL, REPLICAS)
    work_exponent = 3
    compute_bound = True
    matrix_products = True

    def iterations(self, size):
        return (5, 1) if size >= 2048 else (10, 2)

    def build(self, state):
        layout = self.layout(state.comm, state.variant, "rows")
        A, B = (seeded_matrix(name, state.size, state.comm, layout, state.dtype, state.backend) for name in "AB")
        kernels = {"numpy": library_kernel(np.matmul, A.local, B.local),
                   "cupy": library_kernel(state.backend.xp.matmul, A.local, B.local),
                   "1d_ring": partial(gemm_1d, A, B, "ring"), "1d_allgather": partial(gemm_1d, A, B, "allgather"),
                   "summa": partial(gemm_summa, A, B, self.panel),
                   "summa_lookahead": partial(gemm_summa_lookahead, A, B, self.panel),
                   "cannon": partial(gemm_cannon, A, B), "cannon_overlap": partial(gemm_cannon_overlap, A, B),
                   "25d": partial(gemm_25d, A, B)}
        if state.variant == "summa_shared":
            node_blocks = (share_on_node(A, layout.row_comm), share_on_node(B, layout.col_comm))
            state.data["node_blocks"] = node_blocks
            kernels["summa_shared"] = partial(gemm_summa_lookahead, A, B, self.panel, node_blocks=node_blocks)
        state.data.update(layout=layout, A=A, B=B)
        state.kernel = kernels[state.variant]

    def teardown(self, state):
        """Free the node-shared windows (summa_shared), then the grid."""
        for blocks in state.data.get("node_blocks", ()):
            if blocks is not None:
                blocks.free()
        super().teardown(state)

    def check(self, state):
        n, C = state.size, state.result
        local, (first, last), cols = (C.local, C.row_range, C.col_range) if isinstance(C, DistMatrix) else (
            C, (0, n), (0, n))
        local = state.backend.to_host(local)
        rows = np.arange(first, last)
        if n > FULL_CHECK_N and len(rows) > SAMPLE_ROWS:
            rows = np.unique(np.linspace(first, last - 1, SAMPLE_ROWS).round().astype(int))
        a = seeded_rows("A", rows, n)
        expected = np.zeros((len(rows), cols[1] - cols[0]))
        magnitude = np.zeros_like(expected)
        for start in range(0, n, CHUNK_ROWS):
            b = seeded_rows("B", range(start, min(n, start + CHUNK_ROWS)), n)[:, slice(*cols)]
            expected += a[:, start:start + len(b)] @ b
            magnitude += np.abs(a[:, start:start + len(b)]) @ np.abs(b)
        return count_wrong(local[rows - first], expected, magnitude, n, state.dtype, self.check_eps(state))

    def flops(self, n):
        return 2 * n ** 3

    def cost(self, variant, n, p):
        """Messages and words per rank as in kernels.gemm (binomial-tree ``Bcast``).

        1d: ``p - 1`` messages of ``n^2 / p`` words. summa with b = panel:
        ``(ceil(n/b) + pc) log2 pc + (ceil(n/b) + pr) log2 pr`` messages,
        ``n^2 / pr log2 pc + n^2 / pc log2 pr`` words; summa_lookahead the same words
        in ``P (log2 pc + log2 pr)`` messages, P = its number of panels
        (`kernels.gemm_lookahead.summa_panels`); summa_shared on one node none (its
        operands are read in place; `setup` records the words of an axis spanning
        nodes, the largest over ranks). cannon, cannon_overlap (c = 1) and 25d: s = ceil(q / c) steps of 2 shifts of ceil(n/q)^2 words (none when q = 1), then the
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
            words = self._summa_words(n, rows, cols)
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

    @staticmethod
    def _summa_words(n, rows, cols, shared=(False, False)):
        """Words a rank receives in SUMMA's panel broadcasts on a rows x cols grid: A's along grid rows,
        B's along grid columns, none for an operand whose ``shared`` flag says it is read in place."""
        return (0 if shared[0] else n * n / rows * log2_ceil(cols)) + (0 if shared[1] else n * n / cols *
                                                                        log2_ceil(rows))

    def setup(self, comm, size, variant, backend, dtype):
        state = super().setup(comm, size, variant, backend, dtype)
        if variant == "summa_shared":  # the largest words of a rank; an operand named only if shared everywhere
            mine = [blocks is not None for blocks in state.data["node_blocks"]]
            words = comm.allreduce(self._summa_words(size, *state.data["layout"].dims, mine), op=MPI.MAX)
            shared = [comm.allreduce(int(flag), op=MPI.MIN) for flag in mine]
            state.params.update(node_shared=",".join(name for name, flag in zip("AB", shared) if flag) or "none",
                                comm_bytes_per_rank=round(words * np.dtype(dtype).itemsize))
        return state

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
