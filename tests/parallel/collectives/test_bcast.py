"""The hand-written broadcasts against NumPy on any rank count and root, their plans and auto's choice."""
import itertools
from functools import partial

import numpy as np
import pytest
from mpi4py import MPI

from parallel.collectives.bcast import BCAST_ALGORITHMS
from parallel.collectives.bcast.auto import MIN_RANKS, SHORT_BYTES, choose
from parallel.collectives.bcast.chain import bcast_chain
from tests.mpitools import all_ranks, combination
from tests.parallel.collectives.collectives_tools import (DTYPES, assert_refusals, assert_repeats_until_released,
                                                          exact_values, lengths, read_only, roots)

ALGORITHMS = sorted(BCAST_ALGORITHMS)


def _buffers(comm, data, root, in_place):
    """(sendbuf, recvbuf) of a broadcast of ``data`` from ``root``; off the root a sendbuf that must be
    ignored (another length and dtype) and a recvbuf of garbage."""
    recvbuf = np.full_like(data, 3)
    if comm.rank != root:
        return np.zeros(data.size + 1, np.int8), recvbuf
    if in_place:
        recvbuf[:] = data
        return MPI.IN_PLACE, recvbuf
    return data.copy(), recvbuf


def _broadcast_matches(comm, bcast, n, dtype, root, in_place):
    """Whether ``bcast`` leaves the root's data on every rank and the root's sendbuf as it was."""
    expected = exact_values(n, dtype, seed=root)
    sendbuf, recvbuf = _buffers(comm, expected, root, in_place)
    result = bcast(comm, sendbuf, recvbuf, root=root)
    untouched = comm.rank != root or in_place or np.array_equal(sendbuf, expected)
    return result is recvbuf and recvbuf.dtype == dtype and np.array_equal(recvbuf, expected) and untouched


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_bcast_matches_numpy(comm, algorithm):
    for dtype, root, in_place in itertools.product(DTYPES, roots(comm), [False, True]):
        for n in lengths(comm, dtype):
            with combination(algorithm, f"n={n}", dtype, f"root={root}", f"in_place={in_place}"):
                assert all_ranks(comm, _broadcast_matches(comm, BCAST_ALGORITHMS[algorithm], n, dtype, root,
                                                          in_place))


@pytest.mark.mpi(min_size=1)
def test_chain_with_any_segment_size(comm):
    for segment_bytes, n, in_place in itertools.product([1, 8, 24, 4096], [1, comm.size + 1, 1003], [False, True]):
        chain = partial(bcast_chain, segment_bytes=segment_bytes)
        with combination(f"segment_bytes={segment_bytes}", f"n={n}", f"in_place={in_place}"):
            assert all_ranks(comm, _broadcast_matches(comm, chain, n, np.float64, comm.size - 1, in_place))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_bcast_of_random_floats_equals_mpi(comm, algorithm):
    n, root = 1003, comm.size - 1
    data = np.random.default_rng(comm.rank).standard_normal(n)
    expected = data.copy()
    comm.Bcast(expected, root=root)
    result = BCAST_ALGORITHMS[algorithm](comm, data, np.empty(n), root=root)
    assert all_ranks(comm, np.array_equal(result, expected))  # no arithmetic: exact


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_bcast_repeats_on_persistent_plans_until_released(comm, algorithm):
    bcast = BCAST_ALGORITHMS[algorithm]

    def session(fresh, n, root, in_place):
        send, recv = np.empty(n), np.empty(n)
        sendbuf = MPI.IN_PLACE if in_place and fresh.rank == root else send
        verdicts = []
        for call in range(3):
            expected = exact_values(n, np.float64, call)
            recv[:] = expected if in_place and fresh.rank == root else -1
            send[:] = expected if fresh.rank == root else -1
            bcast(fresh, sendbuf, recv, root=root)
            verdicts.append(np.array_equal(recv, expected))
        return verdicts, lambda: bcast(fresh, sendbuf, recv, root=root)

    assert_repeats_until_released(comm, algorithm, session, rooted=True)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_bcast_refuses_bad_buffers_and_roots(algorithm):
    cases = [
        (np.zeros(5), np.zeros(4), 0, ValueError, "items"),
        (np.zeros(4, np.float32), np.zeros(4), 0, TypeError, "float32"),
        (np.zeros(4), read_only(4), 0, ValueError, "read-only"),
        (np.zeros(4, bool), np.zeros(4, bool), 0, TypeError, "supported"),
        ([0.0] * 4, np.zeros(4), 0, TypeError, "buffer"),
        (np.zeros(8)[::2], np.zeros(4), 0, ValueError, "contiguous"),
        (np.zeros(4), np.zeros(4), 1, ValueError, "root 1"),
        (np.zeros(4), np.zeros(4), -1, ValueError, "root -1"),
        (np.zeros(4), np.zeros(4), "0", TypeError, "str"),
    ]
    assert_refusals(partial(BCAST_ALGORITHMS[algorithm], MPI.COMM_SELF), cases, algorithm)


def test_chain_refuses_a_segment_that_is_not_a_positive_integer():
    def chain(segment_bytes):
        return bcast_chain(MPI.COMM_SELF, np.zeros(4), np.zeros(4), segment_bytes=segment_bytes)

    assert_refusals(chain, [(0, ValueError, "segment_bytes"), (-8, ValueError, "segment_bytes"),
                            (1.5, TypeError, "float")], "chain")


def test_auto_chooses_as_mpich_at_the_measured_thresholds():
    assert [choose(p, SHORT_BYTES - 1) for p in (MIN_RANKS, 2 * MIN_RANKS)] == ["binomial"] * 2
    assert [choose(p, 1 << 30) for p in range(1, MIN_RANKS)] == ["binomial"] * (MIN_RANKS - 1)
    assert [choose(p, SHORT_BYTES) for p in (MIN_RANKS, MIN_RANKS + 1)] == ["scatter_allgather"] * 2
