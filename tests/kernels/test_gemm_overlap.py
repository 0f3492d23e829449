"""SUMMA with look-ahead and Cannon with overlapped shifts: the results of the plain versions and of ``a @ b``."""
import itertools
import math

import numpy as np
import pytest
from mpi4py import MPI

from kernels.distmatrix import DistMatrix
from kernels.distribution import ProcessGrid, block_offsets
from kernels.errors import InputError
from kernels.gemm import gemm_cannon, gemm_cannon_overlap, gemm_summa, gemm_summa_lookahead
from kernels.gemm_lookahead import summa_panels
from tests.kernels.test_gemm import (DTYPES, SIZES, assert_product, grid,  # noqa: F401 (fixture)
                                     operands)
from tests.mpitools import combination

# Sizes large enough for several panels and steps on 4 ranks, none dividing evenly.
UNEVEN = SIZES + [(23, 31, 17), (10, 13, 11)]


def integer_valued(size, dtype, seed=5):
    """Operands with small integer values: every sum is exact, so any order gives the same bits."""
    m, k, n = size
    rng = np.random.default_rng(seed)
    return rng.integers(-4, 5, (m, k)).astype(dtype), rng.integers(-4, 5, (k, n)).astype(dtype)


def same_bits(comm, layout, a, b, plain, overlapped):
    """True on every rank when ``overlapped`` gives the bits of ``plain`` and of ``a @ b`` on every block."""
    A, B = DistMatrix.from_global(comm, a, layout), DistMatrix.from_global(comm, b, layout)
    C, D = plain(A, B), overlapped(A, B)
    expected = (a @ b)[C.row_slice, C.col_slice]
    same = (C.dtype == D.dtype == a.dtype and np.array_equal(C.local, D.local)
            and np.array_equal(D.local, expected.astype(a.dtype)))
    return comm.allreduce(int(not same), op=MPI.SUM) == 0


@pytest.mark.parametrize("k, width, row_parts, col_parts", [
    (9, 2, 2, 3), (9, 4, 4, 1), (4097, 256, 2, 1), (5, 1000, 3, 4), (2, 3, 4, 4), (0, 1, 2, 2), (31, 7, 3, 2)])
def test_summa_panels_tile_the_inner_dimension_within_blocks(k, width, row_parts, col_parts):
    panels = summa_panels(k, max(1, min(width, k)), row_parts, col_parts)
    starts, stops = [lo for lo, *_ in panels], [hi for _, hi, *_ in panels]
    assert starts == [0] + stops[:-1] and stops[-1:] == [k] if k else panels == []
    assert len(panels) <= -(-k // width) + row_parts + col_parts
    for lo, hi, a_owner, b_owner in panels:
        assert 1 <= hi - lo <= width
        for parts, owner in ((col_parts, a_owner), (row_parts, b_owner)):
            bounds = block_offsets(k, parts) + [k]
            assert bounds[owner] <= lo and hi <= bounds[owner + 1]


@pytest.mark.mpi(min_size=1)
def test_summa_lookahead_matches_numpy(comm, grid):
    for size, dtype, lookahead in itertools.product(UNEVEN, DTYPES, [1, 2, 3]):
        with combination("grid", grid.dims, size, dtype, "lookahead", lookahead):
            a, b = operands(size, dtype)
            assert_product(comm, a, b, grid, lambda A, B, t: gemm_summa_lookahead(A, B, 2, t, lookahead=lookahead))


@pytest.mark.mpi(min_size=1)
def test_summa_lookahead_gives_the_bits_of_summa(comm, grid):
    for dtype, panel in itertools.product(DTYPES, [1, 3, 4, 1000]):
        with combination("grid", grid.dims, dtype, "panel", panel):
            a, b = integer_valued((23, 31, 17), dtype)
            assert same_bits(comm, grid, a, b, lambda A, B: gemm_summa(A, B, panel),
                             lambda A, B: gemm_summa_lookahead(A, B, panel))


@pytest.mark.mpi(min_size=1)
def test_cannon_overlap_matches_numpy_on_square_rank_counts_and_refuses_others(comm):
    for size, dtype, pieces in itertools.product(UNEVEN, DTYPES, [1, 2, 4, 100]):
        with combination(size, dtype, "pieces", pieces):
            grid = ProcessGrid(comm)
            a, b = operands(size, dtype)

            def multiply(A, B, timings):
                return gemm_cannon_overlap(A, B, timings, pieces=pieces)
            if math.isqrt(comm.size) ** 2 == comm.size:
                assert_product(comm, a, b, grid, multiply)
                x, y = integer_valued(size, dtype)
                assert same_bits(comm, grid, x, y, gemm_cannon, lambda A, B: multiply(A, B, None))
            else:
                with pytest.raises(InputError, match="square"):
                    assert_product(comm, a, b, grid, multiply)
            grid.free()


@pytest.mark.mpi(min_size=1)
def test_exposed_communication_is_part_of_the_time(comm, grid):
    a, b = operands((23, 31, 17), np.float64)
    A, B = DistMatrix.from_global(comm, a, grid), DistMatrix.from_global(comm, b, grid)
    timings = {}
    gemm_summa_lookahead(A, B, 4, timings)
    ok = set(timings) == {"comm", "compute"} and min(timings.values()) >= 0
    assert comm.allreduce(int(not ok), op=MPI.SUM) == 0


@pytest.mark.mpi(min_size=1)
def test_bad_panel_lookahead_and_pieces_are_input_errors(comm, grid):
    a, b = operands((4, 3, 2), np.float64)
    A, B = DistMatrix.from_global(comm, a, grid), DistMatrix.from_global(comm, b, grid)
    for value in [0, -1, 1.5]:
        with combination("grid", grid.dims, "value", value):
            with pytest.raises(InputError, match="panel width"):
                gemm_summa_lookahead(A, B, panel=value)
            with pytest.raises(InputError, match="look-ahead"):
                gemm_summa_lookahead(A, B, lookahead=value)
            if grid.dims[0] == grid.dims[1]:
                with pytest.raises(InputError, match="pieces"):
                    gemm_cannon_overlap(A, B, pieces=value)
    rows_a, rows_b = DistMatrix.from_global(comm, a, "rows"), DistMatrix.from_global(comm, b, "rows")
    with pytest.raises(InputError, match="2D ProcessGrid"):
        gemm_summa_lookahead(rows_a, rows_b)
