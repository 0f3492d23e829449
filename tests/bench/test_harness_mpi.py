"""Timing and error agreement across the ranks of one job."""
import numpy as np
import pytest
from mpi4py import MPI

from bench import calibrate as calibration
from bench.calibrate import calibrate
from bench.message_tables import FULL_MESSAGES, QUICK_MESSAGES, SLOPE_FROM, MessagePlan
from bench.local_rates import FULL, QUICK, RatesPlan
from bench.provenance import mpi_library, placement
from bench.report.model import KEYS
from bench.faults import RankError, agree
from bench.stability import Resampling
from bench.state_tables import HUNT_ROUNDS
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
@pytest.mark.parametrize("seconds_per_run, repeats", [(1e-5, 100), (4e-4, 3), (1e-3, 1), (0.5, 1), (1e-9, 1000)])
def test_short_runs_are_repeated_within_a_sample(comm, seconds_per_run, repeats):
    now = [0.0]

    def run():  # the clock moves only while work runs: no real time enters the test
        now[0] += seconds_per_run

    timing = measure(comm, run, iters=3, warmup=1, clock=lambda: now[0])
    assert (timing.repeats, timing.iters) == (repeats, 3)
    assert timing.t_med == pytest.approx(seconds_per_run)


@pytest.mark.mpi(min_size=1)
def test_the_spread_is_the_interquartile_range_of_the_slowest_ranks_samples_over_their_median(comm):
    durations = iter([1.0, 1.0] + [1.0, 1.2, 1.1, 0.9, 5.0])  # warm-up and the agreed run, then five samples
    now = [0.0]

    def run():  # every rank's clock moves by the same scripted durations: no real time enters the test
        now[0] += next(durations)

    timing = measure(comm, run, iters=5, warmup=1, clock=lambda: now[0])
    q25, q75 = np.percentile([1.0, 1.2, 1.1, 0.9, 5.0], [25, 75])
    assert timing.t_med == pytest.approx(1.1) and timing.spread == pytest.approx((q75 - q25) / 1.1)
    assert timing.stable() and not timing.stable(max_spread=0.1)  # the outlier at 5 s does not count


@pytest.mark.mpi(min_size=1)
def test_an_unstable_point_is_sampled_again_until_stable_or_a_cap(comm):
    """Two samples of 1 s and 5 s (spread 0.67), then 1 s samples: stable at six samples, unless a cap stops
    it first (the extra time, or ten times --iters)."""
    def timed(resampling):
        durations = iter([1.0, 1.0, 1.0, 5.0] + [1.0] * 40)
        now = [0.0]

        def run():  # the clock moves only by the scripted durations, the same on every rank
            now[0] += next(durations)
        return measure(comm, run, iters=2, warmup=1, clock=lambda: now[0], resampling=resampling)

    for resampling, samples, stable in [
            (None, 2, False), (Resampling(0.25, 100.0), 6, True), (Resampling(0.25, 1.5), 4, False),
            (Resampling(0.25, 100.0, factor=2), 4, False), (Resampling(1.0, 100.0), 2, True)]:
        timing = timed(resampling)
        assert (timing.samples, timing.iters, timing.stable(resampling.max_spread if resampling else 0.25)) == (
            samples, 2, stable), resampling


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


OPEN_MPI_VERSION = "Open MPI v5.0.3, package: Open MPI root@host Distribution, ident: 5.0.3, Mar 29, 2024\x00"


def test_the_mpi_library_has_no_nul_byte(monkeypatch):
    monkeypatch.setattr(MPI, "Get_library_version", lambda: OPEN_MPI_VERSION)
    assert mpi_library() == OPEN_MPI_VERSION[:-1]


#: Smaller still than the quick plans (the test checks the tables' shapes, not their figures): both ends of
#: each table, two sizes from 1 MiB on for the bandwidth slope, the suites' kernels on tiny inputs.
TINY_MESSAGES = MessagePlan(sizes=(8, 1 << 20, 16 << 20), stream_sizes=(8, 4 << 20), library_sizes=(8, 1 << 10),
                            rounds=2, calls=(2, 1), hunt=0)
TINY_RATES = RatesPlan(gemm_sizes=(32, 64), thin_rows=(2, 8), thin_side=64, local_sizes=(8, 1 << 10, 32 << 20),
                       gemv_sides=(8, 64), moe_tokens=(16, 32),
                       dp_rows=(16, 64), smo_blocks=(80, 120),
                       suite_points=(("conv", "forward", 16), ("conv", "forward_backward", 16),
                                     ("attention", "full", 64)), rounds=2, least=0.0005, hunt=0)


