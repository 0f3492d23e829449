"""Distributed GEMM (1D, SUMMA, Cannon, 2.5D) against NumPy."""
import itertools
import math

import numpy as np
import pytest
from mpi4py import MPI

from kernels.distmatrix import DistMatrix
from kernels.distribution import ProcessGrid
from kernels.errors import InputError
from kernels.gemm import (gemm_1d, gemm_25d, gemm_cannon, gemm_cannon_overlap, gemm_summa, gemm_summa_lookahead,
                          grid_25d)
from tests.mpitools import combination

# (m, k, n): uneven splits, 1-row / 1-column / 1-inner edges, sizes below the rank count, k = 0.
SIZES = [(7, 9, 5), (1, 9, 5), (7, 1, 5), (7, 9, 1), (2, 3, 2), (3, 0, 2)]
DTYPES = [np.float16, np.float32, np.float64, np.complex64, np.complex128, np.int32, np.int64]
REFUSED = [np.bool_, np.int8, np.uint32, np.longdouble]


def operands(size, dtype):
    m, k, n = size
    rng = np.random.default_rng(11)
    kind = np.dtype(dtype).kind
    if kind == "i":
        return rng.integers(-9, 10, (m, k)).astype(dtype), rng.integers(-9, 10, (k, n)).astype(dtype)
    draw = (lambda shape: rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) if kind == "c" else (
        rng.standard_normal)
    return draw((m, k)).astype(dtype), draw((k, n)).astype(dtype)


def assert_product(comm, a, b, layout, multiply):
    """Distribute a and b, multiply, and check every rank's block of C against ``a @ b``.

    Integers must match exactly; floating types within the rounding of a sum of ``k``
    products, against ``a @ b`` computed in the widest type of their kind.
    """
    A, B = DistMatrix.from_global(comm, a, layout), DistMatrix.from_global(comm, b, layout)
    timings = {}
    C = multiply(A, B, timings)
    if a.dtype.kind == "i":
        expected, tolerance = a @ b, 0
    else:
        wide = np.complex128 if a.dtype.kind == "c" else np.float64
        expected = a.astype(wide) @ b.astype(wide)
        tolerance = 10 * np.finfo(a.dtype).eps * max(a.shape[1], 1) * (1 + np.abs(a).max(initial=0)) ** 2
    expected = expected[C.row_slice, C.col_slice]
    error = float(np.max(np.abs(C.local - expected), initial=0))
    assert C.shape == (a.shape[0], b.shape[1]) and C.dtype == a.dtype
    assert comm.allreduce(error, op=MPI.MAX) <= tolerance
    timing_keys_ok = set(timings) == {"comm", "compute"} or a.shape[1] == 0
    assert comm.allreduce(int(not timing_keys_ok), op=MPI.SUM) == 0


@pytest.fixture(params=[(0, 0), (1, 0), (0, 1)], ids=["square", "one_row", "one_column"])
def grid(request, comm):
    grid = ProcessGrid(comm, request.param)
    yield grid
    grid.free()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("variant", ["ring", "allgather"])
def test_gemm_1d_matches_numpy(comm, variant):
    for size, dtype in itertools.product(SIZES, DTYPES):
        with combination(variant, size, dtype):
            a, b = operands(size, dtype)
            assert_product(comm, a, b, "rows", lambda A, B, t: gemm_1d(A, B, variant, timings=t))


@pytest.mark.mpi(min_size=1)
def test_summa_matches_numpy(comm, grid):
    for size, dtype in itertools.product(SIZES, DTYPES):
        with combination("grid", grid.dims, size, dtype):
            a, b = operands(size, dtype)
            assert_product(comm, a, b, grid, lambda A, B, t: gemm_summa(A, B, panel=2, timings=t))


@pytest.mark.mpi(min_size=1)
def test_summa_panels_cross_block_boundaries(comm, grid):
    # k = 9 gives blocks of 5 + 4 (2 parts) or 3 + 3 + 3 or 3 + 2 + 2 + 2: panels 2, 3, 4 straddle them.
    a, b = operands((7, 9, 5), np.float64)
    for panel in [1, 2, 3, 4, 5, 9, 1000]:
        with combination("grid", grid.dims, "panel", panel):
            assert_product(comm, a, b, grid, lambda A, B, t: gemm_summa(A, B, panel=panel, timings=t))


