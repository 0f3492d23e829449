"""Cached plans (persistent requests on repeated buffers) and the auto allreduce."""
import array
import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from kernels.distribution import block_range
from parallel.collectives import ALLREDUCE_ALGORITHMS, plans, release_plans
from parallel.collectives.auto import SMALL_BYTES, choose
from parallel.collectives.ring import allgather_ring, reduce_scatter_ring
from tests.mpitools import all_ranks
from tests.parallel.collectives.collectives_tools import duplicate_without_plans, plans_of

ALGORITHMS = sorted(ALLREDUCE_ALGORITHMS)
DTYPES = [np.float32, np.float64, np.int32, np.uint8, np.complex128]


def _contribution(rank, n, dtype, call):
    """Small values that change with the call, so a stale result is seen; exact sums in every dtype."""
    return ((np.arange(n) * 7 + rank * 13 + call * 5) % 11).astype(dtype)


def _reference(comm, n, dtype, call, op):
    stacked = [_contribution(r, n, dtype, call) for r in range(comm.size)]
    return (np.sum if op == "sum" else np.max)(stacked, axis=0).astype(dtype)


@pytest.fixture
def fresh(comm):
    """``duplicate_without_plans(comm)`` for the whole test."""
    with duplicate_without_plans(comm) as dup:
        yield dup


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_repeated_calls_on_the_same_buffers_follow_their_contents(comm, algorithm):
    for length, dtype, in_place in itertools.product([0, 1, "p-1", 1001, 3000], DTYPES, [False, True]):
        with duplicate_without_plans(comm) as fresh:
            n = fresh.size - 1 if length == "p-1" else length
            ops = ["sum"] if np.dtype(dtype).kind == "c" else ["sum", "max", MPI.SUM]
            send, recv = np.empty(n, dtype), np.empty(n, dtype)
            verdicts = []
            for call in range(4):
                for op in ops:
                    mine = _contribution(fresh.rank, n, dtype, call)
                    if in_place:
                        recv[:] = mine
                    else:
                        send[:] = mine
                        recv[:] = 99
                    result = ALLREDUCE_ALGORITHMS[algorithm](fresh, MPI.IN_PLACE if in_place else send, recv, op=op)
                    name = op if isinstance(op, str) else "sum"
                    verdicts.append(result is recv and np.array_equal(recv, _reference(fresh, n, dtype, call, name)))
                    verdicts.append(in_place or np.array_equal(send, mine))
            assert all_ranks(fresh, all(verdicts)), f"{algorithm} n={n} {dtype.__name__} in_place={in_place}"


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_second_call_on_the_same_buffers_runs_on_persistent_requests(fresh, algorithm):
    comm, n = fresh, 1000
    send, recv = np.ones(n), np.zeros(n)
    ALLREDUCE_ALGORITHMS[algorithm](comm, send, recv)
    first = [plan.requests for plan in plans_of(comm)]
    ALLREDUCE_ALGORITHMS[algorithm](comm, send, recv)
    second = [len(plan.requests) for plan in plans_of(comm)]
    assert all_ranks(comm, first == [[]] and len(second) == 1 and second[0] > 0)
    assert all_ranks(comm, np.array_equal(recv, np.full(n, comm.size, float)))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_buffer_changed_in_place_gets_a_new_plan(fresh, algorithm):
    comm = fresh
    send, recv = np.ones(12), np.zeros(12)
    for _ in range(2):
        ALLREDUCE_ALGORITHMS[algorithm](comm, send, recv)
    send.shape = recv.shape = (6, 2)      # same objects, now 2-D: refused, not served from the plan
    with pytest.raises(ValueError, match="1-D"):
        ALLREDUCE_ALGORITHMS[algorithm](comm, send, recv)
    send.shape = recv.shape = (12,)
    send.dtype = recv.dtype = np.int64    # same memory, read as integers
    send[:] = comm.rank + 1
    ALLREDUCE_ALGORITHMS[algorithm](comm, send, recv)
    assert all_ranks(comm, recv.dtype == np.int64 and np.all(recv == comm.size * (comm.size + 1) // 2))
    recv.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        ALLREDUCE_ALGORITHMS[algorithm](comm, send, recv)


class _CountingArray(np.ndarray):
    """An array counting the Python-level reads of its shape and strides (tuples built per read)."""

    reads = 0

    @property
    def shape(self):
        _CountingArray.reads += 1
        return np.ndarray.shape.__get__(self)

    @property
    def strides(self):
        _CountingArray.reads += 1
        return np.ndarray.strides.__get__(self)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_repeated_call_is_served_without_reading_shapes_or_strides(fresh, algorithm):
    comm, n = fresh, 2 * fresh.size + 3
    send, recv = np.zeros(n).view(_CountingArray), np.zeros(n).view(_CountingArray)
    verdicts = []
    for call in range(5):
        if call == 2:
            _CountingArray.reads = 0
        send[:] = _contribution(comm.rank, n, np.float64, call)
        ALLREDUCE_ALGORITHMS[algorithm](comm, send, recv)
        verdicts.append(np.array_equal(recv.view(np.ndarray), _reference(comm, n, np.float64, call, "sum")))
    assert all_ranks(comm, all(verdicts) and _CountingArray.reads == 0)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_plans_are_per_communicator(comm, fresh, algorithm):
    split = comm.Split(comm.rank % 2, comm.rank)
    send, recv = np.full(5, comm.rank + 1.0), np.zeros(5)
    try:
        verdicts = []
        for target, members in ((comm, range(comm.size)), (split, range(comm.rank % 2, comm.size, 2)), (fresh, None)):
            members = range(comm.size) if members is None else members
            for _ in range(3):
                recv[:] = 0
                ALLREDUCE_ALGORITHMS[algorithm](target, send, recv)
                verdicts.append(np.all(recv == sum(r + 1 for r in members)))
    finally:
        release_plans(split)
        split.Free()
    assert all_ranks(comm, all(verdicts))


@pytest.mark.mpi(min_size=2)
def test_the_cache_is_bounded_and_evicted_plans_free_their_requests(fresh):
    comm, allreduce = fresh, ALLREDUCE_ALGORITHMS["recursive_doubling"]
    pairs = [(np.ones(4), np.zeros(4)) for _ in range(2 * plans.CACHE_SIZE + 4)]
    for send, recv in pairs[:1] * 2:
        allreduce(comm, send, recv)
    requests = list(plans_of(comm)[0].requests)
    for send, recv in pairs[1:]:
        allreduce(comm, send, recv)
    all_summed = all(np.all(recv == comm.size) for _, recv in pairs)
    assert all_ranks(comm, len(plans._CACHE) <= plans.CACHE_SIZE and requests
                         and all(request == MPI.REQUEST_NULL for request in requests) and all_summed)


@pytest.mark.mpi(min_size=2)
def test_release_plans_frees_requests_and_a_freed_communicator_is_not_served(comm):
    dup = comm.Dup()
    send, recv = np.ones(3), np.zeros(3)
    for _ in range(2):
        ALLREDUCE_ALGORITHMS["ring"](dup, send, recv)
    requests = [request for plan in plans_of(dup) for request in plan.requests]
    release_plans(dup)
    freed = bool(requests) and all(request == MPI.REQUEST_NULL for request in requests) and not plans_of(dup)
    for _ in range(2):
        ALLREDUCE_ALGORITHMS["ring"](dup, send, recv)
    dup.Free()
    with pytest.raises(MPI.Exception):
        ALLREDUCE_ALGORITHMS["ring"](dup, send, recv)
    release_plans(dup)
    assert all_ranks(comm, freed)


@pytest.mark.mpi(min_size=1)
def test_reduce_scatter_and_allgather_repeat_on_the_same_buffers(comm):
    n = 2 * comm.size + 1
    start, stop = block_range(n, comm.size, comm.rank)
    for in_place in [False, True]:
        with duplicate_without_plans(comm) as fresh:
            full, block = np.empty(n), np.empty(stop - start)
            verdicts = []
            for call in range(3):
                mine = _contribution(fresh.rank, n, np.float64, call)
                expected = _reference(fresh, n, np.float64, call, "sum")
                full[:] = mine
                reduce_scatter_ring(fresh, MPI.IN_PLACE if in_place else full, full if in_place else block)
                verdicts.append(np.array_equal(full[start:stop] if in_place else block, expected[start:stop]))
                full[:] = -1
                if in_place:
                    full[start:stop] = expected[start:stop]
                else:
                    block[:] = expected[start:stop]
                allgather_ring(fresh, MPI.IN_PLACE if in_place else block, full)
                verdicts.append(np.array_equal(full, expected))
            assert all_ranks(fresh, all(verdicts)), f"in_place={in_place}"


@pytest.mark.mpi(min_size=1)
def test_buffer_protocol_objects_are_not_held_after_the_call(fresh):
    comm = fresh
    send, recv = array.array("d", [1.0, 2.0]), array.array("d", [0.0, 0.0])
    for _ in range(2):
        ALLREDUCE_ALGORITHMS["recursive_doubling"](comm, send, recv)
    send.append(3.0)          # a held export would make these a BufferError
    recv.append(0.0)
    assert all_ranks(comm, list(recv) == [comm.size, 2.0 * comm.size, 0.0])


def test_auto_chooses_recursive_doubling_small_and_bandwidth_optimal_large():
    assert [choose(p, SMALL_BYTES) for p in (1, 2, 3)] == ["recursive_doubling"] * 3
    assert [choose(p, SMALL_BYTES // 2) for p in (4, 5, 7)] == ["recursive_doubling"] * 3
    assert [choose(p, SMALL_BYTES // 2 + 1) for p in (2, 3, 4, 5, 6, 7, 8)] == [
        "recursive_doubling", "recursive_doubling", "rabenseifner", "ring", "ring", "ring", "rabenseifner"]
    assert [choose(p, SMALL_BYTES + 1) for p in (2, 3, 4, 7, 8)] == [
        "rabenseifner", "ring", "rabenseifner", "ring", "rabenseifner"]


@pytest.mark.mpi(min_size=1)
def test_auto_matches_numpy_across_its_thresholds(comm):
    for nbytes in [8, SMALL_BYTES // 4, SMALL_BYTES // 4 + 8, SMALL_BYTES // 2, SMALL_BYTES // 2 + 8]:
        with duplicate_without_plans(comm) as fresh:
            n = nbytes // 8
            mine = _contribution(fresh.rank, n, np.float64, 0)
            recv = np.empty(n)
            for _ in range(2):
                ALLREDUCE_ALGORITHMS["auto"](fresh, mine, recv)
            expected = _reference(fresh, n, np.float64, 0, "sum")
            assert all_ranks(fresh, np.array_equal(recv, expected)), f"{nbytes} bytes"


def test_plans_are_freed_before_mpi_finalizes():
    program = ("import numpy as np\nfrom mpi4py import MPI\nfrom parallel.collectives import ALLREDUCE_ALGORITHMS\n"
               "for c in (MPI.COMM_WORLD, MPI.COMM_WORLD.Dup()):\n"
               "    for f in ALLREDUCE_ALGORITHMS.values():\n"
               "        send, recv = np.ones(3), np.zeros(3)\n        f(c, send, recv); f(c, send, recv)\n")
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    done = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "persistent request" not in done.stderr
