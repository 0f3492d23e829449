"""The node's handoff states in a calibration (bench.state_tables): which samples its message tables
(bench.message_tables) and its busy rates (bench.local_rates) keep, and the tables of the other state."""
import itertools

import pytest

from bench import message_tables, state_tables
from bench.local_rates import RatesPlan, local_rates
from bench.state_tables import (HUNT_ROUNDS, ShortOfSamples, StateSamples, other_state_seconds, other_state_tables,
                                 reference_state, short_of_samples, state_threshold)
from tests.mpitools import all_ranks

#: A few entries of each local table, two rounds of short samples.
TINY = RatesPlan(gemm_sizes=(32,), thin_rows=(2,), thin_side=64, local_sizes=(8, 1 << 10), gemv_sides=(8,),
                 moe_tokens=(16,), dp_rows=(16,), smo_blocks=(80,), suite_points=(("conv", "forward", 16),),
                 rounds=2, least=0.0005)


def test_two_states_are_two_groups_of_probes_whose_medians_lie_three_times_apart_or_more():
    assert state_threshold([1.0, 1.2, 5.0, 6.0]) == pytest.approx((1.2 * 5.0) ** 0.5)  # halfway in log
    assert state_threshold([91e-6, 95e-6, 140e-6, 467e-6, 500e-6, 700e-6]) == pytest.approx((140e-6 * 467e-6) ** 0.5)
    assert state_threshold([84e-6, 90e-6, 100e-6, 120e-6, 150e-6, 200e-6, 300e-6]) is None  # one state's spread
    assert state_threshold([462e-6, 645e-6] * 5) is None and state_threshold([2.0, 2.0]) is None
    assert state_threshold([3e-4]) is None and state_threshold([1.0, 3.0]) == pytest.approx(3 ** 0.5)


def test_the_reference_state_is_the_one_most_probes_saw():
    assert reference_state([1.0, 1.1, 1.9, 5.0]).tolist() == [True, True, True, False]
    assert reference_state([1.0, 5.0, 4.0, 6.0]).tolist() == [False, True, True, True]  # most were slow
    assert reference_state([1.0, 1.2, 5.0, 6.0]).tolist() == [True, True, False, False]  # a tie: the fast
    assert reference_state([3e-4]).tolist() == [True] and reference_state([1.0, 2.0]).tolist() == [True, True]


def _scripted(monkeypatch, values):
    """Make the handoff probes return ``values`` in turn, and count the samples taken."""
    probes = iter(values)
    monkeypatch.setattr(message_tables, "handoff_prober", lambda pair: lambda: next(probes))


def test_entries_short_of_samples_in_a_state_the_probes_saw():
    probes = {"a": [1, 1, 5], "b": [1, 5, 5], "c": [1.5, 1.9]}
    assert short_of_samples(probes, 2) == ShortOfSamples(["b"], ["a", "c"], pytest.approx((1.9 * 5) ** 0.5))
    assert short_of_samples({"a": [1, 1.2], "b": [1.9, 1]}, 2) == ([], [], None)  # one state seen: nothing sought
    assert short_of_samples({"a": [1], "b": [4]}, 1)[:2] == (["b"], ["a"])
    assert short_of_samples({"a": [1] * 20 + [9], "b": [1] * 20}, 2)[:2] == ([], [])  # 1 probe in 41: an outlier


@pytest.mark.mpi(min_size=1)
def test_each_entry_is_sampled_in_both_states_while_the_node_is_in_them(comm, monkeypatch):
    # rounds visit a, b in turn: a 1, b 1 | a 1, b 5 | a 5, b 5: b needs one more fast sample, a one more slow;
    # then the probes find 5 (a's), 5 (in either state no entry short of it: the next in turn, a), 1 (b's)
    _scripted(monkeypatch, [1, 1, 1, 5, 5, 5, 5, 5, 1])
    entries = {"a": (lambda: None, 1), "b": (lambda: None, 1)}
    states = message_tables._state_samples(comm, entries, 3)
    samples, probes, in_state = states.samples, states.probes, states.in_state
    assert all_ranks(comm, probes == {"a": [1, 1, 5, 5, 5], "b": [1, 5, 5, 1]})
    assert all_ranks(comm, in_state == {"a": [False, False, True, True, True], "b": [False, True, True, False]})
    assert all_ranks(comm, [len(values) for values in samples.values()] == [5, 4])
    assert all_ranks(comm, min(min(values) for values in samples.values()) >= 0)


