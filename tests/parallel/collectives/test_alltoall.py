"""The hand-written alltoall algorithms against NumPy (and MPI's Alltoallv) on any rank count."""
import array
import itertools
from collections import defaultdict, deque

import numpy as np
import pytest
from mpi4py import MPI

from kernels.distribution import block_counts, block_range
from parallel.collectives import release_plans
from parallel.collectives.alltoall import ALLTOALL_ALGORITHMS, ALLTOALL_SCHEDULES
from parallel.collectives.alltoall.auto import BRUCK_MIN_RANKS, MEDIUM_BYTES, SHORT_BYTES, choose
from tests.mpitools import all_ranks, combination
from tests.parallel.collectives.collectives_tools import (DTYPES, LENGTH_RULES, duplicate_without_plans,
                                                          length_by_rule, plans_of, read_only)

ALGORITHMS = sorted(ALLTOALL_ALGORITHMS)


def _send_vector(rank, n, dtype, call=0):
    """What ``rank`` sends: values naming the sender and the position (exact in every dtype)."""
    return ((np.arange(n) * 7 + rank * 31 + call * 5) % 251).astype(dtype)


def _expected(comm, n, dtype, call=0):
    """This rank's block of every rank's send vector, in rank order."""
    start, stop = block_range(n, comm.size, comm.rank)
    return np.concatenate([_send_vector(i, n, dtype, call)[start:stop] for i in range(comm.size)])


def _buffers(comm, n, dtype, in_place):
    """(this rank's send vector, sendbuf, recvbuf)."""
    mine = _send_vector(comm.rank, n, dtype)
    if in_place:
        return mine, MPI.IN_PLACE, mine.copy()
    return mine, mine.copy(), np.full(comm.size * block_counts(n, comm.size)[comm.rank], 99, dtype)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_alltoall_matches_numpy(comm, algorithm):
    alltoall = ALLTOALL_ALGORITHMS[algorithm]
    for length, dtype, in_place in itertools.product(LENGTH_RULES, DTYPES, [False, True]):
        n = length_by_rule(length, comm.size, dtype)
        if in_place and n % comm.size:
            continue
        with combination(algorithm, f"n={n}", dtype, f"in_place={in_place}"):
            mine, sendbuf, recvbuf = _buffers(comm, n, dtype, in_place)
            result = alltoall(comm, sendbuf, recvbuf)
            moved = result is recvbuf and result.dtype == dtype and np.array_equal(result, _expected(comm, n, dtype))
            assert all_ranks(comm, moved)
            assert all_ranks(comm, in_place or np.array_equal(sendbuf, mine))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_alltoall_of_random_floats_and_buffer_objects_is_mpis_alltoallv(comm, algorithm):
    p, alltoall = comm.size, ALLTOALL_ALGORITHMS[algorithm]
    for n in [3 * p + 2, 5000]:
        with combination(algorithm, f"n={n}"):
            mine = np.random.default_rng(comm.rank).standard_normal(n)
            counts = block_counts(n, p)
            receiving = [counts[comm.rank]] * p
            expected = np.empty(p * counts[comm.rank])
            comm.Alltoallv([mine, counts, MPI.DOUBLE], [expected, receiving, MPI.DOUBLE])
            assert all_ranks(comm, np.array_equal(alltoall(comm, mine, np.empty_like(expected)), expected))
            sendbuf, recvbuf = array.array("d", mine), array.array("d", bytes(expected.nbytes))
            assert alltoall(comm, sendbuf, recvbuf) is recvbuf
            assert all_ranks(comm, np.array_equal(np.asarray(recvbuf), expected))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_second_call_runs_on_persistent_requests_until_released(comm, algorithm):
    alltoall = ALLTOALL_ALGORITHMS[algorithm]
    for n, in_place in [(4 * comm.size, False), (4 * comm.size, True), (1000 * comm.size + 1, False)]:
        with combination(algorithm, f"n={n}", f"in_place={in_place}"), duplicate_without_plans(comm) as fresh:
            verdicts, requests = [], []
            _, sendbuf, recvbuf = _buffers(fresh, n, np.float64, in_place)
            for call in range(3):
                (recvbuf if in_place else sendbuf)[:] = _send_vector(fresh.rank, n, np.float64, call)
                alltoall(fresh, sendbuf, recvbuf)
                verdicts.append(np.array_equal(recvbuf, _expected(fresh, n, np.float64, call)))
                requests.append([request for plan in plans_of(fresh) for request in plan.requests])
            release_plans(fresh)
            freed = not plans_of(fresh) and all(request == MPI.REQUEST_NULL for request in requests[-1])
            assert all_ranks(fresh, all(verdicts) and requests[0] == [] and requests[1] and freed)


