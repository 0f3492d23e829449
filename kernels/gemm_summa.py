"""SUMMA: distributed GEMM ``C = A B`` on any ``pr x pc`` grid (see `kernels.gemm` for conventions).

Panels of A and B travel in their own type; C is accumulated in
`kernels.dtypes.accumulator` and rounded to A's type once. A grid axis of one
rank sends nothing: its panels are views of the local block (so on one rank,
on a device, no panel is copied to the host).
"""
from bisect import bisect_right

import numpy as np
from scipy.linalg.blas import get_blas_funcs

from kernels.backend import array_module
from kernels.distmatrix import DistMatrix, timed
from kernels.distribution import block_offsets
from kernels.dtypes import accumulator
from kernels.errors import InputError
from kernels.gemm_checks import check_product

BLAS_TYPES = "fdFD"   # float32, float64, complex64, complex128: the types BLAS GEMM updates in place


def owner_of(index, length, parts):
    """Block (of ``length`` items split in ``parts`` by `block_range`) holding item ``index``."""
    return bisect_right(block_offsets(length, parts), index) - 1


def _pieces(start, stop, length, parts):
    """Split ``[start, stop)`` at the block boundaries of ``length`` items in ``parts``.

    Yields ``(owner, lo, hi)``: global range ``[lo, hi)`` lies in block ``owner``.
    """
    offsets = block_offsets(length, parts) + [length]
    lo = start
    while lo < stop:
        owner = owner_of(lo, length, parts)
        hi = min(stop, offsets[owner + 1])
        yield owner, lo, hi
        lo = hi


def _broadcast_panel(comm, panel, source, start, stop, length, my_index):
    """The rows ``[start, stop)`` of the k-blocks that ``comm``'s ranks own.

    ``source`` is this rank's k-block, one row per k index. On one rank, a view
    of ``source`` (no copy, no message); otherwise ``panel[:stop - start]``,
    each piece filled by ``Bcast`` from its owner.
    """
    if comm.size == 1:
        return source[start:stop]
    my_offset = block_offsets(length, comm.size)[my_index]
    for owner, lo, hi in _pieces(start, stop, length, comm.size):
        if owner == my_index:
            panel[lo - start:hi - start] = source[lo - my_offset:hi - my_offset]
        comm.Bcast(panel[lo - start:hi - start], root=owner)
    return panel[:stop - start]


def gemm_summa(A, B, panel=256, timings=None):
    """``C = A B`` by SUMMA on a ``pr x pc`` grid, ``panel`` columns of A at a time.

    For each panel ``[k0, k0 + panel)`` of the inner dimension, the ranks owning
    those columns of A broadcast them along grid rows and the ranks owning
    those rows of B broadcast them along grid columns; a panel crossing a block
    boundary is assembled from one ``Bcast`` per owner. The A panel is kept
    transposed so every piece is contiguous. Along a grid axis of one rank the
    panel is a view of the local block (no broadcast).

    Parameters
    ----------
    A : DistMatrix on a 2D ProcessGrid, global ``m x k``, local ``m_i x k_j``
    B : DistMatrix on the same grid, global ``k x n``, local ``k_i x n_j``
    panel : int
        Panel width ``b >= 1``; need not divide the block sizes.
    timings : dict, optional
        ``"comm"`` and ``"compute"`` seconds are added to it.

    Returns
    -------
    DistMatrix on the grid, global ``m x n``, local ``m_i x n_j``.

    Notes
    -----
    ``ceil(k / b) + pc`` broadcasts of A pieces and ``ceil(k / b) + pr`` of B
    pieces at most:
    ``(ceil(k / b) + pc) log2(pc) alpha + m k / pr log2(pc) beta``
    ``+ (ceil(k / b) + pr) log2(pr) alpha + k n / pc log2(pr) beta``;
    extra memory ``b (m / pr + n / pc)`` words.
    """
    m, n = check_product(A, B, "gemm_summa")
    if A.grid is None or len(A.grid.dims) != 2:
        raise InputError("gemm_summa needs A and B on a 2D ProcessGrid")
    if not isinstance(panel, int) or panel < 1:
        raise InputError(f"gemm_summa: panel width must be an integer >= 1, got {panel!r}")
    grid, k = A.grid, A.shape[1]
    i, j = grid.coords
    xp = array_module(A.local)
    product = xp.zeros((A.local.shape[0], B.local.shape[1]), dtype=accumulator(A.dtype))
    width = max(1, min(panel, k))
    a_panel_t = xp.empty((width, A.local.shape[0]), dtype=A.dtype) if grid.row_comm.size > 1 else None
    b_panel = xp.empty((width, B.local.shape[1]), dtype=A.dtype) if grid.col_comm.size > 1 else None
    for start in range(0, k, width):
        stop = min(start + width, k)
        with timed(timings, "comm"):
            a_t = _broadcast_panel(grid.row_comm, a_panel_t, A.local.T, start, stop, k, j)
            b = _broadcast_panel(grid.col_comm, b_panel, B.local, start, stop, k, i)
        with timed(timings, "compute", xp):
            accumulate_product(product, a_t.T, b)
    return DistMatrix(A.comm, product.astype(A.dtype, copy=False), (m, n), grid)


def _blas_operand(x):
    """``(array, trans)`` handing ``x`` to BLAS without a copy when ``x`` or ``x.T`` is Fortran-ordered."""
    return (x, 0) if x.flags.f_contiguous else (x.T, 1)


def accumulate_product(c, a, b):
    """``c += a @ b`` in place; ``a`` and ``b`` are converted to ``c``'s type first.

    For BLAS types, one GEMM with beta = 1 (no temporary, one pass over ``c``):
    ``c`` (m x n) is C-ordered, so it is updated as the Fortran-ordered ``c.T``:
    ``c.T += b.T @ a.T``; an operand that is C-ordered (or the transposed view of
    a C-ordered array) goes to BLAS as it is, with the matching transpose flag.
    Other types (integers) by NumPy's ``matmul`` and an in-place add: SciPy's BLAS
    wrapper would convert ``c`` to a float copy and update only that. Device
    arrays likewise by their module's ``matmul`` (cuBLAS, as CuPy's reference
    ``matmul`` computes, TF32 included) and an in-place add: one more pass over
    ``c`` per call.
    """
    if c.size == 0 or a.shape[1] == 0:
        return
    a, b = a.astype(c.dtype, copy=False), b.astype(c.dtype, copy=False)
    if c.dtype.char not in BLAS_TYPES or array_module(c) is not np:
        c += a @ b
        return
    (left, trans_left), (right, trans_right) = _blas_operand(b.T), _blas_operand(a.T)
    gemm = get_blas_funcs("gemm", (c,))
    gemm(1.0, left, right, beta=1.0, c=c.T, trans_a=trans_left, trans_b=trans_right, overwrite_c=True)
