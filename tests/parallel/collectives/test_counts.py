"""The v-variants of the hand-written allgather, reduce-scatter and alltoall (blocks given as ``counts``)
against NumPy on any rank count: blocks that are not `block_range`'s, empty ones, and the refusals."""
import itertools

import numpy as np
import pytest
from mpi4py import MPI

from parallel.collectives import release_plans
from parallel.collectives.allgather import ALLGATHER_ALGORITHMS
from parallel.collectives.alltoall import ALLTOALL_ALGORITHMS, ALLTOALLV_ALGORITHMS
from parallel.collectives.reduce_scatter import REDUCE_SCATTER_ALGORITHMS
from tests.mpitools import all_ranks, combination


def _block_layouts(p):
    """Block lengths of ``p`` blocks: rows of 3 items (``T = 2p + 1`` rows as `block_range` splits them),
    all in the last block, one empty block in the middle, and all empty."""
    rows = [3 * (2 + (rank < 1)) for rank in range(p)]
    last = [0] * (p - 1) + [11]
    middle = [5 + rank for rank in range(p)]
    middle[p // 2] = 0
    return [tuple(rows), tuple(last), tuple(middle), (0,) * p]


def _values(n, rank, dtype):
    return ((np.arange(n) * 7 + rank * 31) % 101).astype(dtype)


@pytest.mark.mpi(min_size=1)
def test_allgather_and_reduce_scatter_with_counts_match_numpy(comm):
    p, rank = comm.size, comm.rank
    for counts, dtype, name, in_place in itertools.product(_block_layouts(p), [np.float32, np.int64],
                                                           sorted(ALLGATHER_ALGORITHMS), [False, True]):
        n, start = sum(counts), sum(counts[:rank])
        mine = slice(start, start + counts[rank])
        with combination("allgather", name, counts, dtype, f"in_place={in_place}"):
            whole = np.concatenate([_values(c, r, dtype) for r, c in enumerate(counts)])
            recv = np.full(n, -1, dtype)
            if in_place:
                recv[mine] = whole[mine]
            ALLGATHER_ALGORITHMS[name](comm, MPI.IN_PLACE if in_place else whole[mine].copy(), recv, counts=counts)
            assert all_ranks(comm, np.array_equal(recv, whole))
    for counts, dtype, name, in_place in itertools.product(_block_layouts(p), [np.float64, np.int32],
                                                           sorted(REDUCE_SCATTER_ALGORITHMS), [False, True]):
        n, start = sum(counts), sum(counts[:rank])
        mine = slice(start, start + counts[rank])
        with combination("reduce_scatter", name, counts, dtype, f"in_place={in_place}"):
            total = sum(_values(n, r, dtype) for r in range(p))
            send = _values(n, rank, dtype)
            recv = send.copy() if in_place else np.full(counts[rank], -1, dtype)
            REDUCE_SCATTER_ALGORITHMS[name](comm, MPI.IN_PLACE if in_place else send, recv, counts=counts)
            assert all_ranks(comm, np.array_equal(recv[mine] if in_place else recv, total[mine]))
    release_plans(comm)


def _pair_counts(sender, receiver):
    """Items ``sender`` sends ``receiver``: differing from pair to pair, some empty."""
    return (3 * sender + 5 * receiver + 1) % 4


@pytest.mark.mpi(min_size=1)
def test_alltoallv_matches_numpy_and_bruck_is_not_one(comm):
    p, rank = comm.size, comm.rank
    for name, dtype, call in itertools.product(sorted(ALLTOALLV_ALGORITHMS), [np.float32, np.int64], range(2)):
        send_counts = tuple(_pair_counts(rank, j) + call for j in range(p))
        recv_counts = tuple(_pair_counts(i, rank) + call for i in range(p))
        with combination(name, dtype, f"call={call}"):
            blocks = [((np.arange(_pair_counts(i, j) + call) + 10 * i + 100 * j) % 127).astype(dtype)
                      for i in range(p) for j in range(p)]
            send = np.concatenate([blocks[rank * p + j] for j in range(p)])
            recv = np.full(sum(recv_counts), -1, dtype)
            ALLTOALLV_ALGORITHMS[name](comm, send, recv, counts=(send_counts, recv_counts))
            assert all_ranks(comm, np.array_equal(recv, np.concatenate([blocks[i * p + rank] for i in range(p)])))
    assert "bruck" in ALLTOALL_ALGORITHMS and "bruck" not in ALLTOALLV_ALGORITHMS
    release_plans(comm)


@pytest.mark.mpi(min_size=1)
def test_counts_that_do_not_fit_are_refused(comm):
    p = comm.size
    cases = [(ALLGATHER_ALGORITHMS["ring"], np.zeros(1), np.zeros(p), (1,) * (p + 1), "tuple of"),
             (ALLGATHER_ALGORITHMS["ring"], np.zeros(1), np.zeros(p), [1] * p, "tuple of"),
             (ALLGATHER_ALGORITHMS["ring"], np.zeros(1), np.zeros(p + 1), (1,) * p, "add up to"),
             (ALLGATHER_ALGORITHMS["ring"], np.zeros(2), np.zeros(p), (1,) * p, "expected 1"),
             (REDUCE_SCATTER_ALGORITHMS["ring"], np.zeros(p), np.zeros(2), (1,) * p, "expected 1"),
             (ALLTOALLV_ALGORITHMS["pairwise"], np.zeros(p), np.zeros(p), ((1,) * p,), "pair"),
             (ALLTOALLV_ALGORITHMS["pairwise"], np.zeros(p), np.zeros(p), ((1,) * p, (2,) * p), "add up to")]
    for index, (collective, send, recv, counts, message) in enumerate(cases):
        with combination(index, message), pytest.raises(ValueError, match=message):
            collective(comm, send, recv, counts=counts)
    with pytest.raises(ValueError, match="out of place"):
        ALLTOALLV_ALGORITHMS["scattered"](comm, MPI.IN_PLACE, np.zeros(p), counts=((1,) * p,) * 2)
