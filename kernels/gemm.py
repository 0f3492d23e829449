"""Distributed GEMM ``C = A B``: 1D row blocks, SUMMA, Cannon and 2.5D.

``A`` is ``m x k``, ``B`` is ``k x n`` and ``C`` is ``m x n``, all `DistMatrix`
objects with the same layout; the serial reference is ``A @ B``. Costs are per
rank with ``alpha`` per message and ``beta`` per word (binomial-tree ``Bcast``
and ring ``Allgatherv`` assumed); every routine does ``2 m n k / p`` flops
(Cannon and 2.5D slightly more when blocks are padded).
"""
import math
from bisect import bisect_right

import numpy as np
from scipy.linalg.blas import get_blas_funcs
from mpi4py import MPI

from kernels.distmatrix import DistMatrix, require_same_layout, timed
from kernels.distribution import ProcessGrid, block_counts, block_offsets, block_range
from kernels.errors import InputError

ONE_D_VARIANTS = ("allgather", "ring")


def _check_product(A, B, what):
    require_same_layout(A, B, what)
    if A.shape[1] != B.shape[0]:
        raise InputError(f"{what}: A is {A.shape[0]}x{A.shape[1]} but B is {B.shape[0]}x{B.shape[1]}")
    return A.shape[0], B.shape[1]


def _square_grid(A, B, what, layered):
    """Side ``q`` of the ``q x q`` grid (``q x q x c`` when ``layered``) the operands live on."""
    _check_product(A, B, what)
    dims = A.grid.dims if A.grid is not None else None
    if dims is None or len(dims) != 2 + layered or dims[0] != dims[1]:
        shape = "q x q x c" if layered else "square q x q"
        square = math.isqrt(A.comm.size) ** 2 == A.comm.size
        raise InputError(f"{what} needs a {shape} ProcessGrid, got "
                         f"{'x'.join(map(str, dims)) if dims else A.layout} on {A.comm.size} ranks"
                         + ("" if square or layered else f" ({A.comm.size} is not a perfect square)"))
    return dims[0]


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
    m, n = _check_product(A, B, "gemm_1d")
    if A.layout != "rows":
        raise InputError("gemm_1d needs A, B in the 'rows' layout")
    if variant not in ONE_D_VARIANTS:
        raise InputError(f"gemm_1d: unknown variant {variant!r}; use one of {', '.join(ONE_D_VARIANTS)}")
    comm, k = A.comm, A.shape[1]
    counts, offsets = block_counts(k, comm.size), block_offsets(k, comm.size)
    C = DistMatrix.zeros((m, n), comm, "rows", A.dtype)
    if variant == "allgather":
        whole_b = np.empty((k, n), dtype=A.dtype)
        with timed(timings, "comm"):
            comm.Allgatherv(np.ascontiguousarray(B.local),
                            [whole_b, ([c * n for c in counts], [o * n for o in offsets])])
        with timed(timings, "compute"):
            np.matmul(A.local, whole_b, out=C.local)
        return C
    travelling = np.zeros((max(counts), n), dtype=A.dtype)
    travelling[:B.local.shape[0]] = B.local
    for step in range(comm.size):
        owner = (comm.rank + step) % comm.size
        with timed(timings, "compute"):
            start = offsets[owner]
            C.local += A.local[:, start:start + counts[owner]] @ travelling[:counts[owner]]
        if step < comm.size - 1:
            with timed(timings, "comm"):
                comm.Sendrecv_replace(travelling, dest=(comm.rank - 1) % comm.size,
                                      source=(comm.rank + 1) % comm.size)
    return C


def _pieces(start, stop, length, parts):
    """Split ``[start, stop)`` at the block boundaries of ``length`` items in ``parts``.

    Yields ``(owner, lo, hi)``: global range ``[lo, hi)`` lies in block ``owner``.
    """
    offsets = block_offsets(length, parts) + [length]
    lo = start
    while lo < stop:
        owner = bisect_right(offsets, lo) - 1
        hi = min(stop, offsets[owner + 1])
        yield owner, lo, hi
        lo = hi