@pytest.mark.mpi(min_size=1)
def test_cannon_matches_numpy_on_square_rank_counts_and_refuses_others(comm):
    for size, dtype in itertools.product(SIZES, DTYPES):
        with combination(size, dtype):
            grid = ProcessGrid(comm)
            a, b = operands(size, dtype)
            if math.isqrt(comm.size) ** 2 == comm.size:
                assert_product(comm, a, b, grid, lambda A, B, t: gemm_cannon(A, B, timings=t))
            else:
                with pytest.raises(InputError, match="square"):
                    assert_product(comm, a, b, grid, lambda A, B, t: gemm_cannon(A, B, timings=t))
            grid.free()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
def test_25d_matches_numpy_where_the_grid_exists(comm, replicas):
    layers = comm.size // replicas
    if comm.size % replicas or math.isqrt(layers) ** 2 != layers:
        with pytest.raises(InputError):
            grid_25d(comm, replicas)
        return
    for size, dtype in itertools.product([(7, 9, 5), (2, 3, 2), (1, 1, 1)], DTYPES):
        with combination("replicas", replicas, size, dtype):
            grid = grid_25d(comm, replicas)
            assert grid.dims == (math.isqrt(layers),) * 2 + (replicas,)
            a, b = operands(size, dtype)
            assert_product(comm, a, b, grid, lambda A, B, t: gemm_25d(A, B, timings=t))
            grid.free()


def multiply_by_every_variant(comm):
    """``(name, layout, multiply)`` for every GEMM variant that runs on ``comm``'s rank count.

    The caller frees the layouts that are ProcessGrids.
    """
    variants = [(f"1d_{v}", "rows", lambda A, B, t, v=v: gemm_1d(A, B, v, timings=t)) for v in ("ring", "allgather")]
    for dims in [(0, 0), (1, 0), (0, 1)]:
        variants.append((f"summa_{dims}", ProcessGrid(comm, dims),
                         lambda A, B, t: gemm_summa(A, B, panel=1, timings=t)))
        variants.append((f"summa_lookahead_{dims}", ProcessGrid(comm, dims),
                         lambda A, B, t: gemm_summa_lookahead(A, B, panel=1, timings=t)))
    if math.isqrt(comm.size) ** 2 == comm.size:
        variants.append(("cannon", ProcessGrid(comm), lambda A, B, t: gemm_cannon(A, B, timings=t)))
        variants.append(("cannon_overlap", ProcessGrid(comm), lambda A, B, t: gemm_cannon_overlap(A, B, timings=t)))
    for replicas in range(1, comm.size + 1):
        layers = comm.size // replicas
        if comm.size % replicas == 0 and math.isqrt(layers) ** 2 == layers:
            variants.append((f"25d_{replicas}", grid_25d(comm, replicas), lambda A, B, t: gemm_25d(A, B, timings=t)))
    return variants


@pytest.mark.mpi(min_size=1)
def test_integer_summa_of_the_issue(comm):
    # Issue 15: SUMMA returned zeros for integer matrices (BLAS updated a float copy of C).
    grid = ProcessGrid(comm)
    a, b = np.arange(6).reshape(2, 3), np.ones((3, 2), int)
    C = gemm_summa(DistMatrix.from_global(comm, a, grid), DistMatrix.from_global(comm, b, grid))
    assert C.dtype == a.dtype and comm.allreduce(int(not np.array_equal(
        C.local, np.array([[3, 3], [12, 12]])[C.row_slice, C.col_slice]))) == 0
    grid.free()


@pytest.mark.mpi(min_size=1)
def test_float16_partial_sums_beyond_65504_cancel_in_every_variant(comm):
    # On 2-4 ranks some rank's partial sum over its k-blocks (up to 120000) exceeds float16; C is 0.
    a = np.array([[6e4, 6e4, -6e4, -6e4], [6e4, -6e4, 6e4, -6e4], [6e4, 6e4, -6e4, -6e4]], np.float16)
    b = np.ones((4, 3), np.float16)
    for name, layout, multiply in multiply_by_every_variant(comm):
        A, B = DistMatrix.from_global(comm, a, layout), DistMatrix.from_global(comm, b, layout)
        C = multiply(A, B, None)
        wrong = C.dtype != np.float16 or not np.array_equal(C.local, (a @ b)[C.row_slice, C.col_slice])
        assert comm.allreduce(int(wrong)) == 0, name
        if isinstance(layout, ProcessGrid):
            layout.free()