@pytest.mark.mpi(min_size=1)
def test_the_search_for_a_state_stops_after_its_cap_and_one_round_needs_one_sample(comm, monkeypatch):
    _scripted(monkeypatch, [1])
    states = message_tables._state_samples(comm, {"a": (lambda: None, 1)}, 1)
    assert all_ranks(comm, states.in_state == {"a": [True]} and len(states.samples["a"]) == 1)
    # nine entries, the last probed slow once, the state never seen again: HUNT_ROUNDS x 9 more samples in turn
    monkeypatch.setattr(state_tables, "MIN_STATE_SHARE", 0)
    _scripted(monkeypatch, [1] * 8 + [9] + [1] * (HUNT_ROUNDS * 9))
    entries = {key: (lambda: None, 1) for key in "abcdefghz"}
    states = message_tables._state_samples(comm, entries, 1)
    samples, probes, in_state = states.samples, states.probes, states.in_state
    assert all_ranks(comm, probes["z"] == [9] + [1] * HUNT_ROUNDS and in_state["z"] == [False] + [True] * HUNT_ROUNDS)
    assert all_ranks(comm, all(len(samples[key]) == 1 + HUNT_ROUNDS for key in "abcdefgh"))


@pytest.mark.mpi(min_size=1)
def test_the_search_stops_once_the_state_holds_too_few_of_the_probes(comm, monkeypatch):
    # 1 slow probe of 9 (11 %), then fast ones: z gets its fast sample, then the next in turn until the slow
    # one is 1 of 21, under MIN_STATE_SHARE (5 %)
    _scripted(monkeypatch, [1] * 8 + [9] + [1] * 12)
    states = message_tables._state_samples(comm, {key: (lambda: None, 1) for key in "abcdefghz"}, 1)
    assert all_ranks(comm, states.probes["z"] == [9, 1, 1] and [len(states.samples[key]) for key in "abc"] == [3, 3, 2])
    assert all_ranks(comm, sum(len(values) for values in states.probes.values()) == 21)


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


def test_the_samples_of_each_state_and_their_probes():
    states = StateSamples({"a": [1.0, 2.0, 3.0], "b": [4.0, 5.0]}, {"a": [1, 1, 9], "b": [9, 1]})
    assert states.in_state == {"a": [True, True, False], "b": [False, True]}
    assert states.kept() == {"a": [1.0, 2.0], "b": [5.0]} and states.others() == {"a": [3.0], "b": [4.0]}
    assert (states.handoff(), states.handoff(reference=False), states.other_count()) == (1.0, 9.0, 2)
    one = StateSamples({"a": [1.0, 2.0]}, {"a": [9, 9]})
    assert one.kept() == {"a": [1.0, 2.0]} and one.others() == {"a": []} and one.handoff(reference=False) is None


def test_the_other_states_seconds_fill_a_missed_entry_by_its_tables_median_ratio():
    reference = {("gemm", 8): 1.0, ("gemm", 16): 2.0, ("gemm", 32): 4.0, ("copy", 8): 1.0}
    assert other_state_seconds(reference, {("gemm", 8): 3.0, ("gemm", 16): 4.0}) == {
        ("gemm", 8): 3.0, ("gemm", 16): 4.0, ("gemm", 32): 10.0, ("copy", 8): 1.0}  # ratios 3, 2: median 2.5
    assert other_state_seconds(reference, {("copy", 8): 2.0})[("gemm", 32)] == 4.0  # a quarter: enough
    assert other_state_seconds(dict(reference, extra=1.0), {("copy", 8): 2.0}) is None  # 1 of 5: too few


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("probes, other", [((1e-4,), None), ((1e-4, 5e-4, 5e-4), 1e-4)])
def test_the_busy_rates_keep_each_states_samples_apart(comm, probes, other):
    turn = itertools.cycle(probes)
    rates = local_rates(1, comm, TINY, probe=lambda: next(turn))
    assert all_ranks(comm, rates["handoff_s"] == probes[-1] and min(rates["gemm"]["float64"]) > 0)
    if other is None:
        assert all_ranks(comm, "other_state" not in rates)
    else:  # the hunt gave every entry its samples in both states
        state = rates["other_state"]
        assert all_ranks(comm, state["handoff_s"] == other and set(state) == set(rates) - {"spread", "other_state"})
        assert all_ranks(comm, [n for n, _ in state["copy"]] == list(TINY.local_sizes) and state["kernel_rows"] > 0)
