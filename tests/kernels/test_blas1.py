"""Distributed dot, nrm2 and axpy against NumPy, for every supported dtype."""
import itertools

import numpy as np
import pytest

from kernels.blas1 import BLAS_AXPY_TYPES, add_scaled, axpy, dot, nrm2
from kernels.distribution import block_range
from kernels.errors import InputError
from tests.mpitools import all_ranks, combination

LENGTHS = [0, 1, 3, 7, 10]   # on 2-4 ranks: uneven blocks, empty blocks, one-element blocks
DTYPES = [np.float16, np.float32, np.float64, np.complex64, np.complex128, np.int32, np.int64]
REFUSED = [np.bool_, np.int8, np.uint32, np.longdouble, np.dtype(">f8"), object]


def vector(n, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-9, 10, n).astype(dtype)
    if np.dtype(dtype).kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
    return rng.standard_normal(n).astype(dtype)


def exact(x):
    """``x`` in the widest type of its kind (integers stay integers)."""
    return x.astype({"i": np.int64, "c": np.complex128}.get(x.dtype.kind, np.float64))


def block(global_vector, comm):
    return global_vector[slice(*block_range(global_vector.size, comm.size, comm.rank))].copy()


def tolerance(dtype, n):
    """Relative rounding allowance; integers must be exact."""
    return 0 if np.dtype(dtype).kind == "i" else 10 * np.finfo(dtype).eps * max(n, 1)


@pytest.mark.mpi(min_size=1)
def test_dot_matches_numpy_on_every_rank(comm):
    for n, dtype in itertools.product(LENGTHS, DTYPES):
        with combination("n", n, dtype):
            x, y = vector(n, dtype, 1), vector(n, dtype, 2)
            timings = {}
            result = dot(comm, block(x, comm), block(y, comm), timings=timings)
            expected = np.dot(exact(x), exact(y))
            assert result.dtype == np.dot(x, y).dtype == dtype and set(timings) == {"comm", "compute"}
            assert abs(exact(np.array([result]))[0] - expected) <= tolerance(dtype, n) * (1 + np.abs(x) @ np.abs(y))
            assert comm.allgather(result) == [result] * comm.size


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("x, y", [([6e4, 6e4, -6e4, -6e4], [1, 1, 1, 1]), ([300, 300], [300, -300])],
                         ids=["partial_sums_beyond_65504", "products_beyond_65504"])
def test_float16_dot_accumulates_wider_than_float16(comm, x, y):
    # On 2 or 3 ranks a rank's partial sum (120000, or 90000) exceeds float16; the total is 0.
    x, y = np.array(x, np.float16), np.array(y, np.float16)
    result = dot(comm, block(x, comm), block(y, comm))
    assert result.dtype == np.float16 and result == np.dot(x, y) == 0


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("x, y", [(np.array([2**53 + 1, 0, 0], np.int64), np.ones(3, np.int64)),
                                  (np.full(3, 2**31 - 1, np.int32), np.ones(3, np.int32))],
                         ids=["int64_beyond_2**53", "int32_wraps"])
def test_integer_dot_is_exact(comm, x, y):
    result = dot(comm, block(x, comm), block(y, comm))
    assert result.dtype == x.dtype and result == np.dot(x, y)


@pytest.mark.mpi(min_size=1)
def test_dot_of_vectors_of_different_lengths_fails_on_every_rank(comm):
    n = 5
    # Length n + p gives every rank a block one entry longer than length n does.
    with pytest.raises(InputError, match="differ"):
        dot(comm, block(vector(n, np.float64, 1), comm), block(vector(n + comm.size, np.float64, 2), comm))
    with pytest.raises(InputError, match="differ"):
        dot(comm, block(vector(n, np.float64, 1), comm), block(vector(n, np.float32, 2), comm))


@pytest.mark.mpi(min_size=1)
def test_nrm2_matches_numpy(comm):
    for n, dtype in itertools.product(LENGTHS, DTYPES):
        with combination("n", n, dtype):
            x = vector(n, dtype, 3)
            result = nrm2(comm, block(x, comm), timings={})
            expected = np.linalg.norm(exact(x).astype(np.complex128))
            assert result.dtype == np.linalg.norm(x).dtype
            assert abs(float(result) - expected) <= tolerance(result.dtype, n) * (1 + expected)
            assert comm.allgather(result) == [result] * comm.size


@pytest.mark.mpi(min_size=1)
def test_float16_nrm2_sums_squares_wider_than_float16(comm):
    # 70000 ones per rank: every rank's float16 sum of squares would overflow; the norm fits.
    n = 70000 * comm.size
    result = nrm2(comm, block(np.ones(n, np.float16), comm))
    assert result.dtype == np.float16 and result == np.float16(np.sqrt(n))


