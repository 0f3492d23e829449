"""Distributed dot, nrm2 and axpy against NumPy."""
import numpy as np
import pytest

from kernels.blas1 import axpy, dot, nrm2
from kernels.distribution import block_range
from kernels.errors import InputError

LENGTHS = [0, 1, 3, 7, 10]
DTYPES = [np.float32, np.float64]


def vector(n, dtype, seed):
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def block(global_vector, comm):
    return global_vector[slice(*block_range(global_vector.size, comm.size, comm.rank))].copy()


def tolerance(dtype, n):
    return 10 * np.finfo(dtype).eps * max(n, 1)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", LENGTHS)
def test_dot_matches_numpy_on_every_rank(comm, n, dtype):
    x, y = vector(n, dtype, 1), vector(n, dtype, 2)
    timings = {}
    result = dot(block(x, comm), block(y, comm), comm, timings=timings)
    expected = np.dot(x.astype(np.float64), y.astype(np.float64))
    assert result.dtype == dtype and set(timings) == {"comm", "compute"}
    assert abs(float(result) - expected) <= tolerance(dtype, n) * (1 + np.abs(x) @ np.abs(y))
    assert comm.allgather(float(result)) == [float(result)] * comm.size


@pytest.mark.mpi(min_size=1)
def test_dot_of_vectors_of_different_lengths_fails_on_every_rank(comm):
    n = 5
    # Length n + p gives every rank a block one entry longer than length n does.
    with pytest.raises(InputError, match="differ"):
        dot(block(vector(n, np.float64, 1), comm), block(vector(n + comm.size, np.float64, 2), comm), comm)
    with pytest.raises(InputError, match="differ"):
        dot(block(vector(n, np.float64, 1), comm), block(vector(n, np.float32, 2), comm), comm)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", LENGTHS)
def test_nrm2_matches_numpy(comm, n, dtype):
    x = vector(n, dtype, 3)
    result = nrm2(block(x, comm), comm, timings={})
    expected = np.linalg.norm(x.astype(np.float64))
    assert result.dtype == dtype
    assert abs(float(result) - expected) <= tolerance(dtype, n) * (1 + expected)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype, magnitude", [(np.float64, 1e200), (np.float64, 1e-200),
                                              (np.float32, 1e30), (np.float32, 1e-30)])
def test_nrm2_neither_overflows_nor_underflows(comm, dtype, magnitude):
    n = 7
    x = (magnitude * np.linspace(1.0, 2.0, n)).astype(dtype)
    expected = magnitude * np.sqrt(np.sum(np.linspace(1.0, 2.0, n) ** 2))
    result = float(nrm2(block(x, comm), comm))
    assert np.isfinite(result) and result > 0
    assert abs(result - expected) <= tolerance(dtype, n) * expected


@pytest.mark.mpi(min_size=1)
def test_nrm2_of_zeros_inf_and_nan(comm):
    assert nrm2(block(np.zeros(6), comm), comm) == 0.0
    with_inf, with_nan = np.ones(6), np.ones(6)
    with_inf[0], with_nan[0] = np.inf, np.nan
    assert nrm2(block(with_inf, comm), comm) == np.inf
    assert np.isnan(nrm2(block(with_nan, comm), comm))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", LENGTHS)
def test_axpy_matches_numpy(comm, n, dtype):
    x, y = vector(n, dtype, 4), vector(n, dtype, 5)
    local_y = block(y, comm)
    result = axpy(2.5, block(x, comm), local_y, timings={})
    expected = block(2.5 * x.astype(np.float64) + y, comm)
    assert result is local_y and result.dtype == dtype
    close = np.allclose(result, expected, rtol=tolerance(dtype, 1), atol=tolerance(dtype, 1))
    assert comm.allreduce(int(not close)) == 0


def test_axpy_of_blocks_of_different_lengths_is_an_input_error():
    with pytest.raises(InputError, match="differ in length"):
        axpy(1.0, np.ones(3), np.ones(4))
    with pytest.raises(InputError, match="1D"):
        axpy(1.0, np.ones((2, 2)), np.ones((2, 2)))
