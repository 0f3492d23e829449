"""The two-level allreduce against NumPy: one node under the MPI rounds, two nodes of one host by MPICH's cliques."""
import array
import itertools
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from bench.faults import sleeping_barrier
from parallel.collectives import hierarchical, release_plans
from parallel.collectives.hierarchical import allreduce_hierarchical
from tests.mpitools import all_ranks, combination
from tests.parallel.collectives.collectives_tools import (DTYPES, LENGTH_RULES, assert_refusals, length_by_rule,
                                                          plans_of, refusals)

#: What the two-node job checks (a smaller set: it runs on 4 ranks within a serial test).
TWO_NODE_LENGTHS = [0, 1, "p+1", 1003, "100KiB"]
TWO_NODE_DTYPES = [np.float64, np.int32, np.complex128, np.uint8]
REPOSITORY = Path(__file__).resolve().parents[3]


def _contribution(rank, n, dtype, call=0):
    """Small values, so sums are exact in every dtype (uint8 too, on up to 8 ranks)."""
    return ((np.arange(n) * 7 + rank * 13 + call * 5) % 29).astype(dtype)


def _reference(comm, n, dtype, op, call=0):
    stacked = [_contribution(rank, n, dtype, call) for rank in range(comm.size)]
    return (np.max if op == "max" else np.sum)(stacked, axis=0).astype(dtype)


def check_against_numpy(comm, lengths=LENGTH_RULES, dtypes=DTYPES):
    """Each length, dtype, place and op (as a string and as an MPI op), each called twice on the same buffers."""
    for length, dtype, in_place, op in itertools.product(lengths, dtypes, [False, True], ["sum", "max", MPI.MAX]):
        if np.dtype(dtype).kind == "c" and op != "sum":
            continue
        n = length_by_rule(length, comm.size, dtype)
        name = op if isinstance(op, str) else "MPI.MAX"
        with combination(f"n={n}", dtype, f"in_place={in_place}", name):
            send, recv = np.empty(n, dtype), np.empty(n, dtype)
            for call in range(2):
                mine = _contribution(comm.rank, n, dtype, call)
                (recv if in_place else send)[:] = mine
                result = allreduce_hierarchical(comm, MPI.IN_PLACE if in_place else send, recv, op)
                expected = _reference(comm, n, dtype, "max" if name != "sum" else "sum", call)
                assert all_ranks(comm, result is recv and np.array_equal(recv, expected))
                assert all_ranks(comm, in_place or np.array_equal(send, mine))


def check_random_floats_against_mpi(comm):
    """Random float64 within rounding of MPI's own allreduce, the same on every rank; a buffer-protocol object."""
    mine = np.random.default_rng(comm.rank).standard_normal(1003)
    expected = np.empty_like(mine)
    comm.Allreduce(mine, expected, op=MPI.SUM)
    result = allreduce_hierarchical(comm, mine, np.empty_like(mine))
    on_rank_zero = result.copy()
    comm.Bcast(on_rank_zero, root=0)
    assert all_ranks(comm, np.allclose(result, expected, rtol=1e-12, atol=1e-12))
    assert all_ranks(comm, np.array_equal(result, on_rank_zero))
    sendbuf, recvbuf = array.array("l", range(5)), array.array("l", [0] * 5)
    allreduce_hierarchical(comm, sendbuf, recvbuf, MPI.SUM)
    assert all_ranks(comm, list(recvbuf) == [comm.size * i for i in range(5)])


def check_two_nodes():
    """Run by the 4 ranks of an ``mpiexec`` job on two (clique) nodes of 2 ranks: the whole job (blocks line
    up) and its first 3 ranks (2 + 1: node leaders) against NumPy; the fourth rank sleeps meanwhile."""
    world = MPI.COMM_WORLD
    first_three = world.Split(0 if world.rank < 3 else MPI.UNDEFINED, world.rank)
    try:
        for comm, aligned in ((world, True), (first_three, False)):
            if comm == MPI.COMM_NULL:
                continue
            node = comm.Split_type(MPI.COMM_TYPE_SHARED)
            leaders = comm.allreduce(int(node.rank == 0))
            node.Free()
            nodes = hierarchical._NODES.get(comm)
            assert leaders == 2 and nodes.aligned == aligned, f"{comm.size} ranks: {leaders} nodes"
            check_against_numpy(comm, TWO_NODE_LENGTHS, TWO_NODE_DTYPES)
            check_random_floats_against_mpi(comm)
    finally:
        if first_three != MPI.COMM_NULL:
            first_three.Free()
        sleeping_barrier(world)


@pytest.mark.mpi(min_size=1)
def test_hierarchical_matches_numpy_on_one_node(comm):
    check_against_numpy(comm)
    check_random_floats_against_mpi(comm)


def test_two_nodes_of_one_host_aligned_and_not():
    """4 ranks as 2 + 2 and 3 of them as 2 + 1 on one host, cut in two nodes by MPICH's cliques."""
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    program = "from tests.parallel.collectives.test_hierarchical import check_two_nodes; check_two_nodes()"
    env = {**os.environ, "MPIR_CVAR_NUM_CLIQUES": "2", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([mpiexec, "-n", "4", sys.executable, "-c", program], cwd=REPOSITORY, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "persistent request" not in done.stderr          # sub-communicators and plans freed before MPI ends


@pytest.mark.mpi(min_size=2)
def test_repeated_calls_run_on_persistent_requests_released_and_freed_with_the_communicator(comm):
    dup = comm.Dup()
    send, recv = np.ones(1000), np.zeros(1000)
    for _ in range(2):
        allreduce_hierarchical(dup, send, recv)
    requests = [request for plan in plans_of(dup) for request in plan.requests]   # one node: plans on dup
    summed = np.array_equal(recv, np.full(1000, float(comm.size)))
    release_plans(dup)
    released = all(request == MPI.REQUEST_NULL for request in requests) and not plans_of(dup)
    nodes = hierarchical._NODES.get(dup)
    dup.Free()
    freed = nodes.node == MPI.COMM_NULL and nodes.across == MPI.COMM_NULL
    assert all_ranks(comm, summed and requests and released and freed)


def test_refusals():
    wrong_length = [(np.zeros(5), np.zeros(4), "sum", ValueError, "items")]
    assert_refusals(partial(allreduce_hierarchical, MPI.COMM_SELF), refusals() + wrong_length, "hierarchical")