@pytest.mark.mpi(min_size=2)
def test_calibrate_records_the_mpi_library_without_nul_and_every_constant(comm, monkeypatch):
    """A quick calibration on tiny plans of two rounds, so that every table has a spread (the full plans run in
    no test: 16-20 s here), the handoff probe's real exchanges timed but its figure steady: real ones may show
    the node's two states, which leave an entry one sample of each (the states: test_handoff_state)."""
    from bench import message_tables

    real = message_tables.handoff_prober

    def steady(pair):
        prober = real(pair)
        return lambda: prober() * 0 + 1e-4
    monkeypatch.setattr(message_tables, "handoff_prober", steady)
    monkeypatch.setattr(MPI, "Get_library_version", lambda: OPEN_MPI_VERSION)
    monkeypatch.setattr(calibration, "QUICK_MESSAGES", TINY_MESSAGES)
    monkeypatch.setattr(calibration, "QUICK", TINY_RATES)
    monkeypatch.setenv("MLSCALE_COLL_ROOT", "7")        # MPI's collectives are timed at their defaults,
    monkeypatch.setenv("MLSCALE_COLL_IN_PLACE", "1")    # whatever the suites' settings say
    QUICK_MESSAGES, QUICK = TINY_MESSAGES, TINY_RATES  # what the tables below hold
    constants = calibrate(comm, quick=True)
    assert constants["mpi_library"] == OPEN_MPI_VERSION[:-1] and constants["quick"] is True
    assert {"pingpong", "exchange", "stream", "allreduce", "one_thread"} <= set(constants["spread"])
    spreads = [*constants["spread"].values(), *constants["spread"]["one_thread"].values()]
    assert all(isinstance(value, float) and value >= 0 for value in spreads if not isinstance(value, dict))
    assert comm.allgather(constants) == [constants] * comm.size
    assert set(KEYS) <= set(constants) and constants["scope"] in ("intra-node", "inter-node")
    assert all(constants[key] > 0 for key in ("alpha_s", "beta_s_per_byte", "overhead_s", "gamma_s_per_byte"))
    assert len(constants["kernel_rows"]) == 2 and min(constants["kernel_rows"]) > 0  # one thread, all cores
    sizes = list(QUICK_MESSAGES.sizes)
    assert [n for n, _ in constants["pingpong"]] == [n for n, _ in constants["exchange"]] == sizes
    assert [n for n, _ in constants["oneway"]] == sizes and constants["spread"]["oneway"] >= 0
    assert [n for n, _ in constants["exchange_fresh"]] == sizes and constants["spread"]["exchange_fresh"] >= 0
    assert [n for n, _ in constants["allreduce"]] == sizes and sizes[0] == 8 and sizes[-1] == 16 << 20
    assert [n for n, _ in constants["stream"]] == list(QUICK_MESSAGES.stream_sizes)
    assert set(constants["library"]) == {"allgather", "reduce_scatter", "alltoall", "bcast", "reduce"}
    assert constants["handoff_s"] == 1e-4 and constants["handoff_other_samples"] == 0
    assert all([n for n, _ in table] == [8, 1 << 10] and min(t for _, t in table) > 0
               for table in constants["library"].values())
    assert [rows for rows, _ in constants["dp_step"]["float32"]] == constants["dp_rows"] == list(QUICK.dp_rows)
    assert [nbytes for nbytes, _ in constants["gemv"]["float32"]] == [4 * 8 * 8, 4 * 64 * 64]
    assert [tokens for tokens, _ in constants["moe_step"]["float64"]] == [16, 32]
    assert [block for block, _ in constants["smo_iteration"]["float64"]] == [80, 120]
    assert all(len(pair) == 2 and min(pair) > 0 for _, pair in constants["smo_iteration"]["float64"])
    assert constants["spread"]["one_thread"]["smo_iteration"] >= 0
    assert all(len(pair) == 2 and min(pair) > 0 for _, pair in constants["gemv"]["float64"])  # one thread, all cores
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    ranks_with_zero = comm.bcast(node.size, root=0)  # every rank of rank 0's node measures the busy rates
    node.Free()
    assert ("busy" in constants) == (ranks_with_zero > 1)
    if ranks_with_zero > 1:
        busy = constants["busy"]
        assert busy["ranks"] == ranks_with_zero and busy["threads"] >= 1 and busy["handoff_s"] == 1e-4
        assert set(busy["conv"]["float64"]) == {"forward", "forward_backward"}
        assert [n for n, _ in busy["reduce"]] == list(QUICK.local_sizes)
        assert [n for n, _ in busy["gemv"]["float64"]] == [8 * 8 * 8, 8 * 64 * 64]
        assert [block for block, seconds in busy["smo_iteration"]["float64"] if seconds > 0] == [80, 120]
    assert len(constants["gemm"]["float64"][0]) == len(constants["gemm_sizes"]) == len(QUICK.gemm_sizes)
    assert len(constants["gemm_thin"]["float32"][1]) == len(constants["thin_rows"]) == 2
    assert constants["thin_side"] == 64 and all(rate > 0 for rate in constants["gemm_thin"]["float64"][0])
    assert set(constants["conv"]["float32"]) == {"forward", "forward_backward"}


