"""Distributed GEMV (row, column and 2D blocks) against NumPy."""
import itertools

import numpy as np
import pytest
from mpi4py import MPI

from kernels.distmatrix import DistMatrix
from kernels.distribution import ProcessGrid
from kernels.errors import InputError
from kernels.gemv import gemv_2d, gemv_cols, gemv_rows, vector_ranges
from tests.mpitools import combination

SHAPES = [(7, 5), (1, 1), (1, 6), (6, 1), (2, 3), (5, 0)]
DTYPES = [np.float16, np.float32, np.float64, np.complex64, np.complex128, np.int32, np.int64]
ROUTINES = {"rows": gemv_rows, "cols": gemv_cols, "grid": gemv_2d, "grid_one_row": gemv_2d,
            "grid_one_column": gemv_2d}
GRID_DIMS = {"grid": (0, 0), "grid_one_row": (1, 0), "grid_one_column": (0, 1)}


@pytest.fixture(params=sorted(ROUTINES))
def layout_name(request):
    return request.param


def layout_of(comm, name):
    return ProcessGrid(comm, GRID_DIMS[name]) if name in GRID_DIMS else name


def free(layout):
    if isinstance(layout, ProcessGrid):
        layout.free()


def problem(shape, dtype):
    rng = np.random.default_rng(7)
    kind = np.dtype(dtype).kind
    if kind == "i":
        return rng.integers(-9, 10, shape).astype(dtype), rng.integers(-9, 10, shape[1]).astype(dtype)
    draw = (lambda size: rng.standard_normal(size) + 1j * rng.standard_normal(size)) if kind == "c" else (
        rng.standard_normal)
    return draw(shape).astype(dtype), draw(shape[1]).astype(dtype)


def expected_product(a, x):
    """``a @ x``: exact for integers, else in the widest type of the kind."""
    if a.dtype.kind == "i":
        return a @ x
    wide = np.complex128 if a.dtype.kind == "c" else np.float64
    return a.astype(wide) @ x.astype(wide)


@pytest.mark.mpi(min_size=1)
def test_gemv_matches_numpy(comm, layout_name):
    for shape, dtype in itertools.product(SHAPES, DTYPES):
        with combination(layout_name, shape, dtype):
            layout = layout_of(comm, layout_name)
            a, x = problem(shape, dtype)
            A = DistMatrix.from_global(comm, a, layout)
            x_range, y_range = vector_ranges(A)
            timings = {}
            y = ROUTINES[layout_name](A, x[slice(*x_range)], timings=timings)
            assert_y(comm, a, x, y, y_range)
            assert set(timings) == {"comm", "compute"}
            free(layout)


def assert_y(comm, a, x, y, y_range):
    """``y`` (on the host) is this rank's block ``y_range`` of ``a @ x``, within rounding, on every rank."""
    expected = expected_product(a, x)[slice(*y_range)]
    scale = 1 + np.abs(a).sum(axis=1).max(initial=0) * np.abs(x).max(initial=0)
    tolerance = 0 if a.dtype.kind == "i" else 10 * np.finfo(a.dtype).eps * max(a.shape[1], 1) * scale
    error = float(np.max(np.abs(y - expected), initial=0))
    assert y.dtype == a.dtype and y.shape == expected.shape
    assert comm.allreduce(error, op=MPI.MAX) <= tolerance


@pytest.mark.mpi(min_size=1)
def test_gemv_of_device_blocks_matches_numpy(comm, device_backend, layout_name):
    device_comm = device_backend.comm(comm)
    for shape, dtype in itertools.product(SHAPES, DTYPES):
        with combination(layout_name, shape, dtype):
            layout = layout_of(device_comm, layout_name)
            a, x = problem(shape, dtype)
            on_host = DistMatrix.from_global(device_comm, a, layout)
            A = DistMatrix(device_comm, device_backend.from_host(on_host.local), a.shape, layout)
            x_range, y_range = vector_ranges(A)
            y = ROUTINES[layout_name](A, device_backend.from_host(x[slice(*x_range)]), timings={})
            assert comm.allreduce(int(not device_backend.is_device_array(y))) == 0
            assert_y(comm, a, x, device_backend.to_host(y), y_range)
            with pytest.raises(TypeError, match="both"):
                ROUTINES[layout_name](A, x[slice(*x_range)])
            free(layout)


@pytest.mark.mpi(min_size=1)
def test_float16_partial_sums_beyond_65504_cancel(comm, layout_name):
    # Split over 2-4 column blocks, a rank's partial sum of a row (up to 120000) exceeds float16.
    layout = layout_of(comm, layout_name)
    a = np.array([[6e4, 6e4, -6e4, -6e4], [6e4, -6e4, 6e4, -6e4]], np.float16)
    x = np.ones(4, np.float16)
    A = DistMatrix.from_global(comm, a, layout)
    x_range, y_range = vector_ranges(A)
    y = ROUTINES[layout_name](A, x[slice(*x_range)])
    assert y.dtype == np.float16
    assert comm.allreduce(int(not np.array_equal(y, (a @ x)[slice(*y_range)]))) == 0
    free(layout)


@pytest.mark.mpi(min_size=1)
def test_unsupported_dtypes_are_refused_on_every_rank(comm, layout_name):
    for dtype in [np.bool_, np.int8, np.uint64, np.longdouble]:
        with combination(layout_name, dtype):
            layout = layout_of(comm, layout_name)
            A = DistMatrix.zeros(comm, (4, 5), layout, dtype)
            x_range, _ = vector_ranges(A)
            with pytest.raises(TypeError, match="not supported"):
                ROUTINES[layout_name](A, np.zeros(x_range[1] - x_range[0], dtype))
            free(layout)


@pytest.mark.mpi(min_size=1)
def test_vector_ranges_split_x_and_y_over_all_ranks(comm, layout_name):
    for shape in [(7, 5), (2, 3)]:
        with combination(layout_name, shape):
            layout = layout_of(comm, layout_name)
            A = DistMatrix.zeros(comm, shape, layout)
            for length, ranges in zip(shape[::-1], zip(*comm.allgather(vector_ranges(A)))):
                covered = sorted(index for start, stop in ranges for index in range(start, stop))
                assert covered == list(range(length))
            free(layout)


@pytest.mark.mpi(min_size=1)
def test_x_of_the_wrong_length_is_an_input_error(comm, layout_name):
    layout = layout_of(comm, layout_name)
    A = DistMatrix.zeros(comm, (4, 5), layout)
    x_range, _ = vector_ranges(A)
    too_long = np.zeros(x_range[1] - x_range[0] + 1)
    with pytest.raises(InputError, match="length"):
        ROUTINES[layout_name](A, too_long)
    with pytest.raises(InputError, match="dtype"):
        ROUTINES[layout_name](A, np.zeros(x_range[1] - x_range[0], np.float32))
    free(layout)


@pytest.mark.mpi(min_size=1)
def test_a_matrix_in_another_layout_is_an_input_error(comm):
    grid = ProcessGrid(comm)
    on_grid = DistMatrix.zeros(comm, (4, 5), grid)
    in_rows = DistMatrix.zeros(comm, (4, 5), "rows")
    with pytest.raises(InputError, match="'rows' layout"):
        gemv_rows(on_grid, np.zeros(1))
    with pytest.raises(InputError, match="'cols' layout"):
        gemv_cols(in_rows, np.zeros(1))
    with pytest.raises(InputError, match="2D ProcessGrid"):
        gemv_2d(in_rows, np.zeros(1))
    with pytest.raises(InputError, match="DistMatrix"):
        gemv_rows(np.zeros((4, 5)), np.zeros(5))
    grid.free()