def _broadcast_panel(panel, source, start, stop, length, comm, my_index):
    """Fill ``panel`` with the rows ``[start, stop)`` of the k-blocks that ``comm``'s ranks own.

    ``source`` is this rank's k-block, one row per k index; each piece comes
    from its owner by ``Bcast``.
    """
    my_offset = block_offsets(length, comm.size)[my_index]
    for owner, lo, hi in _pieces(start, stop, length, comm.size):
        if owner == my_index:
            panel[lo - start:hi - start] = source[lo - my_offset:hi - my_offset]
        comm.Bcast(panel[lo - start:hi - start], root=owner)


def gemm_summa(A, B, panel=256, timings=None):
    """``C = A B`` by SUMMA on a ``pr x pc`` grid, ``panel`` columns of A at a time.

    For each panel ``[k0, k0 + panel)`` of the inner dimension, the ranks owning
    those columns of A broadcast them along grid rows and the ranks owning
    those rows of B broadcast them along grid columns; a panel crossing a block
    boundary is assembled from one ``Bcast`` per owner. The A panel is kept
    transposed so every piece is contiguous.

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
    m, n = _check_product(A, B, "gemm_summa")
    if A.grid is None or len(A.grid.dims) != 2:
        raise InputError("gemm_summa needs A and B on a 2D ProcessGrid")
    if not isinstance(panel, int) or panel < 1:
        raise InputError(f"gemm_summa: panel width must be an integer >= 1, got {panel!r}")
    grid, k = A.grid, A.shape[1]
    i, j = grid.coords
    C = DistMatrix.zeros((m, n), A.comm, grid, A.dtype)
    width = max(1, min(panel, k))
    a_panel_t = np.empty((width, A.local.shape[0]), dtype=A.dtype)
    b_panel = np.empty((width, B.local.shape[1]), dtype=A.dtype)
    for start in range(0, k, width):
        stop = min(start + width, k)
        with timed(timings, "comm"):
            _broadcast_panel(a_panel_t, A.local.T, start, stop, k, grid.row_comm, j)
            _broadcast_panel(b_panel, B.local, start, stop, k, grid.col_comm, i)
        with timed(timings, "compute"):
            _accumulate_product(C.local, a_panel_t[:stop - start], b_panel[:stop - start])
    return C


def _accumulate_product(c, a_t, b):
    """``c += a_t.T @ b`` in place by one BLAS GEMM with beta = 1 (no temporary, one pass over ``c``).

    ``c`` (m x n) is C-ordered, so it is updated as the Fortran-ordered ``c.T``:
    ``c.T += b.T @ a_t``, where ``b.T`` and ``a_t.T`` are Fortran-ordered views.
    """
    if c.size == 0 or a_t.shape[0] == 0:
        return
    gemm = get_blas_funcs("gemm", (c,))
    gemm(1.0, b.T, a_t.T, beta=1.0, c=c.T, trans_b=1, overwrite_c=True)


def _shift(buffer, comm, position, distance):
    """Cyclic shift towards lower positions by ``distance`` over ``comm`` (``Sendrecv_replace``)."""
    distance %= comm.size
    if distance:
        comm.Sendrecv_replace(buffer, dest=(position - distance) % comm.size,
                              source=(position + distance) % comm.size)


def _cannon_steps(A, B, q, first_step, steps, timings):
    """``steps`` of Cannon's algorithm from ``first_step`` on one ``q x q`` layer.

    Returns this rank's sum over those steps of ``A(i, s) B(s, j)``, ``s = i + j + step mod q``.
    Blocks are zero-padded to ``ceil(k / q)`` inner indices so all shifted blocks share a shape.
    """
    grid, k = A.grid, A.shape[1]
    i, j = grid.coords[:2]
    inner = max(block_counts(k, q))
    a_block = np.zeros((A.local.shape[0], inner), dtype=A.dtype)
    a_block[:, :A.local.shape[1]] = A.local
    b_block = np.zeros((inner, B.local.shape[1]), dtype=A.dtype)
    b_block[:B.local.shape[0]] = B.local
    product = np.zeros((A.local.shape[0], B.local.shape[1]), dtype=A.dtype)
    for step in range(steps):
        with timed(timings, "comm"):
            _shift(a_block, grid.row_comm, j, i + first_step if step == 0 else 1)
            _shift(b_block, grid.col_comm, i, j + first_step if step == 0 else 1)
        with timed(timings, "compute"):
            product += a_block @ b_block
    return product


def gemm_cannon(A, B, timings=None):
    """``C = A B`` by Cannon's algorithm on a square ``q x q`` grid.

    After the initial skew (row ``i`` of A shifts left by ``i``, column ``j`` of B
    up by ``j``), ``q`` rounds of local GEMM and unit periodic shifts with
    ``Sendrecv_replace``. Uneven blocks are zero-padded to the largest block.

    Parameters
    ----------
    A : DistMatrix on a q x q ProcessGrid, global ``m x k``, local ``m_i x k_j``
    B : DistMatrix on the same grid, global ``k x n``, local ``k_i x n_j``
    timings : dict, optional
        ``"comm"`` and ``"compute"`` seconds are added to it.

    Returns
    -------
    DistMatrix on the grid, global ``m x n``, local ``m_i x n_j``.

    Raises
    ------
    InputError
        On a grid that is not square (e.g. 2 or 3 ranks), on every rank.

    Notes
    -----
    ``2 q`` shifts (skew included) of ``ceil(m/q) ceil(k/q)`` and
    ``ceil(k/q) ceil(n/q)`` words: ``2 sqrt(p) alpha + (m k + k n) / sqrt(p) beta``.
    """
    q = _square_grid(A, B, "gemm_cannon", layered=False)
    product = _cannon_steps(A, B, q, 0, q, timings)
    return DistMatrix(product, (A.shape[0], B.shape[1]), A.comm, A.grid)


def grid_25d(comm, replicas):
    """The ``q x q x c`` ProcessGrid for 2.5D GEMM with ``c = replicas`` (``q = sqrt(p / c)``).

    Raises InputError when ``c`` does not divide ``p`` or ``p / c`` is not a perfect square.
    """
    if not isinstance(replicas, int) or replicas < 1 or comm.size % replicas:
        raise InputError(f"2.5D GEMM: {replicas!r} replicas do not divide {comm.size} ranks")
    q = math.isqrt(comm.size // replicas)
    if q * q != comm.size // replicas:
        raise InputError(f"2.5D GEMM: {comm.size} ranks / {replicas} replicas = "
                         f"{comm.size // replicas} is not a perfect square")
    return ProcessGrid(comm, (q, q, replicas))


def gemm_25d(A, B, timings=None):
    """``C = A B`` by the 2.5D algorithm on a ``q x q x c`` grid (see `grid_25d`).

    Every layer holds a copy of A and B (replicated `DistMatrix` on a 3D grid).
    Layer ``l`` runs Cannon steps ``block_range(q, c, l)`` (none when ``c > q``),
    then an ``Allreduce`` along the depth axis sums the layers' partial products,
    so C is replicated on every layer too.

    Parameters
    ----------
    A : DistMatrix on a (q, q, c) ProcessGrid, global ``m x k``, local ``m_i x k_j``
    B : DistMatrix on the same grid, global ``k x n``, local ``k_i x n_j``
    timings : dict, optional
        ``"comm"`` and ``"compute"`` seconds are added to it.

    Returns
    -------
    DistMatrix on the grid, global ``m x n``, local ``m_i x n_j`` on every layer.

    Notes
    -----
    With ``s = ceil(q / c)`` steps per layer: ``2 s`` shifts,
    ``2 s alpha + s (m k + k n) / q^2 beta``, plus the depth ``Allreduce`` of
    ``m n / q^2`` words: ``2 log2(c) alpha + 2 (c - 1) / c m n / q^2 beta``.
    Flops per rank ``2 m n k s / q^3``.
    """
    q = _square_grid(A, B, "gemm_25d", layered=True)
    depth_comm = A.grid.axis_comms[2]
    first, last = block_range(q, depth_comm.size, depth_comm.rank)
    product = _cannon_steps(A, B, q, first, last - first, timings)
    with timed(timings, "comm"):
        depth_comm.Allreduce(MPI.IN_PLACE, product, op=MPI.SUM)
    return DistMatrix(product, (A.shape[0], B.shape[1]), A.comm, A.grid)