@pytest.mark.mpi(min_size=1)
def test_nrm2_of_integers_is_the_float64_norm(comm):
    for dtype in [np.int32, np.int64]:
        for values in ([3, 4, 1], [np.iinfo(dtype).min, 0, 0]):
            with combination(dtype, values):
                x = np.array(values, dtype)
                result = nrm2(comm, block(x, comm))
                assert result.dtype == np.float64 and result == np.linalg.norm(x.astype(np.float64))


@pytest.mark.mpi(min_size=1)
def test_nrm2_of_complex_is_real(comm):
    x = np.array([3 + 4j, 0, 12j], np.complex64)
    result = nrm2(comm, block(x, comm))
    assert result.dtype == np.float32 and result == 13.0


@pytest.mark.mpi(min_size=1)
def test_nrm2_neither_overflows_nor_underflows(comm):
    n = 7
    # also either side of the bounds of the unscaled sum (largest = 2 x magnitude; float64: 6.7e-139 and, on 1-4
    # ranks of 7 entries, 3.4e153; float32: 9.1e-13 and 4.6e18)
    for dtype, magnitude in [(np.float64, 1e200), (np.float64, 1e-200), (np.float32, 1e30), (np.float32, 1e-30),
                             (np.float16, 1e4), (np.float16, 1e-6), (np.float16, 3e4), (np.float64, 3e-139),
                             (np.float64, 1e-138), (np.float64, 1e153), (np.float64, 3e153), (np.float32, 3e-13),
                             (np.float32, 1e-12), (np.float32, 1e18), (np.float32, 3e18)]:
        with combination(dtype, magnitude):
            x = (magnitude * np.linspace(1.0, 2.0, n)).astype(dtype)
            largest = np.abs(x.astype(np.float64)).max()
            expected = largest * np.sqrt(np.sum((x.astype(np.float64) / largest) ** 2))
            result = nrm2(comm, block(x, comm))
            if expected > np.finfo(dtype).max:
                assert result == np.inf    # the norm itself is beyond the type: correctly rounded to inf
            else:
                assert np.isfinite(result) and result > 0
                assert abs(float(result) - expected) <= tolerance(dtype, n) * expected


@pytest.mark.mpi(min_size=1)
def test_nrm2_of_zeros_inf_and_nan(comm):
    assert nrm2(comm, block(np.zeros(6), comm)) == 0.0
    with_inf, with_nan = np.ones(6), np.ones(6)
    with_inf[0], with_nan[0] = np.inf, np.nan
    assert nrm2(comm, block(with_inf, comm)) == np.inf
    assert np.isnan(nrm2(comm, block(with_nan, comm)))


@pytest.mark.mpi(min_size=1)
def test_axpy_matches_numpy(comm):
    for n, dtype in itertools.product(LENGTHS, DTYPES):
        with combination("n", n, dtype):
            x, y = vector(n, dtype, 4), vector(n, dtype, 5)
            alpha = {"i": 3, "c": 2.5 - 1j}.get(np.dtype(dtype).kind, 2.5)
            local_y = block(y, comm)
            result = axpy(alpha, block(x, comm), local_y, timings={})
            expected = block(alpha * exact(x) + exact(y), comm)
            assert result is local_y and result.dtype == dtype
            allowance = tolerance(dtype, 1) * (1 + np.abs(expected))
            assert comm.allreduce(int(not np.all(np.abs(exact(result) - expected) <= allowance))) == 0


def test_add_scaled_updates_y_in_place_through_blas_or_numpy():
    for dtype in DTYPES:  # BLAS's four types (one pass), NumPy's the others
        x, y = vector(1000, dtype, 1), vector(1000, dtype, 2)
        scalar = np.dtype(dtype).type(3)
        expected = exact(y) + 3 * exact(x)
        with combination("dtype", dtype):
            assert add_scaled(scalar, x, y) is y
            assert np.all(np.abs(exact(y) - expected) <= tolerance(dtype, 1) * (1 + np.abs(expected)))
    assert set(BLAS_AXPY_TYPES) == {np.dtype(t).char for t in (np.float32, np.float64, np.complex64, np.complex128)}
    base = np.ones(10)
    view = base[::2]  # strided: NumPy, still in place in the base
    assert add_scaled(np.float64(2), np.arange(5.0), view) is view and list(base) == [1, 1, 3, 1, 5, 1, 7, 1, 9, 1]
    empty = np.zeros(0)
    assert add_scaled(np.float64(2), np.zeros(0), empty) is empty
    frozen = np.ones(3)
    frozen.flags.writeable = False  # BLAS would write it anyway: refused as NumPy refuses it
    with pytest.raises(ValueError, match="read-only"):
        add_scaled(np.float64(1), np.ones(3), frozen)
    assert list(frozen) == [1, 1, 1]


