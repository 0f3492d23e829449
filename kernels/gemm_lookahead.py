"""SUMMA with look-ahead and Cannon with overlapped shifts: communication hidden behind the local GEMMs.

Same operands, results and element-type rules as `kernels.gemm_summa.gemm_summa`
and `kernels.gemm_cannon.gemm_cannon` (see `kernels.gemm`): blocks travel in their
own type, C is accumulated in `kernels.dtypes.accumulator` (float16 in float32,
integers exactly by NumPy) and rounded to A's type once.

While the local GEMM multiplies the current panels (blocks), the next ones are
already on their way (``Ibcast`` for SUMMA, ``Isend`` / ``Irecv`` for Cannon), as
HPL's and Elemental's look-ahead do. MPI moves data only inside MPI calls (MPICH
has no progress thread by default; an 8 MB ``Ibcast`` left alone during a GEMM
completes only in the final ``Wait``), so each variant makes MPI calls while it
computes: SUMMA keeps ``lookahead`` panels in flight (``lookahead + 1`` buffers),
so the broadcast of a panel spans ``lookahead`` GEMMs with the next posts and
waits in between; Cannon splits each block GEMM along the inner dimension (free
for BLAS, whose kernels walk the inner dimension in 256-wide blocks anyway) and
calls ``Testall`` between the pieces. With ``timings``, ``"comm"`` is the
*exposed* communication: the time spent posting requests, testing and waiting
for them (what the computation did not hide); ``"compute"`` is the local GEMMs
and the copies into buffers.
"""
from collections import deque

from mpi4py import MPI

from kernels.backend import array_module
from kernels.comm.device import poll_all, wait_all
from kernels.distmatrix import DistMatrix, timed
from kernels.distribution import block_counts, block_offsets, block_range
from kernels.dtypes import accumulator
from kernels.errors import InputError
from kernels.gemm_cannon import shift
from kernels.gemm_checks import check_product, square_grid
from kernels.gemm_summa import accumulate_product, owner_of


