"""Cannon's algorithm on a square ``q x q`` grid and the 2.5D algorithm on ``q x q x c``.

See `kernels.gemm` for the conventions. Shifted blocks travel in their own type;
the product is accumulated (and, in 2.5D, summed over layers) in
`kernels.dtypes.accumulator`, then rounded to A's type once.
"""
import math

from mpi4py import MPI

from kernels.backend import array_module
from kernels.distmatrix import DistMatrix, timed
from kernels.distribution import ProcessGrid, block_counts, block_range
from kernels.dtypes import accumulator
from kernels.errors import InputError
from kernels.gemm_checks import square_grid


def shift(comm, buffer, position, distance):
    """Cyclic shift towards lower positions by ``distance`` over ``comm`` (``Sendrecv_replace``)."""
    distance %= comm.size
    if distance:
        comm.Sendrecv_replace(buffer, dest=(position - distance) % comm.size,
                              source=(position + distance) % comm.size)


def _cannon_steps(A, B, q, first_step, steps, timings):
    """``steps`` of Cannon's algorithm from ``first_step`` on one ``q x q`` layer.

    Returns this rank's sum over those steps of ``A(i, s) B(s, j)``, ``s = i + j + step mod q``,
    in the accumulator type of A's dtype.
    Blocks are zero-padded to ``ceil(k / q)`` inner indices so all shifted blocks share a shape.
    """
    grid, k = A.grid, A.shape[1]
    i, j = grid.coords[:2]
    inner, xp = max(block_counts(k, q)), array_module(A.local)
    a_block = xp.zeros((A.local.shape[0], inner), dtype=A.dtype)
    a_block[:, :A.local.shape[1]] = A.local
    b_block = xp.zeros((inner, B.local.shape[1]), dtype=A.dtype)
    b_block[:B.local.shape[0]] = B.local
    wide = accumulator(A.dtype)
    product = xp.zeros((A.local.shape[0], B.local.shape[1]), dtype=wide)
    for step in range(steps):
        with timed(timings, "comm"):
            shift(grid.row_comm, a_block, j, i + first_step if step == 0 else 1)
            shift(grid.col_comm, b_block, i, j + first_step if step == 0 else 1)
        with timed(timings, "compute", xp):
            product += a_block.astype(wide, copy=False) @ b_block.astype(wide, copy=False)
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
    q = square_grid(A, B, "gemm_cannon", layered=False)
    product = _cannon_steps(A, B, q, 0, q, timings)
    return DistMatrix(A.comm, product.astype(A.dtype, copy=False), (A.shape[0], B.shape[1]), A.grid)


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
    q = square_grid(A, B, "gemm_25d", layered=True)
    depth_comm = A.grid.axis_comms[2]
    first, last = block_range(q, depth_comm.size, depth_comm.rank)
    product = _cannon_steps(A, B, q, first, last - first, timings)
    with timed(timings, "comm"):
        depth_comm.Allreduce(MPI.IN_PLACE, product, op=MPI.SUM)
    return DistMatrix(A.comm, product.astype(A.dtype, copy=False), (A.shape[0], B.shape[1]), A.grid)
