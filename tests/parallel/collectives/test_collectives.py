"""Hand-written collectives against NumPy references on any rank count."""
import array
import itertools

import numpy as np
import pytest
from mpi4py import MPI

from kernels.distribution import block_range
from parallel.collectives import ALLREDUCE_ALGORITHMS
from parallel.collectives.ring import allgather_ring, allreduce_ring, reduce_scatter_ring
from tests.mpitools import all_ranks

ALGORITHMS = sorted(ALLREDUCE_ALGORITHMS)
LENGTHS = [0, 1, "p-1", 7, 1000, 1001]
DTYPES = [np.float32, np.float64]
NUMPY_OPS = {"sum": np.sum, "max": np.max}


def _length(length, comm):
    return comm.size - 1 if length == "p-1" else length


def _contribution(rank, n, dtype):
    """Small rank-dependent integers (some negative), so sums are exact in float32."""
    return ((np.arange(n) * 7 + rank * 13) % 29 - 14).astype(dtype)


def _reference(comm, n, dtype, op):
    return NUMPY_OPS[op]([_contribution(r, n, dtype) for r in range(comm.size)], axis=0).astype(dtype)


def _op_name(op):
    """``op`` as the test writes it: "sum", "max", MPI.SUM or MPI.MAX."""
    return op if isinstance(op, str) else "MPI.SUM" if op == MPI.SUM else "MPI.MAX"


def _buffers(mine, in_place, recv_size):
    """(sendbuf, recvbuf) holding ``mine`` as input, in place or not."""
    if in_place:
        return MPI.IN_PLACE, mine.copy()
    return mine.copy(), np.full(recv_size, -99, dtype=mine.dtype)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allreduce_matches_numpy(comm, algorithm):
    for length, dtype, in_place, op in itertools.product(LENGTHS, DTYPES, [False, True], ["sum", "max"]):
        n = _length(length, comm)
        name = f"{algorithm} n={n} {dtype.__name__} in_place={in_place} {op}"
        mine = _contribution(comm.rank, n, dtype)
        sendbuf, recvbuf = _buffers(mine, in_place, n)
        result = ALLREDUCE_ALGORITHMS[algorithm](comm, sendbuf, recvbuf, op=op)
        assert result is recvbuf, name
        reduced = result.dtype == dtype and np.array_equal(result, _reference(comm, n, dtype, op))
        assert all_ranks(comm, reduced), name
        assert all_ranks(comm, in_place or np.array_equal(sendbuf, mine)), name


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allreduce_of_random_floats_is_close_to_mpi_and_identicalall_ranks(comm, algorithm):
    n = 1003
    mine = np.random.default_rng(comm.rank).standard_normal(n)
    expected = np.empty(n)
    comm.Allreduce(mine, expected, op=MPI.SUM)
    result = ALLREDUCE_ALGORITHMS[algorithm](comm, mine, np.empty(n))
    on_rank_zero = result.copy()
    comm.Bcast(on_rank_zero, root=0)
    assert all_ranks(comm, np.allclose(result, expected, rtol=1e-12, atol=1e-12))
    assert all_ranks(comm, np.array_equal(result, on_rank_zero))


@pytest.mark.mpi(min_size=1)
def test_reduce_scatter_ring_leaves_each_rank_its_block(comm):
    for length, dtype, in_place, op in itertools.product(LENGTHS, DTYPES, [False, True], ["sum", "max"]):
        n = _length(length, comm)
        name = f"n={n} {dtype.__name__} in_place={in_place} {op}"
        start, stop = block_range(n, comm.size, comm.rank)
        mine = _contribution(comm.rank, n, dtype)
        sendbuf, recvbuf = _buffers(mine, in_place, stop - start)
        result = reduce_scatter_ring(comm, sendbuf, recvbuf, op=op)
        block = result[start:stop] if in_place else result
        assert result is recvbuf, name
        assert all_ranks(comm, np.array_equal(block, _reference(comm, n, dtype, op)[start:stop])), name
        if in_place:
            untouched = np.ones(n, dtype=bool)
            untouched[start:stop] = False
            assert all_ranks(comm, np.array_equal(result[untouched], mine[untouched])), name


