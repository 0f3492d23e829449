"""Distributed GEMV ``y = A x`` with row blocks, column blocks and 2D blocks of A.

``A`` is an ``m x n`` `DistMatrix`; ``x`` and ``y`` are local 1D blocks whose
global ranges `vector_ranges` gives for each layout. The serial reference is
``A @ x``. Costs are per rank with ``alpha`` per message and ``beta`` per word;
ring-based collectives are assumed for ``Allgatherv`` and ``Reduce_scatter``.

Element types: those of `kernels.dtypes.SUPPORTED` (others raise TypeError).
``x`` travels in its own type; products and partial sums of ``y`` are formed and
reduced in `kernels.dtypes.accumulator` (float16 in float32, through a float32
copy of the local block) and ``y`` is rounded to A's type once, so partial sums
beyond 65504 cannot overflow a float16 result that fits; integers are exact
(wrapping as NumPy's ``A @ x`` does).

Device blocks (CuPy): A's block and ``x`` on the device, A's communicator the
backend's wrapper (`kernels.backend.Backend.comm`); ``y`` is returned on the
device, computed with the blocks' array module.
"""
from mpi4py import MPI

from kernels.backend import array_module
from kernels.distmatrix import DistMatrix, require_vector, timed
from kernels.distribution import block_counts, block_offsets, block_range
from kernels.dtypes import accumulator, check_dtype
from kernels.errors import InputError


def _nested_range(length, outer_parts, outer_index, inner_parts, inner_index):
    """Block ``inner_index`` of block ``outer_index``, both made by `block_range`."""
    start, stop = block_range(length, outer_parts, outer_index)
    inner_start, inner_stop = block_range(stop - start, inner_parts, inner_index)
    return start + inner_start, start + inner_stop


def vector_ranges(A):
    """Global ranges ``(x_range, y_range)`` of the ``x`` and ``y`` blocks this rank holds.

    - ``"rows"`` and ``"cols"`` layouts: rank ``r`` of ``p`` holds
      ``x[block_range(n, p, r)]`` and ``y[block_range(m, p, r)]``;
    - a ``pr x pc`` grid: the rank at ``(i, j)`` holds block ``i`` of ``pr`` inside
      column block ``j`` of ``x`` (``x`` is split over the ranks of grid column ``j``)
      and block ``j`` of ``pc`` inside row block ``i`` of ``y``.
    """
    m, n = A.shape
    if A.grid is None:
        return block_range(n, A.comm.size, A.comm.rank), block_range(m, A.comm.size, A.comm.rank)
    (rows, cols), (i, j) = A.grid.dims[:2], A.grid.coords[:2]
    return _nested_range(n, cols, j, rows, i), _nested_range(m, rows, i, cols, j)


def _check(A, x, layout, what):
    if not isinstance(A, DistMatrix):
        raise InputError(f"{what}: A must be a DistMatrix, got {type(A).__name__}")
    if layout == "grid" and (A.grid is None or len(A.grid.dims) != 2):
        raise InputError(f"{what}: A must be on a 2D ProcessGrid")
    if layout != "grid" and A.layout != layout:
        raise InputError(f"{what}: A must have the {layout!r} layout")
    check_dtype(A.dtype, what)
    x_range, y_range = vector_ranges(A)
    x = require_vector(x, x_range[1] - x_range[0], A.dtype,
                       f"{what} with A of {A.shape[1]} columns")
    xp = array_module(A.local)
    if array_module(x) is not xp:
        raise TypeError(f"{what}: x and A's block must both live on the host or both on the device")
    return x, xp.empty(y_range[1] - y_range[0], dtype=accumulator(A.dtype)), xp


def _local_product(a, x):
    """``a @ x`` in the accumulator type of ``a``'s dtype."""
    wide = accumulator(a.dtype)
    return a.astype(wide, copy=False) @ x.astype(wide, copy=False)


def _allgather(comm, block, length, xp):
    counts = block_counts(length, comm.size)
    whole = xp.empty(length, dtype=block.dtype)
    comm.Allgatherv(block, [whole, (counts, block_offsets(length, comm.size))])
    return whole


