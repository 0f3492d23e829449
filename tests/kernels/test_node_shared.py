"""Blocks in node-shared memory, and SUMMA reading its panels from them in place."""
import itertools

import numpy as np
import pytest
from mpi4py import MPI

from kernels.distmatrix import DistMatrix
from kernels.errors import InputError
from kernels.gemm import gemm_summa_lookahead
from kernels.node_shared import on_one_node, share_on_node
from tests.kernels.test_gemm import DTYPES, assert_product, grid, operands  # noqa: F401 (fixture)
from tests.kernels.test_gemm_overlap import UNEVEN, integer_valued, same_bits
from tests.mpitools import combination


def everywhere(comm, condition):
    """True on every rank when ``condition`` holds on every rank."""
    return comm.allreduce(int(not condition), op=MPI.SUM) == 0


def summa_shared(A, B, timings=None, panel=2):
    """``gemm_summa_lookahead`` with A shared over grid rows and B over grid columns, then the windows freed."""
    node_blocks = (share_on_node(A, A.grid.row_comm), share_on_node(B, A.grid.col_comm))
    try:
        return gemm_summa_lookahead(A, B, panel, timings, node_blocks=node_blocks)
    finally:
        for blocks in node_blocks:
            if blocks is not None:
                blocks.free()


@pytest.mark.mpi(min_size=1)
def test_ranks_of_one_machine_are_on_one_node(comm):
    assert on_one_node(comm) and on_one_node(MPI.COMM_SELF)


@pytest.mark.mpi(min_size=1)
def test_every_rank_reads_every_block_in_place(comm):
    for dtype, shape in itertools.product([np.float16, np.float64, np.complex64, np.int32],
                                          [(7, 9), (2, 3), (0, 5), (5, 0)]):
        with combination(dtype, shape):
            values = np.arange(np.prod(shape), dtype=np.int64).reshape(shape).astype(dtype)
            A = DistMatrix.from_global(comm, values, "rows")
            blocks = share_on_node(A, comm)
            if comm.size == 1:
                assert blocks is None and everywhere(comm, np.array_equal(A.local, values))
                continue
            ok = np.array_equal(A.local, values[A.row_slice]) and A.local is blocks.blocks[comm.rank]
            ok = ok and all(block.dtype == values.dtype for block in blocks.blocks)
            ok = ok and np.array_equal(np.concatenate(blocks.blocks), values)
            blocks.free()
            assert everywhere(comm, ok)


@pytest.mark.mpi(min_size=2)
def test_writes_fenced_by_writing_are_what_every_rank_reads(comm):
    A = DistMatrix.from_global(comm, np.zeros((comm.size, 3)), "rows")
    blocks = share_on_node(A, comm)
    with blocks.writing():
        A.local[...] = comm.rank + 1
    seen = [float(block[0, 0]) for block in blocks.blocks]
    blocks.free()
    assert everywhere(comm, seen == [rank + 1.0 for rank in range(comm.size)])


@pytest.mark.mpi(min_size=1)
def test_summa_on_shared_blocks_matches_numpy(comm, grid):
    for size, dtype in itertools.product(UNEVEN, DTYPES):
        with combination("grid", grid.dims, size, dtype):
            a, b = operands(size, dtype)
            assert_product(comm, a, b, grid, summa_shared)


@pytest.mark.mpi(min_size=1)
def test_summa_on_shared_blocks_gives_the_bits_of_the_broadcast_panels(comm, grid):
    for dtype, panel in itertools.product([np.float32, np.float64, np.int64], [1, 3, 1000]):
        with combination("grid", grid.dims, dtype, "panel", panel):
            a, b = integer_valued((23, 31, 17), dtype)
            assert same_bits(comm, grid, a, b, lambda A, B: gemm_summa_lookahead(A, B, panel),
                             lambda A, B: summa_shared(A, B, panel=panel))


@pytest.mark.mpi(min_size=2)
def test_summa_on_shared_blocks_communicates_nothing_and_sees_fenced_writes(comm, grid):
    a, b = operands((11, 13, 7), np.float64)
    A, B = DistMatrix.from_global(comm, a, grid), DistMatrix.from_global(comm, b, grid)
    node_blocks = (share_on_node(A, grid.row_comm), share_on_node(B, grid.col_comm))
    timings = {}
    first = gemm_summa_lookahead(A, B, 2, timings, node_blocks=node_blocks)
    for blocks, matrix in zip(node_blocks, (A, B)):
        if blocks is None:
            matrix.local *= 2
        else:
            with blocks.writing():
                matrix.local *= 2
    second = gemm_summa_lookahead(A, B, 2, node_blocks=node_blocks)
    shared_where_needed = all((blocks is None) == (axis.size == 1)
                              for blocks, axis in zip(node_blocks, (grid.row_comm, grid.col_comm)))
    ok = shared_where_needed and timings["comm"] == 0 and np.allclose(second.local, 4 * first.local) and np.allclose(
        first.local, (a @ b)[first.row_slice, first.col_slice])
    for blocks in node_blocks:
        if blocks is not None:
            blocks.free()
    assert everywhere(comm, ok)


@pytest.mark.mpi(min_size=2)
def test_blocks_of_the_other_operand_are_input_errors(comm, grid):
    a, b = operands((5, 6, 4), np.float64)
    A, B = DistMatrix.from_global(comm, a, grid), DistMatrix.from_global(comm, b, grid)
    axis = grid.row_comm if grid.row_comm.size > 1 else grid.col_comm
    blocks = share_on_node(B, axis)
    with pytest.raises(InputError, match="node-shared blocks given for A are not A's"):
        gemm_summa_lookahead(A, B, node_blocks=(blocks, None))
    blocks.free()


@pytest.mark.mpi(min_size=1)
def test_device_blocks_are_refused(comm, device_backend):
    device_comm = device_backend.comm(comm)
    A = DistMatrix(device_comm, device_backend.from_host(np.zeros((2, 3))), (2 * comm.size, 3), "rows")
    with pytest.raises(InputError, match="host memory"):
        share_on_node(A, device_comm)
