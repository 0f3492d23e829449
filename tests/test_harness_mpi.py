"""Timing and error agreement across the ranks of one job."""
import pytest
from mpi4py import MPI

from bench.sweep import RankError, agree
from bench.timing import measure
from kernels.errors import InputError


@pytest.mark.mpi(min_size=1)
def test_every_rank_gets_the_slowest_ranks_statistics(comm):
    timing = measure(comm, lambda: None if comm.rank else sum(range(20000)), iters=5, warmup=1)
    everyone = comm.allgather((timing.t_min, timing.t_med, timing.t_max, timing.repeats))
    assert all(entry == everyone[0] for entry in everyone)
    assert 0 < timing.t_min <= timing.t_med <= timing.t_max
    assert timing.iters == 5 and timing.repeats >= 1


@pytest.mark.mpi(min_size=1)
def test_short_runs_are_repeated_within_a_sample(comm):
    assert measure(comm, lambda: None, iters=2, warmup=0).repeats > 1


def _fails_on_last_rank(comm, error):
    if comm.rank == comm.size - 1:
        raise error
    return comm.rank


@pytest.mark.mpi(min_size=1)
def test_agree_returns_results_when_no_rank_fails(comm):
    assert agree(comm, lambda: comm.rank * 2) == comm.rank * 2


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("error, kind", [(InputError("bad grid"), InputError), (KeyError("x"), RankError)])
def test_agree_raises_on_every_rank_when_one_fails(comm, error, kind):
    with pytest.raises(kind) as caught:
        agree(comm, _fails_on_last_rank, comm, error)
    assert comm.allreduce(1, op=MPI.SUM) == comm.size
    if kind is RankError:
        assert str(caught.value).startswith(f"rank {comm.size - 1}: KeyError")