def _reduce_scatter(comm, partial, block):
    comm.Reduce_scatter(partial, block, recvcounts=block_counts(partial.size, comm.size), op=MPI.SUM)


def gemv_rows(A, x, timings=None):
    """``y = A x`` with A split in row blocks: allgather ``x``, then a local GEMV.

    Parameters
    ----------
    A : DistMatrix, layout ``"rows"``, global ``m x n``, local ``m_r x n``
    x : ndarray, local ``(n_r,)``, ``n_r = len(block_range(n, p, r))``
    timings : dict, optional
        ``"comm"`` and ``"compute"`` seconds are added to it.

    Returns
    -------
    ndarray, local ``(m_r,)``: the rows of ``y`` matching A's local rows, of A's dtype.

    Notes
    -----
    ``Allgatherv`` of ``x``: ``(p - 1) alpha + (p - 1) n / p beta``; ``2 m n / p`` flops.
    """
    x, y, xp = _check(A, x, "rows", "gemv_rows")
    with timed(timings, "comm"):
        whole_x = _allgather(A.comm, x, A.shape[1], xp)
    with timed(timings, "compute", xp):
        y[...] = _local_product(A.local, whole_x)
    return y.astype(A.dtype, copy=False)


def gemv_cols(A, x, timings=None):
    """``y = A x`` with A split in column blocks: local GEMV, then reduce-scatter ``y``.

    Parameters
    ----------
    A : DistMatrix, layout ``"cols"``, global ``m x n``, local ``m x n_r``
    x : ndarray, local ``(n_r,)``: the entries of ``x`` matching A's local columns
    timings : dict, optional
        ``"comm"`` and ``"compute"`` seconds are added to it.

    Returns
    -------
    ndarray, local ``(m_r,)``, ``m_r = len(block_range(m, p, r))``, of A's dtype.

    Notes
    -----
    ``Reduce_scatter`` of ``m`` partial sums: ``(p - 1) alpha + (p - 1) m / p beta``
    (plus the same number of additions); ``2 m n / p`` flops.
    """
    x, y, xp = _check(A, x, "cols", "gemv_cols")
    with timed(timings, "compute", xp):
        partial = _local_product(A.local, x)
    with timed(timings, "comm"):
        _reduce_scatter(A.comm, partial, y)
    return y.astype(A.dtype, copy=False)


def gemv_2d(A, x, timings=None):
    """``y = A x`` with A in 2D blocks on a ``pr x pc`` grid.

    ``x`` is spread over all ranks (see `vector_ranges`); each grid column
    allgathers its piece of ``x``, multiplies, and each grid row reduce-scatters
    its partial ``y``.

    Parameters
    ----------
    A : DistMatrix on a 2D ProcessGrid, global ``m x n``, local ``m_i x n_j``
    x : ndarray, local ``(len(vector_ranges(A)[0]),)``, about ``n / p`` entries
    timings : dict, optional
        ``"comm"`` and ``"compute"`` seconds are added to it.

    Returns
    -------
    ndarray, local ``(len(vector_ranges(A)[1]),)``, about ``m / p`` entries, of A's dtype.

    Notes
    -----
    ``Allgatherv`` over a grid column and ``Reduce_scatter`` over a grid row:
    ``(pr + pc - 2) alpha + ((pr - 1) n / p + (pc - 1) m / p) beta``; on a square
    grid about ``2 sqrt(p) alpha + (m + n) / sqrt(p) beta``; ``2 m n / p`` flops.
    """
    x, y, xp = _check(A, x, "grid", "gemv_2d")
    with timed(timings, "comm"):
        column_x = _allgather(A.grid.col_comm, x, A.local.shape[1], xp)
    with timed(timings, "compute", xp):
        partial = _local_product(A.local, column_x)
    with timed(timings, "comm"):
        _reduce_scatter(A.grid.row_comm, partial, y)
    return y.astype(A.dtype, copy=False)
