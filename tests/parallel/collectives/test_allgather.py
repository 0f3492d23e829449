"""The hand-written allgathers against NumPy on any rank count, their plans and auto's choice."""
import itertools
from functools import partial

import numpy as np
import pytest
from mpi4py import MPI

from kernels.distribution import block_range
from parallel.collectives.allgather import ALLGATHER_ALGORITHMS
from parallel.collectives.allgather.auto import LONG_BYTES, SHORT_BYTES, choose
from tests.mpitools import all_ranks, combination
from tests.parallel.collectives.collectives_tools import (DTYPES, assert_refusals, assert_repeats_until_released,
                                                          exact_values, lengths, read_only)

ALGORITHMS = sorted(ALLGATHER_ALGORITHMS)


def _buffers(comm, full, in_place):
    """(sendbuf, recvbuf) of an allgather of ``full``: this rank's block, in place or not."""
    start, stop = block_range(full.size, comm.size, comm.rank)
    recvbuf = np.zeros_like(full)
    if in_place:
        recvbuf[start:stop] = full[start:stop]
        return MPI.IN_PLACE, recvbuf
    return full[start:stop].copy(), recvbuf


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allgather_matches_numpy(comm, algorithm):
    allgather = ALLGATHER_ALGORITHMS[algorithm]
    for dtype, in_place in itertools.product(DTYPES, [False, True]):
        for n in lengths(comm, dtype):
            with combination(algorithm, f"n={n}", dtype, f"in_place={in_place}"):
                expected = exact_values(n, dtype)
                sendbuf, recvbuf = _buffers(comm, expected, in_place)
                block = None if in_place else sendbuf.copy()
                result = allgather(comm, sendbuf, recvbuf)
                assert all_ranks(comm, result is recvbuf and recvbuf.dtype == dtype
                                 and np.array_equal(recvbuf, expected)
                                 and (in_place or np.array_equal(sendbuf, block)))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allgather_of_random_floats_equals_mpi(comm, algorithm):
    n = 1003
    counts = [stop - start for start, stop in (block_range(n, comm.size, r) for r in range(comm.size))]
    mine = np.random.default_rng(comm.rank).standard_normal(counts[comm.rank])
    expected = np.empty(n)
    comm.Allgatherv(mine, [expected, counts])
    result = ALLGATHER_ALGORITHMS[algorithm](comm, mine, np.empty(n))
    assert all_ranks(comm, np.array_equal(result, expected))  # no arithmetic: exact


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allgather_repeats_on_persistent_plans_until_released(comm, algorithm):
    allgather = ALLGATHER_ALGORITHMS[algorithm]

    def session(fresh, n, in_place):
        start, stop = block_range(n, fresh.size, fresh.rank)
        block, full = np.empty(stop - start), np.empty(n)
        sendbuf, verdicts = MPI.IN_PLACE if in_place else block, []
        for call in range(3):
            expected = exact_values(n, np.float64, call)
            full[:] = -1
            (full[start:stop] if in_place else block)[:] = expected[start:stop]
            allgather(fresh, sendbuf, full)
            verdicts.append(np.array_equal(full, expected))
        return verdicts, lambda: allgather(fresh, sendbuf, full)

    assert_repeats_until_released(comm, algorithm, session)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allgather_refuses_bad_buffers(algorithm):
    cases = [
        (np.zeros(3), np.zeros(4), ValueError, "block 0"),
        (np.zeros(4, np.float32), np.zeros(4), TypeError, "float32"),
        (np.zeros(4), read_only(4), ValueError, "read-only"),
        (np.zeros(4, bool), np.zeros(4, bool), TypeError, "supported"),
        (np.zeros(4), np.zeros((2, 2)), ValueError, "1-D"),
        (np.zeros(8)[::2], np.zeros(4), ValueError, "contiguous"),
        ([0.0] * 4, np.zeros(4), TypeError, "buffer"),
    ]
    assert_refusals(partial(ALLGATHER_ALGORITHMS[algorithm], MPI.COMM_SELF), cases, algorithm)


@pytest.mark.mpi(min_size=1)
def test_allgather_auto_matches_numpy_across_its_thresholds(comm):
    for nbytes in [SHORT_BYTES - 8, SHORT_BYTES, LONG_BYTES - 8, LONG_BYTES]:
        with combination(f"{nbytes} bytes", choose(comm.size, nbytes)):
            expected = exact_values(nbytes // 8, np.float64)
            sendbuf, recvbuf = _buffers(comm, expected, in_place=False)
            assert all_ranks(comm, np.array_equal(ALLGATHER_ALGORITHMS["auto"](comm, sendbuf, recvbuf), expected))


def test_auto_chooses_as_mpich_at_the_measured_thresholds():
    assert [choose(p, LONG_BYTES - 1) for p in (1, 2, 4, 8)] == ["recursive_doubling"] * 4
    assert [choose(p, LONG_BYTES) for p in (2, 4, 8)] == ["ring"] * 3
    assert [choose(p, SHORT_BYTES - 1) for p in (3, 5, 6, 7, 9)] == ["ring", "bruck", "bruck", "bruck", "bruck"]
    assert [choose(p, SHORT_BYTES) for p in (3, 5, 6, 7, 9)] == ["ring"] * 5