def test_the_quick_plans_keep_what_the_models_fit():
    """Both ends of every table, two sizes from 1 MiB on for the bandwidth slope, sizes rising."""
    for full, quick in ((FULL_MESSAGES.sizes, QUICK_MESSAGES.sizes), (FULL_MESSAGES.stream_sizes,
                        QUICK_MESSAGES.stream_sizes), (FULL.local_sizes, QUICK.local_sizes),
                        (FULL.gemm_sizes, QUICK.gemm_sizes), (FULL.dp_rows, QUICK.dp_rows),
                        (FULL.thin_rows, QUICK.thin_rows), (FULL.gemv_sides, QUICK.gemv_sides), (FULL.moe_tokens, QUICK.moe_tokens),
                        (FULL.smo_blocks, QUICK.smo_blocks),
                        (FULL_MESSAGES.library_sizes,
                                                            QUICK_MESSAGES.library_sizes)):
        assert quick[0] == full[0] and set(quick) <= set(full) and list(quick) == sorted(set(quick))
    assert QUICK_MESSAGES.sizes[-1] == FULL_MESSAGES.sizes[-1] and QUICK.local_sizes[-1] == FULL.local_sizes[-1]
    assert sum(n >= SLOPE_FROM for n in QUICK_MESSAGES.sizes) >= 2
    assert QUICK.rounds == QUICK_MESSAGES.rounds == 1 and QUICK.hunt == QUICK_MESSAGES.hunt == 0  # a quick look
    assert FULL.hunt == FULL_MESSAGES.hunt == HUNT_ROUNDS


@pytest.mark.mpi(min_size=2)
def test_a_failure_of_rank_zero_measuring_alone_is_raised_on_every_rank(comm, monkeypatch):
    from bench import calibrate as module

    def fails_alone(cores, plan):
        raise ZeroDivisionError("on purpose")

    monkeypatch.setattr(module, "measure_pair", lambda pair, plan: {} if pair.rank == 0 else None)
    monkeypatch.setattr(module, "local_rates", lambda threads, comm=None, plan=None, probe=None: {})
    monkeypatch.setattr(module, "_alone_rates", fails_alone)
    with pytest.raises(RankError, match="^rank 0: ZeroDivisionError: on purpose$"):
        calibrate(comm)


@pytest.mark.mpi(min_size=1)
def test_placement_counts_shared_memory_nodes(comm, monkeypatch):
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    expected = comm.allreduce(int(node.rank == 0)), node.size
    node.Free()
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    where = placement(comm)
    assert (where.nodes, where.ranks_here, where.note) == (*expected, None)


@pytest.mark.mpi(min_size=2)
def test_placement_notes_when_slurm_names_other_nodes(comm, monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", f"n{comm.rank}")
    where = placement(comm)
    assert (where.note is None) == (where.nodes == comm.size)
    assert where.note is None or f"but Slurm names {comm.size} (SLURMD_NODENAME)" in where.note
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    same = placement(comm)
    assert (same.note is None) == (same.nodes == 1)


@pytest.mark.mpi(min_size=1)
def test_a_point_that_fails_on_every_rank_is_torn_down_and_the_csv_closed(comm, tmp_path):
    from bench.sweep import SweepConfig, run_sweep
    from tests.fake_cases import CheckFailsEverywhere

    path = comm.bcast(str(tmp_path / "fake.csv"), root=0)
    config = SweepConfig(suite="fake", variants=["only"], sizes=[4], ranks=[comm.size], csv_path=path, dtype="float64")
    case = CheckFailsEverywhere()
    with pytest.raises(InputError, match="unusable on purpose"):
        run_sweep(comm, case, config, emit=lambda row: None)
    assert case.torn_down == [comm.size]
    if comm.rank == 0:  # the lock is released: the file can be taken again at once
        from bench.csvio import ResultsFile

        ResultsFile(path).close()
