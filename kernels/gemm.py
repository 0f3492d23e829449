"""Distributed GEMM ``C = A B``: 1D row blocks here; SUMMA in `kernels.gemm_summa`,
Cannon and 2.5D in `kernels.gemm_cannon`, SUMMA with look-ahead and Cannon with
overlapped shifts in `kernels.gemm_lookahead` (all importable from this module).

``A`` is ``m x k``, ``B`` is ``k x n`` and ``C`` is ``m x n``, all `DistMatrix`
objects with the same layout; the serial reference is ``A @ B``. Costs are per
rank with ``alpha`` per message and ``beta`` per word (binomial-tree ``Bcast``
and ring ``Allgatherv`` assumed); every routine does ``2 m n k / p`` flops
(Cannon and 2.5D slightly more when blocks are padded).

Element types: those of `kernels.dtypes.SUPPORTED` (float16/32/64, complex64/128,
int32/64); others raise TypeError. Blocks of A and B travel in their own type;
C is accumulated in `kernels.dtypes.accumulator` (float16 in float32, from float32
copies of the blocks, through BLAS) and rounded to A's type once, at the end.
Integers are multiplied by NumPy (no BLAS), exactly, wrapping on overflow as
``A @ B`` does. C has A's dtype.

Device blocks (CuPy): the blocks of A and B on the device and their
communicator the backend's wrapper (`kernels.backend.Backend.comm`, grids built
on it); C is computed and returned on the device with the blocks' array module
(products by CuPy's ``matmul``: cuBLAS, TF32 for float32 when CuPy enables it).
"""
from kernels.backend import array_module
from kernels.distmatrix import DistMatrix, timed
from kernels.distribution import block_counts, block_offsets
from kernels.dtypes import accumulator
from kernels.errors import InputError
from kernels.gemm_cannon import gemm_25d, gemm_cannon, grid_25d
from kernels.gemm_checks import check_product
from kernels.gemm_lookahead import gemm_cannon_overlap, gemm_summa_lookahead
from kernels.gemm_summa import gemm_summa

__all__ = ["ONE_D_VARIANTS", "gemm_1d", "gemm_summa", "gemm_summa_lookahead", "gemm_cannon", "gemm_cannon_overlap",
           "grid_25d", "gemm_25d"]

ONE_D_VARIANTS = ("allgather", "ring")


def gemm_1d(A, B, variant="ring", timings=None):
    """``C = A B`` with A, B and C split in row blocks over ``p`` ranks.

    Parameters
    ----------
    A : DistMatrix, layout ``"rows"``, global ``m x k``, local ``m_r x k``
    B : DistMatrix, layout ``"rows"``, global ``k x n``, local ``k_r x n``
    variant : {"ring", "allgather"}
        ``"ring"``: B blocks travel around a ring of ranks (``Sendrecv_replace``,
        blocks padded to ``ceil(k / p)`` rows), one local GEMM per block;
        ``"allgather"``: ``Allgatherv`` of all of B, then one local GEMM.
    timings : dict, optional
        ``"comm"`` and ``"compute"`` seconds are added to it.

    Returns
    -------
    DistMatrix, layout ``"rows"``, global ``m x n``, local ``m_r x n``.

    Notes
    -----
    Both variants move ``(p - 1) k n / p`` words in ``p - 1`` messages per rank:
    ``(p - 1) (alpha + k n / p beta)``; the ring needs ``k n / p`` words of extra
    memory instead of ``k n``.
    """
    m, n = check_product(A, B, "gemm_1d")
    if A.layout != "rows":
        raise InputError("gemm_1d needs A, B in the 'rows' layout")
    if variant not in ONE_D_VARIANTS:
        raise InputError(f"gemm_1d: unknown variant {variant!r}; use one of {', '.join(ONE_D_VARIANTS)}")
    comm, k, wide, xp = A.comm, A.shape[1], accumulator(A.dtype), array_module(A.local)
    counts, offsets = block_counts(k, comm.size), block_offsets(k, comm.size)
    with timed(timings, "compute", xp):
        a = A.local.astype(wide, copy=False)
        product = xp.zeros((A.local.shape[0], n), dtype=wide)
    if variant == "allgather":
        whole_b = xp.empty((k, n), dtype=A.dtype)
        with timed(timings, "comm"):
            comm.Allgatherv(xp.ascontiguousarray(B.local),
                            [whole_b, ([c * n for c in counts], [o * n for o in offsets])])
        with timed(timings, "compute", xp):
            xp.matmul(a, whole_b.astype(wide, copy=False), out=product)
        return DistMatrix(comm, product.astype(A.dtype, copy=False), (m, n), "rows")
    travelling = xp.zeros((max(counts), n), dtype=A.dtype)
    travelling[:B.local.shape[0]] = B.local
    for step in range(comm.size):
        owner = (comm.rank + step) % comm.size
        with timed(timings, "compute", xp):
            start = offsets[owner]
            product += a[:, start:start + counts[owner]] @ travelling[:counts[owner]].astype(wide, copy=False)
        if step < comm.size - 1:
            with timed(timings, "comm"):
                comm.Sendrecv_replace(travelling, dest=(comm.rank - 1) % comm.size,
                                      source=(comm.rank + 1) % comm.size)
    return DistMatrix(comm, product.astype(A.dtype, copy=False), (m, n), "rows")
