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

from bench.families.blas import CHUNK_ROWS, BlasCase, count_wrong, library_kernel, seeded_matrix, seeded_rows
from bench.models.gemm import FULL_CHECK_N, SAMPLE_ROWS, GemmModel
from kernels.distmatrix import DistMatrix
from kernels.gemm import gemm_1d, gemm_25d, gemm_cannon, gemm_cannon_overlap, gemm_summa, gemm_summa_lookahead
from kernels.node_shared import share_on_node

class Gemm(BlasCase):
    model_class = GemmModel
    benchmark = "gemm"
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
    matrix_products = True

    def iterations(self, size):
        return (5, 1) if size >= 2048 else (10, 2)

    def build(self, state):
        layout = self.layout(state.comm, state.variant, "rows")
        A, B = (seeded_matrix(name, state.size, state.comm, layout, state.dtype, state.backend) for name in "AB")
        kernels = {"numpy": library_kernel(np.matmul, A.local, B.local),
                   "cupy": library_kernel(state.backend.xp.matmul, A.local, B.local),
                   "1d_ring": partial(gemm_1d, A, B, "ring"), "1d_allgather": partial(gemm_1d, A, B, "allgather"),
                   "summa": partial(gemm_summa, A, B, self.model.panel),
                   "summa_lookahead": partial(gemm_summa_lookahead, A, B, self.model.panel),
                   "cannon": partial(gemm_cannon, A, B), "cannon_overlap": partial(gemm_cannon_overlap, A, B),
                   "25d": partial(gemm_25d, A, B)}
        if state.variant == "summa_shared":
            node_blocks = (share_on_node(A, layout.row_comm), share_on_node(B, layout.col_comm))
            state.data["node_blocks"] = node_blocks
            kernels["summa_shared"] = partial(gemm_summa_lookahead, A, B, self.model.panel, node_blocks=node_blocks)
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

    def setup(self, comm, size, variant, backend, dtype):
        state = super().setup(comm, size, variant, backend, dtype)
        if variant == "summa_shared":  # the largest words of a rank; an operand named only if shared everywhere
            mine = [blocks is not None for blocks in state.data["node_blocks"]]
            words = comm.allreduce(self.model.summa_words(size, *state.data["layout"].dims, mine), op=MPI.MAX)
            shared = [comm.allreduce(int(flag), op=MPI.MIN) for flag in mine]
            state.params.update(node_shared=",".join(name for name, flag in zip("AB", shared) if flag) or "none",
                                comm_bytes_per_rank=round(words * np.dtype(dtype).itemsize))
        return state
