"""The handoff state of the calibration's message tables (bench.message_tables): which samples it keeps."""
import pytest

from bench import message_tables
from bench.message_tables import EXTRA_ROUNDS
from bench.state_tables import STATE_GAP, other_state_tables, reference_state
from tests.mpitools import all_ranks


def test_the_reference_state_is_the_one_most_probes_saw_split_at_the_gap_from_the_fastest():
    assert reference_state([1.0, 1.1, 1.9, 5.0]).tolist() == [True, True, True, False]
    assert reference_state([1.0, 5.0, 4.0, 6.0]).tolist() == [False, True, True, True]  # most were slow
    assert reference_state([1.0, STATE_GAP, 5.0, 6.0]).tolist() == [True, True, False, False]  # a tie: the fast
    assert reference_state([3e-4]).tolist() == [True] and reference_state([2.0, 2.0]).tolist() == [True, True]


def _scripted(monkeypatch, values):
    """Make the handoff probes return ``values`` in turn, and count the samples taken."""
    probes = iter(values)
    monkeypatch.setattr(message_tables, "handoff_prober", lambda pair: lambda: next(probes))


@pytest.mark.mpi(min_size=1)
def test_entries_short_of_samples_in_the_reference_state_are_sampled_again(comm, monkeypatch):
    # rounds visit a, b in turn: probes a 1, b 1 | a 1, b 5 | a 5, b 5: three of six fast, so the fast state;
    # b has one sample in it, a two: b alone is sampled again, and its probe of 1 makes two
    _scripted(monkeypatch, [1, 1, 1, 5, 5, 5, 1])
    entries = {"a": (lambda: None, 1), "b": (lambda: None, 1)}
    samples, probes, in_state = message_tables._state_samples(comm, entries, 3)
    assert all_ranks(comm, probes == {"a": [1, 1, 5], "b": [1, 5, 5, 1]})
    assert all_ranks(comm, in_state == {"a": [True, True, False], "b": [True, False, False, True]})
    assert all_ranks(comm, [len(values) for values in samples.values()] == [3, 4])
    assert all_ranks(comm, min(min(values) for values in samples.values()) >= 0)


@pytest.mark.mpi(min_size=1)
def test_the_extra_samples_stop_after_their_cap_and_one_round_needs_one_sample(comm, monkeypatch):
    _scripted(monkeypatch, [1])
    samples, probes, in_state = message_tables._state_samples(comm, {"a": (lambda: None, 1)}, 1)
    assert all_ranks(comm, in_state == {"a": [True]} and len(samples["a"]) == 1)
    # eight entries in the fast state, one whose probes all run slow: it is sampled EXTRA_ROUNDS more times, no more
    _scripted(monkeypatch, [1] * 8 + [9] * (1 + EXTRA_ROUNDS))
    entries = {**{key: (lambda: None, 1) for key in "abcdefgh"}, "z": (lambda: None, 1)}
    samples, probes, in_state = message_tables._state_samples(comm, entries, 1)
    assert all_ranks(comm, probes["z"] == [9] * (1 + EXTRA_ROUNDS) and in_state["z"] == [False] * (1 + EXTRA_ROUNDS))
    assert all_ranks(comm, all(len(samples[key]) == 1 and in_state[key] == [True] for key in "abcdefgh"))


@pytest.mark.mpi(min_size=2)
def test_the_handoff_probe_gives_both_ranks_of_a_pair_the_slower_ranks_seconds(comm):
    from mpi4py import MPI

    pair = comm.Split(0 if comm.rank < 2 else MPI.UNDEFINED, comm.rank)
    if pair != MPI.COMM_NULL:
        try:
            seconds = message_tables.handoff_prober(pair)()
            assert all_ranks(pair, seconds > 0 and pair.allgather(seconds) == [seconds] * 2)
        finally:
            pair.Free()


def test_the_other_states_tables_fill_an_entry_it_missed_from_the_nearest_size_it_measured():
    reference = {"exchange": [[8, 1.0], [64, 2.0], [512, 4.0], [4096, 8.0]], "allreduce": [[8, 1.0], [64, 3.0]]}
    other = {"exchange": [[8, 2.0], [64, None], [512, None], [4096, 24.0]], "allreduce": [[8, None], [64, None]]}
    assert other_state_tables(reference, other) is None  # allreduce has no sample in it: no tables of the state
    other["allreduce"] = [[8, None], [64, 9.0]]
    assert other_state_tables(reference, other) == {
        "exchange": [[8, 2.0], [64, 4.0], [512, 12.0], [4096, 24.0]],  # 64 B nearer 8 B (x2), 512 B nearer 4 KiB (x3)
        "allreduce": [[8, 3.0], [64, 9.0]]}
    other["exchange"] = [[8, None], [64, None], [512, None], [4096, 24.0]]  # a quarter of the table is enough
    assert other_state_tables(reference, other)["exchange"] == [[8, 3.0], [64, 6.0], [512, 12.0], [4096, 24.0]]