def summa_panels(k, width, row_parts, col_parts):
    """Panels ``(lo, hi, a_owner, b_owner)`` covering ``[0, k)``, none crossing a block boundary.

    The inner dimension is cut at the block boundaries of both splits (A's columns
    over ``col_parts``, B's rows over ``row_parts``); each segment between cuts is
    split by `block_range` into ``ceil(length / width)`` panels of at most ``width``.
    ``a_owner`` is the grid column holding A's columns ``[lo, hi)``, ``b_owner`` the
    grid row holding B's rows.
    """
    cuts = sorted(set(block_offsets(k, col_parts)) | set(block_offsets(k, row_parts)) | {k})
    panels = []
    for start, stop in zip(cuts, cuts[1:]):
        pieces = -(-(stop - start) // width)
        for piece in range(pieces):
            lo, hi = (start + bound for bound in block_range(stop - start, pieces, piece))
            panels.append((lo, hi, owner_of(lo, k, col_parts), owner_of(lo, k, row_parts)))
    return panels


def gemm_summa_lookahead(A, B, panel=256, timings=None, lookahead=2, node_blocks=(None, None)):
    """``C = A B`` by SUMMA with look-ahead on a ``pr x pc`` grid.

    The panels are those of `summa_panels` (at most ``panel`` wide, within one
    block of A's columns and one block of B's rows), so each panel of A comes from
    one rank of the grid row and each panel of B from one rank of the grid column.
    Before multiplying panel ``t``, every rank posts the ``Ibcast`` of panel
    ``t + lookahead`` (A's along grid rows, B's along grid columns) into the buffer
    that panel ``t - 1`` has just freed, then waits for panel ``t`` (posted
    ``lookahead`` steps earlier) and multiplies it with one in-place GEMM. The owner
    of B's panel broadcasts it straight from its block; A's panel is copied into a
    row-major buffer first (rows of A, contiguous). An operand whose blocks are in
    node-shared memory (``node_blocks``, from `kernels.node_shared.share_on_node`)
    sends nothing and waits for nothing: each panel is a view of its owner's block,
    read in place (the ranks' writes to those blocks are fenced by
    `kernels.node_shared.NodeBlocks.writing`, not here).

    Parameters
    ----------
    A : DistMatrix on a 2D ProcessGrid, global ``m x k``, local ``m_i x k_j``
    B : DistMatrix on the same grid, global ``k x n``, local ``k_i x n_j``
    panel : int
        Largest panel width ``b >= 1``; need not divide the block sizes.
    timings : dict, optional
        ``"comm"`` (exposed: posting and waiting) and ``"compute"`` seconds are added to it.
    lookahead : int
        Panels in flight ``d >= 1`` (``d + 1`` buffers per operand). With ``d = 1``
        MPI is called only between GEMMs, so a broadcast progresses only while
        the ranks post and wait; ``d = 2`` gives it one call mid-way.
    node_blocks : pair of NodeBlocks or None
        ``(A's blocks over the grid row, B's over the grid column)`` when they were
        moved into node-shared memory by `kernels.node_shared.share_on_node`
        (None: broadcast that operand's panels).

    Returns
    -------
    DistMatrix on the grid, global ``m x n``, local ``m_i x n_j``.

    Notes
    -----
    At most ``ceil(k / b) + pr + pc`` panels, one ``Ibcast`` of A along each grid
    row and one of B along each grid column per panel:
    ``(ceil(k / b) + pr + pc) (log2(pc) + log2(pr)) alpha + (m k / pr log2(pc) + k n / pc log2(pr)) beta``
    (binomial tree), the same words as `gemm_summa`; exposed only where a panel's
    broadcast outlasts the ``d`` GEMMs before it is needed. Extra memory
    ``(d + 1) b (m / pr + n / pc)`` words. An operand in node-shared memory
    costs no message, no word and no buffer: the GEMMs read its panels from
    the owner's memory (``m k / pr`` words of A, ``k n / pc`` of B in all).
    """
    m, n = check_product(A, B, "gemm_summa_lookahead")
    if A.grid is None or len(A.grid.dims) != 2:
        raise InputError("gemm_summa_lookahead needs A and B on a 2D ProcessGrid")
    for name, value in (("panel width", panel), ("look-ahead", lookahead)):
        if not isinstance(value, int) or value < 1:
            raise InputError(f"gemm_summa_lookahead: {name} must be an integer >= 1, got {value!r}")
    grid, k = A.grid, A.shape[1]
    i, j = grid.coords
    rows, cols = A.local.shape[0], B.local.shape[1]
    a_offset, b_offset = A.col_range[0], B.row_range[0]
    xp = array_module(A.local)
    product = xp.zeros((rows, cols), dtype=accumulator(A.dtype))
    width = max(1, min(panel, k))
    a_shared, b_shared = _check_shared(node_blocks, A, B, grid)
    a_offsets, b_offsets = block_offsets(k, grid.dims[1]), block_offsets(k, grid.dims[0])
    a_buffers = [xp.empty(rows * width, A.dtype) for _ in range(0 if a_shared else lookahead + 1)]
    b_buffers = [xp.empty((width, cols), A.dtype) for _ in range(0 if b_shared else lookahead + 1)]
    panels = summa_panels(k, width, grid.dims[0], grid.dims[1])

    def post(index):
        """Post panel ``index`` into buffer ``index mod (d + 1)``: ``(a_panel, b_panel, requests)``."""
        lo, hi, a_owner, b_owner = panels[index]
        slot = index % (lookahead + 1)
        if a_shared:
            a = a_shared.blocks[a_owner][:, lo - a_offsets[a_owner]:hi - a_offsets[a_owner]]
        else:
            a = a_buffers[slot][:rows * (hi - lo)].reshape(rows, hi - lo)
            if a_owner == j:
                with timed(timings, "compute", xp):
                    a[...] = A.local[:, lo - a_offset:hi - a_offset]
        if b_shared:
            b = b_shared.blocks[b_owner][lo - b_offsets[b_owner]:hi - b_offsets[b_owner]]
        else:
            b = B.local[lo - b_offset:hi - b_offset] if b_owner == i else b_buffers[slot][:hi - lo]
        sent = [(axis, buffer, root) for axis, buffer, root, shared in
                ((grid.row_comm, a, a_owner, a_shared), (grid.col_comm, b, b_owner, b_shared))
                if axis.size > 1 and not shared]
        with timed(timings if sent else None, "comm", xp):
            requests = [axis.Ibcast(buffer, root=root) for axis, buffer, root in sent]
        return a, b, requests

    in_flight = deque(post(index) for index in range(min(lookahead, len(panels))))
    for index in range(len(panels)):
        if index + lookahead < len(panels):
            in_flight.append(post(index + lookahead))
        a, b, requests = in_flight.popleft()
        with timed(timings if requests else None, "comm", xp):
            wait_all(requests)
        with timed(timings, "compute", xp):
            accumulate_product(product, a, b)
    return DistMatrix(A.comm, product.astype(A.dtype, copy=False), (m, n), grid)


def _check_shared(node_blocks, A, B, grid):
    """``node_blocks`` as ``(a_shared, b_shared)``, each the operand's own `NodeBlocks` over its axis or None."""
    shared = tuple(node_blocks)
    for name, matrix, axis, blocks in zip("AB", (A, B), (grid.row_comm, grid.col_comm), shared):
        if blocks is not None and (MPI.Comm.Compare(blocks.comm, axis) not in (MPI.IDENT, MPI.CONGRUENT)
                                   or not blocks.blocks or blocks.blocks[axis.rank] is not matrix.local):
            raise InputError(f"gemm_summa_lookahead: the node-shared blocks given for {name} are not {name}'s "
                             f"blocks over its grid {'row' if name == 'A' else 'column'}")
    return shared


def gemm_cannon_overlap(A, B, timings=None, pieces=4):
    """``C = A B`` by Cannon's algorithm on a square ``q x q`` grid, each shift hidden behind a GEMM.

    After the initial skew (blocking: nothing to overlap yet), step ``s`` posts the
    unit shifts of the current blocks into the second pair of buffers
    (``Irecv`` / ``Isend`` along the grid row for A, the grid column for B), multiplies
    the current blocks in ``pieces`` GEMMs along the inner dimension with a
    ``Testall`` after each, then waits and swaps buffers. A's blocks are held
    transposed so every piece is contiguous; uneven blocks are zero-padded to
    ``ceil(k / q)`` inner indices, as in `gemm_cannon`.

    Parameters
    ----------
    A : DistMatrix on a q x q ProcessGrid, global ``m x k``, local ``m_i x k_j``
    B : DistMatrix on the same grid, global ``k x n``, local ``k_i x n_j``
    timings : dict, optional
        ``"comm"`` (exposed: skew, posting, testing and waiting) and ``"compute"`` seconds are added to it.
    pieces : int
        GEMMs per step ``>= 1`` (at most the padded inner size), the calls that let MPI progress.

    Returns
    -------
    DistMatrix on the grid, global ``m x n``, local ``m_i x n_j``.

    Raises
    ------
    InputError
        On a grid that is not square (e.g. 2 or 3 ranks), on every rank.

    Notes
    -----
    The words and messages of `gemm_cannon`:
    ``2 sqrt(p) alpha + (m k + k n) / sqrt(p) beta``, of which the ``q - 1`` unit
    shifts overlap the GEMMs. Extra memory: two more padded blocks,
    ``ceil(m/q) ceil(k/q) + ceil(k/q) ceil(n/q)`` words.
    """
    q = square_grid(A, B, "gemm_cannon_overlap", layered=False)
    if not isinstance(pieces, int) or pieces < 1:
        raise InputError(f"gemm_cannon_overlap: pieces must be an integer >= 1, got {pieces!r}")
    grid, k = A.grid, A.shape[1]
    i, j = grid.coords
    inner = max(block_counts(k, q))
    xp = array_module(A.local)
    with timed(timings, "compute", xp):
        a_blocks = [xp.zeros((inner, A.local.shape[0]), A.dtype) for _ in range(2)]
        b_blocks = [xp.zeros((inner, B.local.shape[1]), A.dtype) for _ in range(2)]
        a_blocks[0][:A.local.shape[1]] = A.local.T
        b_blocks[0][:B.local.shape[0]] = B.local
        product = xp.zeros((A.local.shape[0], B.local.shape[1]), dtype=accumulator(A.dtype))
    with timed(timings, "comm", xp):
        shift(grid.row_comm, a_blocks[0], j, i)
        shift(grid.col_comm, b_blocks[0], i, j)
    bounds = [block_range(inner, min(pieces, inner), piece) for piece in range(min(pieces, inner))]
    for step in range(q):
        current, following = step % 2, (step + 1) % 2
        requests = []
        if step + 1 < q:
            with timed(timings, "comm", xp):
                for axis, blocks, position in ((grid.row_comm, a_blocks, j), (grid.col_comm, b_blocks, i)):
                    requests += [axis.Irecv(blocks[following], source=(position + 1) % q),
                                 axis.Isend(blocks[current], dest=(position - 1) % q)]
        for lo, hi in bounds:
            with timed(timings, "compute", xp):
                accumulate_product(product, a_blocks[current][lo:hi].T, b_blocks[current][lo:hi])
            with timed(timings, "comm", xp):
                poll_all(requests)
        with timed(timings, "comm", xp):
            wait_all(requests)
    return DistMatrix(A.comm, product.astype(A.dtype, copy=False), (A.shape[0], B.shape[1]), grid)