@pytest.mark.mpi(min_size=1)
def test_allgather_ring_assembles_every_block(comm):
    for length, dtype, in_place in itertools.product(LENGTHS, DTYPES, [False, True]):
        n = _length(length, comm)
        name = f"n={n} {dtype.__name__} in_place={in_place}"
        start, stop = block_range(n, comm.size, comm.rank)
        expected = (np.arange(n) * 3 + 1).astype(dtype)
        if in_place:
            sendbuf, recvbuf = MPI.IN_PLACE, np.full(n, -1, dtype=dtype)
            recvbuf[start:stop] = expected[start:stop]
        else:
            sendbuf, recvbuf = expected[start:stop].copy(), np.full(n, -1, dtype=dtype)
        assert allgather_ring(comm, sendbuf, recvbuf) is recvbuf, name
        assert all_ranks(comm, np.array_equal(recvbuf, expected)), name


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_unknown_op_is_a_value_error(algorithm):
    buffer = np.zeros(4)
    with pytest.raises(ValueError, match="unknown reduction op"):
        ALLREDUCE_ALGORITHMS[algorithm](MPI.COMM_SELF, buffer.copy(), buffer, op="prod")
    with pytest.raises(ValueError, match="unknown reduction op"):
        reduce_scatter_ring(MPI.COMM_SELF, buffer.copy(), buffer, op=MPI.MIN)
    with pytest.raises(TypeError, match="max"):
        ALLREDUCE_ALGORITHMS[algorithm](MPI.COMM_SELF, np.zeros(2, complex), np.zeros(2, complex), op="max")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(
    "sendbuf, recvbuf, error, message",
    [
        (np.zeros(4, np.float32), np.zeros(4), TypeError, "dtype|float32"),
        (np.zeros(5), np.zeros(4), ValueError, "items"),
        (np.zeros(4, bool), np.zeros(4, bool), TypeError, "supported"),
        (np.zeros((2, 2)), np.zeros(4), ValueError, "1-D"),
        (np.zeros(8)[::2], np.zeros(4), ValueError, "contiguous"),
        ([0.0] * 4, np.zeros(4), TypeError, "buffer"),
    ],
)
def test_bad_buffers_are_the_callers_errors(algorithm, sendbuf, recvbuf, error, message):
    with pytest.raises(error, match=message):
        ALLREDUCE_ALGORITHMS[algorithm](MPI.COMM_SELF, sendbuf, recvbuf)


def test_reduce_scatter_and_allgather_check_block_sizes():
    with pytest.raises(ValueError, match="block 0"):
        reduce_scatter_ring(MPI.COMM_SELF, np.zeros(5), np.zeros(4))
    with pytest.raises(ValueError, match="block 0"):
        allgather_ring(MPI.COMM_SELF, np.zeros(3), np.zeros(4))


def test_a_read_only_recvbuf_is_refused():
    recvbuf = np.zeros(4)
    recvbuf.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        allreduce_ring(MPI.COMM_SELF, np.zeros(4), recvbuf)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_buffer_protocol_objects_and_mpi_ops_are_accepted(comm, algorithm):
    n, rank = 2 * comm.size + 1, comm.rank
    values = [(rank + 1) * (i - 3) for i in range(n)]
    for typecode, op in [("d", MPI.SUM), ("l", "sum"), ("i", MPI.MAX), ("f", "max")]:
        name = f"{algorithm} array({typecode!r}) op {_op_name(op)}"
        sendbuf, recvbuf = array.array(typecode, values), array.array(typecode, [0] * n)
        reference = np.zeros(n, dtype=np.asarray(recvbuf).dtype)
        mpi_op = op if isinstance(op, MPI.Op) else {"sum": MPI.SUM, "max": MPI.MAX}[op]
        comm.Allreduce(np.asarray(sendbuf), reference, op=mpi_op)
        assert ALLREDUCE_ALGORITHMS[algorithm](comm, sendbuf, recvbuf, op=op) is recvbuf, name
        assert all_ranks(comm, np.array_equal(np.asarray(recvbuf), reference)), name