def test_float16_axpy_rounds_once():
    y = axpy(2, np.array([6e4], np.float16), np.array([-6e4], np.float16))
    assert y.dtype == np.float16 and y[0] == 6e4


def test_integer_axpy_needs_an_integral_alpha_in_range():
    assert list(axpy(np.float64(-2.0), np.array([5, 7]), np.array([1, 1]))) == [-9, -13]
    for alpha in (2.5, np.nan, 2**40, 1j):
        with pytest.raises(TypeError, match="alpha"):
            axpy(alpha, np.ones(2, np.int32), np.ones(2, np.int32))
    with pytest.raises(TypeError, match="complex alpha"):
        axpy(1 + 1j, np.ones(2), np.ones(2))
    with pytest.raises(TypeError, match="number"):
        axpy("2", np.ones(2), np.ones(2))


def test_axpy_of_blocks_of_different_lengths_or_dtypes_is_an_input_error():
    with pytest.raises(InputError, match="differ in length"):
        axpy(1.0, np.ones(3), np.ones(4))
    with pytest.raises(InputError, match="differ in dtype"):
        axpy(1.0, np.ones(3, np.float32), np.ones(3))
    with pytest.raises(InputError, match="1D"):
        axpy(1.0, np.ones((2, 2)), np.ones((2, 2)))


@pytest.mark.mpi(min_size=1)
def test_unsupported_dtypes_are_refused_on_every_rank(comm):
    for dtype in REFUSED:
        x = np.ones(3, dtype)
        for name, call in (("dot", lambda: dot(comm, x, x)), ("nrm2", lambda: nrm2(comm, x)),
                           ("axpy", lambda: axpy(1, x, x.copy()))):
            with combination(name, dtype), pytest.raises(TypeError, match="not supported"):
                call()


# --- device blocks (the simulated GPU always; CuPy when a GPU is visible) ---

@pytest.mark.mpi(min_size=1)
def test_dot_nrm2_and_axpy_on_device_blocks_match_numpy(comm, device_backend):
    device_comm = device_backend.comm(comm)
    for n, dtype in itertools.product(LENGTHS, DTYPES):
        with combination("n", n, dtype):
            x, y = vector(n, dtype, 1), vector(n, dtype, 2)
            x_block, y_block = (device_backend.from_host(block(v, comm)) for v in (x, y))
            product, norm = dot(device_comm, x_block, y_block, timings={}), nrm2(device_comm, x_block, timings={})
            alpha = {"i": 3, "c": 2.5 - 1j}.get(np.dtype(dtype).kind, 2.5)
            updated = axpy(alpha, x_block, y_block, timings={})
            on_device = all(device_backend.is_device_array(r) for r in (product, norm, updated)) and updated is y_block
            assert all_ranks(comm, on_device and product.shape == norm.shape == () and product.dtype == dtype
                          and norm.dtype == np.linalg.norm(x).dtype and updated.dtype == dtype)
            product, norm, updated = (device_backend.to_host(r) for r in (product, norm, updated))
            expected_norm = np.linalg.norm(exact(x).astype(np.complex128))
            expected_y = block(alpha * exact(x) + exact(y), comm)
            assert all_ranks(comm, abs(exact(product.reshape(1))[0] - np.dot(exact(x), exact(y)))
                          <= tolerance(dtype, n) * (1 + np.abs(x) @ np.abs(y))
                          and abs(float(norm) - expected_norm) <= tolerance(norm.dtype, n) * (1 + expected_norm)
                          and np.all(np.abs(exact(updated) - expected_y)
                                     <= tolerance(dtype, 1) * (1 + np.abs(expected_y))))
            assert comm.allgather((product.item(), norm.item())) == [(product.item(), norm.item())] * comm.size


@pytest.mark.mpi(min_size=1)
def test_nrm2_of_device_blocks_with_zeros_inf_nan_and_huge_entries(comm, device_backend):
    for special, expected in [(0.0, 0.0), (np.inf, np.inf), (np.nan, np.nan), (1e200, None)]:
        with combination("special", special):
            x = np.zeros(6) if special == 0.0 else np.ones(6)
            x[comm.size % 6] = special
            result = nrm2(device_backend.comm(comm), device_backend.from_host(block(x, comm)))
            value = float(device_backend.to_host(result))
            expected = np.linalg.norm(x / 1e200) * 1e200 if expected is None else expected
            assert all_ranks(comm, device_backend.is_device_array(result)
                          and (np.isnan(value) if np.isnan(expected) else value == pytest.approx(expected, rel=1e-15)))


def test_float16_axpy_on_a_device_rounds_once(device_backend):
    y = device_backend.from_host(np.array([-6e4], np.float16))
    axpy(2, device_backend.from_host(np.array([6e4], np.float16)), y)
    assert device_backend.is_device_array(y) and device_backend.to_host(y)[0] == 6e4