@pytest.mark.mpi(min_size=1)
def test_unsupported_dtypes_are_refused_by_every_variant(comm):
    for dtype in REFUSED:
        for name, layout, multiply in multiply_by_every_variant(comm):
            with combination(name, dtype):
                A = DistMatrix.zeros(comm, (3, 4), layout, dtype)
                B = DistMatrix.zeros(comm, (4, 2), layout, dtype)
                with pytest.raises(TypeError, match="not supported"):
                    multiply(A, B, None)
                if isinstance(layout, ProcessGrid):
                    layout.free()


@pytest.mark.mpi(min_size=1)
def test_mismatched_operands_are_input_errors(comm, grid):
    a, b = operands((4, 3, 2), np.float64)
    A, B = DistMatrix.from_global(comm, a, grid), DistMatrix.from_global(comm, b, grid)
    with pytest.raises(InputError, match="is 4x3 but B is 4x3"):
        gemm_summa(A, A)
    with pytest.raises(InputError, match="dtypes differ"):
        gemm_summa(A, DistMatrix.from_global(comm, b.astype(np.float32), grid))
    with pytest.raises(InputError, match="panel"):
        gemm_summa(A, B, panel=0)
    with pytest.raises(InputError, match="one layout"):
        gemm_summa(A, DistMatrix.from_global(comm, b, "rows"))
    rows_a, rows_b = DistMatrix.from_global(comm, a, "rows"), DistMatrix.from_global(comm, b, "rows")
    with pytest.raises(InputError, match="unknown variant"):
        gemm_1d(rows_a, rows_b, "broadcast")
    with pytest.raises(InputError, match="2D ProcessGrid"):
        gemm_summa(rows_a, rows_b)
    with pytest.raises(InputError, match="'rows' layout"):
        gemm_1d(A, B)
    with pytest.raises(InputError, match="q x q x c"):
        gemm_25d(A, B)


@pytest.mark.mpi(min_size=1)
def test_25d_replica_counts_that_are_not_positive_integers_are_input_errors(comm):
    for replicas in [0, -1, 1.5]:
        with combination("replicas", replicas), pytest.raises(InputError, match="replicas"):
            grid_25d(comm, replicas)


# --- device blocks (the simulated GPU always; CuPy when a GPU is visible) ---

@pytest.mark.mpi(min_size=1)
def test_every_gemm_of_device_blocks_matches_numpy(comm, device_backend):
    device_comm = device_backend.comm(comm)
    for size, dtype in itertools.product([(7, 9, 5), (2, 3, 2), (3, 0, 2)], DTYPES):
        a, b = operands(size, dtype)
        for name, layout, multiply in multiply_by_every_variant(device_comm):
            with combination(name, size, dtype):
                on_device = []

                def multiply_on_device(host_a, host_b, timings):
                    A, B = (DistMatrix(device_comm, device_backend.from_host(M.local), M.shape, layout)
                            for M in (host_a, host_b))
                    C = multiply(A, B, timings)
                    on_device.append(device_backend.is_device_array(C.local))
                    return DistMatrix(comm, device_backend.to_host(C.local), C.shape, layout)

                assert_product(comm, a, b, layout, multiply_on_device)
                assert comm.allreduce(int(on_device != [True])) == 0
                if isinstance(layout, ProcessGrid):
                    layout.free()


@pytest.mark.parametrize("dims", [(1, 1), None], ids=["summa_1x1", "cannon_1x1"])
def test_gemm_of_device_blocks_on_one_rank_stages_nothing(device_backend, monkeypatch, dims):
    # SUMMA's panels on a one-rank grid axis are views of the block: no Bcast, so no copy through the host.
    staged = []
    monkeypatch.setattr(device_backend, "host_buffer", lambda *args, **kwargs: staged.append(args))
    comm = device_backend.comm(MPI.COMM_SELF)
    grid = ProcessGrid(comm, dims or (0, 0))
    a, b = operands((7, 9, 5), np.float32)
    A, B = (DistMatrix(comm, device_backend.from_host(m), m.shape, grid) for m in (a, b))
    C = gemm_summa(A, B, panel=2, timings={}) if dims else gemm_cannon(A, B, timings={})
    assert staged == [] and device_backend.is_device_array(C.local)
    assert np.max(np.abs(device_backend.to_host(C.local) - a @ b)) <= 1e-5
    grid.free()
