"""The hand-written reductions to a root against NumPy on any rank count and root, their plans and auto's
choice."""
import itertools
from functools import partial

import numpy as np
import pytest
from mpi4py import MPI

from parallel.collectives.reduce import REDUCE_ALGORITHMS
from parallel.collectives.reduce.auto import SHORT_BYTES, THREE_RANKS_BYTES, choose
from tests.mpitools import all_ranks, combination
from tests.parallel.collectives.collectives_tools import (DTYPES, assert_refusals, assert_repeats_until_released,
                                                          contribution, lengths, ops_of, reference, refusals, roots)

ALGORITHMS = sorted(REDUCE_ALGORITHMS)


def _reduce_matches(comm, reduce, n, dtype, root, in_place, op):
    """Whether ``reduce`` leaves the reduction in ``root``'s ``recvbuf`` and an out-of-place ``sendbuf`` as
    it was (the other ranks' ``recvbuf`` is workspace)."""
    mine = contribution(comm.rank, n, dtype)
    sendbuf, recvbuf = (MPI.IN_PLACE, mine.copy()) if in_place else (mine.copy(), np.full(n, 3, dtype))
    result = reduce(comm, sendbuf, recvbuf, op=op, root=root)
    reduced = comm.rank != root or np.array_equal(recvbuf, reference(comm.size, n, dtype, op))
    return result is recvbuf and recvbuf.dtype == dtype and reduced and (in_place or np.array_equal(sendbuf, mine))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reduce_matches_numpy(comm, algorithm):
    for dtype, root, in_place in itertools.product(DTYPES, roots(comm), [False, True]):
        for n, op in itertools.product(lengths(comm, dtype), ops_of(dtype)):
            with combination(algorithm, f"n={n}", dtype, f"root={root}", f"in_place={in_place}", op):
                assert all_ranks(comm, _reduce_matches(comm, REDUCE_ALGORITHMS[algorithm], n, dtype, root, in_place,
                                                       op))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reduce_of_random_floats_is_close_to_mpi(comm, algorithm):
    n, root = 1003, comm.size - 1
    mine = np.random.default_rng(comm.rank).standard_normal(n)
    expected = np.empty(n)
    comm.Reduce(mine, expected, op=MPI.SUM, root=root)
    result = REDUCE_ALGORITHMS[algorithm](comm, mine, np.empty(n), root=root)
    assert all_ranks(comm, comm.rank != root or np.allclose(result, expected, rtol=1e-12, atol=1e-12))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reduce_repeats_on_persistent_plans_until_released(comm, algorithm):
    reduce = REDUCE_ALGORITHMS[algorithm]

    def session(fresh, n, root, in_place):
        send, recv = np.empty(n), np.empty(n)
        sendbuf = MPI.IN_PLACE if in_place else send
        verdicts = []
        for call, op in itertools.product(range(3), [MPI.SUM, MPI.MAX]):
            (recv if in_place else send)[:] = contribution(fresh.rank, n, np.float64, call)
            reduce(fresh, sendbuf, recv, op=op, root=root)
            verdicts.append(fresh.rank != root or np.array_equal(recv, reference(fresh.size, n, np.float64, op, call)))
        return verdicts, lambda: reduce(fresh, sendbuf, recv, root=root)

    assert_repeats_until_released(comm, algorithm, session, rooted=True)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reduce_refuses_bad_buffers_ops_and_roots(algorithm):
    reduce = partial(REDUCE_ALGORITHMS[algorithm], MPI.COMM_SELF)
    assert_refusals(reduce, refusals() + [(np.zeros(5), np.zeros(4), "sum", ValueError, "items")], algorithm)
    assert_refusals(lambda root: reduce(np.zeros(4), np.zeros(4), root=root),
                    [(1, ValueError, "root 1"), (-1, ValueError, "root -1"), ("0", TypeError, "str")], algorithm)


def test_auto_takes_the_binomial_tree_up_to_the_measured_thresholds():
    assert [choose(p, SHORT_BYTES) for p in (1, 2, 4, 5, 8)] == ["binomial"] * 5
    assert [choose(p, SHORT_BYTES + 1) for p in (1, 2, 4, 5, 8)] == ["rabenseifner"] * 5
    assert [choose(3, nbytes) for nbytes in (THREE_RANKS_BYTES, THREE_RANKS_BYTES + 1)] == ["binomial", "rabenseifner"]
