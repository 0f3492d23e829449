"""The hand-written reduce-scatters against NumPy on any rank count, their plans and auto's choice."""
import itertools
from functools import partial

import numpy as np
import pytest
from mpi4py import MPI

from kernels.distribution import block_counts, block_range
from parallel.collectives.reduce_scatter import REDUCE_SCATTER_ALGORITHMS
from parallel.collectives.reduce_scatter.auto import LONG_BYTES, choose
from tests.mpitools import all_ranks, combination
from tests.parallel.collectives.collectives_tools import (DTYPES, assert_refusals, assert_repeats_until_released,
                                                          contribution, lengths, ops_of, reference, refusals)

ALGORITHMS = sorted(REDUCE_SCATTER_ALGORITHMS)


def _reduce_scatter_matches(comm, reduce_scatter, n, dtype, in_place, op):
    """Whether ``reduce_scatter`` leaves every rank its reduced block, the rest of an in-place
    ``recvbuf`` and an out-of-place ``sendbuf`` as they were."""
    start, stop = block_range(n, comm.size, comm.rank)
    mine = contribution(comm.rank, n, dtype)
    if in_place:
        sendbuf, recvbuf = MPI.IN_PLACE, mine.copy()
    else:
        sendbuf, recvbuf = mine.copy(), np.full(stop - start, 3, dtype)
    result = reduce_scatter(comm, sendbuf, recvbuf, op=op)
    block = recvbuf[start:stop] if in_place else recvbuf
    rest = np.ones(n, bool)
    rest[start:stop] = False
    untouched = np.array_equal(recvbuf[rest], mine[rest]) if in_place else np.array_equal(sendbuf, mine)
    return (result is recvbuf and recvbuf.dtype == dtype and untouched
            and np.array_equal(block, reference(comm.size, n, dtype, op)[start:stop]))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reduce_scatter_matches_numpy(comm, algorithm):
    for dtype, in_place in itertools.product(DTYPES, [False, True]):
        for n, op in itertools.product(lengths(comm, dtype), ops_of(dtype)):
            with combination(algorithm, f"n={n}", dtype, f"in_place={in_place}", op):
                matches = _reduce_scatter_matches(comm, REDUCE_SCATTER_ALGORITHMS[algorithm], n, dtype, in_place, op)
                assert all_ranks(comm, matches)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reduce_scatter_of_random_floats_is_close_to_mpi(comm, algorithm):
    n = 1003
    mine = np.random.default_rng(comm.rank).standard_normal(n)
    counts = block_counts(n, comm.size)
    expected = np.empty(counts[comm.rank])
    comm.Reduce_scatter(mine, expected, counts, op=MPI.SUM)
    result = REDUCE_SCATTER_ALGORITHMS[algorithm](comm, mine, np.empty(counts[comm.rank]))
    assert all_ranks(comm, np.allclose(result, expected, rtol=1e-12, atol=1e-12))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reduce_scatter_repeats_on_persistent_plans_until_released(comm, algorithm):
    reduce_scatter = REDUCE_SCATTER_ALGORITHMS[algorithm]

    def session(fresh, n, in_place):
        start, stop = block_range(n, fresh.size, fresh.rank)
        full, block = np.empty(n), np.empty(stop - start)
        sendbuf, recvbuf = (MPI.IN_PLACE, full) if in_place else (full, block)
        verdicts = []
        for call, op in itertools.product(range(3), [MPI.SUM, MPI.MAX]):
            full[:] = contribution(fresh.rank, n, np.float64, call)
            reduce_scatter(fresh, sendbuf, recvbuf, op=op)
            result = full[start:stop] if in_place else block
            verdicts.append(np.array_equal(result, reference(fresh.size, n, np.float64, op, call)[start:stop]))
        return verdicts, lambda: reduce_scatter(fresh, sendbuf, recvbuf)

    assert_repeats_until_released(comm, algorithm, session)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reduce_scatter_refuses_bad_buffers_and_ops(algorithm):
    wrong_lengths = [(np.zeros(5), np.zeros(4), "sum", ValueError, "block 0"),
                     (np.zeros(4), np.zeros(5), "sum", ValueError, "block 0")]
    assert_refusals(partial(REDUCE_SCATTER_ALGORITHMS[algorithm], MPI.COMM_SELF), refusals() + wrong_lengths, algorithm)


def test_auto_takes_recursive_halving_up_to_the_measured_threshold_and_on_two_ranks():
    assert [choose(p, LONG_BYTES) for p in (1, 2, 3, 4, 5, 8)] == ["recursive_halving"] * 6
    assert [choose(p, LONG_BYTES + 1) for p in (1, 2, 3, 4, 5, 8)] == ["recursive_halving"] * 2 + ["ring"] * 4