@pytest.mark.mpi(min_size=1)
def test_refusals(comm):
    """Wrong lengths (in place too), mismatched or unsupported dtypes, read-only or non-buffer receivers."""
    p = comm.size
    cases = [
        (np.zeros(p + 1), np.zeros(p * (block_counts(p + 1, p)[comm.rank] + 1)), ValueError, "expected"),
        (np.zeros(2 * p, np.float32), np.zeros(2 * p), TypeError, "float32"),
        (np.zeros(p, bool), np.zeros(p, bool), TypeError, "supported"),
        (np.zeros((p, 1)), np.zeros(p), ValueError, "1-D"),
        (np.zeros(p), read_only(p), ValueError, "read-only"),
        ([0.0] * p, np.zeros(p), TypeError, "buffer"),
    ]
    if p > 1:
        cases.append((MPI.IN_PLACE, np.zeros(p + 1), ValueError, "multiple of the rank count"))
    for algorithm, (sendbuf, recvbuf, error, message) in itertools.product(ALGORITHMS, cases):
        with combination(algorithm, error, message):
            with pytest.raises(error, match=message):
                ALLTOALL_ALGORITHMS[algorithm](comm, sendbuf, recvbuf)


def _simulate(schedule_of, p, n, dtype, in_place):
    """Every rank's schedule run in one process, messages through FIFO mailboxes per pair (sends never block,
    a receive must get a message of its own size); each rank's recvbuf."""
    counts, ranks = block_counts(n, p), []
    for rank in range(p):
        schedule, mine = schedule_of(rank, p, n, np.dtype(dtype).itemsize, in_place), _send_vector(rank, n, dtype)
        out = mine.copy() if in_place else np.full(p * counts[rank], 99, dtype)
        ranks.append((iter(schedule.steps), {"in": out if in_place else mine, "out": out,
                                             "tmp": np.full(schedule.scratch, 77, dtype)}))
    current, posted, mailboxes = [next(steps, None) for steps, _ in ranks], [False] * p, defaultdict(deque)
    while any(step is not None for step in current):
        progress = False
        for rank, ((steps, arrays), step) in enumerate(zip(ranks, current)):
            if step is None:
                continue
            sends, recvs, ops = step
            if not posted[rank]:
                for (name, part), peer in sends:
                    mailboxes[rank, peer].append(arrays[name][part].copy())
                posted[rank] = progress = True
            if all(mailboxes[peer, rank] for _, peer in recvs):
                for (name, part), peer in recvs:
                    message = mailboxes[peer, rank].popleft()
                    assert message.size == part.stop - part.start, f"rank {rank} from {peer}: wrong message size"
                    arrays[name][part] = message
                for _, (source, part), (target, into) in ops:     # alltoalls only copy
                    arrays[target][into] = arrays[source][part]
                current[rank], posted[rank], progress = next(steps, None), False, True
        assert progress, "deadlock"
    assert not any(mailboxes.values()), "messages nobody received"
    return [arrays["out"] for _, arrays in ranks]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_schedules_on_up_to_nine_simulated_ranks(algorithm):
    """Rank counts beyond the MPI rounds (Bruck's positions of three bits need 8 ranks) and every length rule."""
    for p, length, in_place in itertools.product(range(1, 10), [0, 1, "p-1", "p", "p+1", 3, 23, "7p"], [False, True]):
        n = 7 * p if length == "7p" else length_by_rule(length, p, np.int64)
        if in_place and n % p:
            continue
        with combination(algorithm, f"p={p}", f"n={n}", f"in_place={in_place}"):
            results = _simulate(ALLTOALL_SCHEDULES[algorithm], p, n, np.int64, in_place)
            for rank, result in enumerate(results):
                start, stop = block_range(n, p, rank)
                assert np.array_equal(result, np.concatenate(
                    [_send_vector(i, n, np.int64)[start:stop] for i in range(p)])), f"rank {rank}"


def test_auto_chooses_as_mpich_does():
    short, medium = SHORT_BYTES, MEDIUM_BYTES
    assert [choose(p, short) for p in (2, BRUCK_MIN_RANKS - 1, BRUCK_MIN_RANKS, 64)] == [
        "scattered", "scattered", "bruck", "bruck"]
    assert [choose(64, nbytes) for nbytes in (0, short + 1, medium, medium + 1)] == [
        "bruck", "scattered", "scattered", "pairwise"]
    assert choose(2, medium + 1) == "pairwise"
