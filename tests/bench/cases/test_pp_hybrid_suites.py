"""Suites ``pp`` and ``hybrid`` end to end through the command line, on tiny models."""
import json

import pytest

from kernels.errors import InputError
from parallel.pipeline.timeline import Timeline
from parallel.pipeline.schedule import bubble_fraction, idle_fraction
from tests.clitools import mlscale as run_mlscale
from tests.bench.flops_rows import assert_rates, dense_flops
from tests.clitools import rows_of as csv_rows

PP, HYBRID = "bench.cases.pp:PipelineSuite", "bench.cases.hybrid:Hybrid"
TINY_PP = dict(MLSCALE_PP_MICROBATCHES="4", MLSCALE_PP_WIDTH="24", MLSCALE_PP_LAYERS="3")
TINY_HYBRID = dict(MLSCALE_HYBRID_HIDDEN="12", MLSCALE_HYBRID_FFN="10", MLSCALE_HYBRID_MICROBATCHES="2")


def mlscale(settings, *args):
    """Run ``mlscale ARGS`` with the ``MLSCALE_*`` ``settings``; return (status, stdout, stderr)."""
    return run_mlscale(*args, **settings)


def rows_of(path):
    return [dict(row, params=json.loads(row["params"])) for row in csv_rows(path)]


def test_pp_sweep_checks_both_schedules_and_records_the_timeline(tmp_path):
    path = str(tmp_path / "pp.csv")
    status, out, err = mlscale(TINY_PP, "sweep", PP, "--np", "2", "--ranks", "1,2", "--sizes", "12",
                               "--iters", "2", "--warmup", "0", "--dtype", "float64", "--csv", path)
    assert status == 0, err
    assert "bubble=" in out
    rows = rows_of(path)
    assert [(row["ranks"], row["variant"]) for row in rows] == [(ranks, variant) for ranks in "12"
                                                                for variant in ("gpipe", "1f1b", "pipedream")]
    assert {row["wrong"] for row in rows} == {"0"} and {row["size_unit"] for row in rows} == {"samples"}
    for row in rows:
        params, ranks = row["params"], int(row["ranks"])
        assert row["metric"] == "bubble" and 0 <= float(row["metric_value"]) < 1 and float(row["items_per_s"]) > 0
        pipedream = row["variant"] == "pipedream"  # its steady state has no bubble
        assert params["theoretical_bubble"] == (0.0 if pipedream else round((ranks - 1) / (4 + ranks - 1), 4))
        assert sum(params["stage_layers"]) == 5 and len(params["stage_layers"]) == ranks
        expected_in_flight = [4] * ranks if row["variant"] == "gpipe" else [min(ranks - s, 4) for s in range(ranks)]
        if pipedream:  # stage s: s versions between forward and backward, as many stashed copies of its weights
            assert params["staleness"] == [ranks - 1 - s for s in range(ranks)]
            assert (params["stash_mib"][0] > 0) == (ranks > 1) and params["stash_mib"][-1] == 0
        assert params["peak_in_flight"] == expected_in_flight
        assert all(len(params[kind]) == ranks for kind in ("compute_s", "send_s", "wait_s", "step_s",
                                                            "peak_activation_mib"))
        # idle_fraction comes from the recorded per-step means (rounded to 1e-6 s; the share to 1e-4): the
        # same figure from the same numbers, within what that rounding moves it (<= 1e-6 s / max step).
        compute, steps = params["compute_s"], params["step_s"]
        assert params["idle_fraction"] == pytest.approx(idle_fraction(compute, steps),
                                                        abs=5e-5 + 1e-6 / (max(steps) - 5e-7))
        # Idle share of all stages = bubble of the busiest stage + what the faster ones wait for it. (The
        # metric, a median over the runs of each run's bubble, is not comparable with these means.)
        assert idle_fraction(compute, steps) >= bubble_fraction(compute, steps) - 1e-12
        assert params["stage_imbalance"] >= 0
        # Replayed with free messages, one stage has no bubble at all.
        assert 0 <= params["replayed_bubble"] < 1 and (ranks > 1 or params["replayed_bubble"] == 0)
        assert_rates(row, dense_flops(12, [24] * 4), ranks)


@pytest.mark.mpi(min_size=1)
def test_the_bubble_is_the_median_of_each_runs_bubble_and_may_exceed_the_idle_share_of_the_means(comm):
    # Three runs: rank 0 is the busiest (1 s of compute); the step takes 2, 2 and 1 s (every rank waits).
    timeline = Timeline()
    for step in (2.0, 2.0, 1.0):
        timeline.add(dict(compute=1.0 - comm.rank / (8 * comm.size), step=step))
    bubble = timeline.idle_share(comm, bubble_fraction)
    idle = timeline.idle_share(comm)
    compute = comm.allgather(timeline.per_step("compute"))
    of_means = idle_fraction(compute, comm.allgather(timeline.per_step("step")))
    # Per run: bubbles 0.5, 0.5, 0; idle shares 1 - mean(compute) / step.
    expected_idle = 1.0 - sum(1.0 - rank / (8 * comm.size) for rank in range(comm.size)) / (2.0 * comm.size)
    assert comm.allgather((bubble, idle)) == [(0.5, expected_idle)] * comm.size
    # The means give 1 - mean(compute) / (5 / 3 s): below the median bubble on every rank count, so the
    # pp sweep's idle_fraction (of the means) is no bound on its bubble metric (a median).
    assert of_means == pytest.approx(1.0 - 0.6 * sum(compute) / comm.size) and of_means < bubble


def test_pp_cnn_is_the_lectures_simplecnn_split_into_its_two_parts_and_checked_for_every_schedule(tmp_path):
    path = str(tmp_path / "pp.csv")
    status, out, err = mlscale(dict(MLSCALE_PP_MICROBATCHES="2"), "sweep", PP, "--np", "2", "--ranks", "1,2",
                               "--sizes", "6", "--iters", "1", "--warmup", "1", "--dtype", "float64",
                               "--set", "PP_MODEL=cnn", "--csv", path)
    assert status == 0, err
    rows = rows_of(path)
    assert [(row["ranks"], row["variant"]) for row in rows] == [(ranks, variant) for ranks in "12"
                                                                for variant in ("gpipe", "1f1b", "pipedream")]
    assert {row["wrong"] for row in rows} == {"0"}
    for row in rows:
        params = row["params"]
        assert params["model"] == "cnn" and sum(params["stage_params"]) == 21840
        if row["ranks"] == "2":  # ModelPart1: conv, pool, ReLU, conv, pool, ReLU; ModelPart2: flatten, fc, ReLU, fc
            assert params["balance"] == "parts" and params["stage_layers"] == [6, 4]
            assert params["stage_params"] == [10 * 25 + 10 + 20 * 250 + 20, 320 * 50 + 50 + 50 * 10 + 10]


def test_pp_balance_by_measured_time_gives_contiguous_stages_covering_the_model(tmp_path):
    path = str(tmp_path / "pp.csv")
    status, _, err = mlscale(dict(MLSCALE_PP_MICROBATCHES="2"), "sweep", PP, "--np", "3", "--variants", "1f1b",
                             "--sizes", "6", "--iters", "1", "--warmup", "0", "--set", "PP_MODEL=cnn", "--csv", path)
    assert status == 0, err
    (row,) = rows_of(path)
    assert row["wrong"] == "0" and row["params"]["balance"] == "time"
    assert sum(row["params"]["stage_layers"]) == 10 and min(row["params"]["stage_layers"]) >= 1


def test_pp_reports_the_activation_memory_of_the_timed_steps_not_of_the_smaller_check_step(tmp_path):
    # Above 256 samples the check trains on a 256-sample sample of the batch.
    path = str(tmp_path / "pp.csv")
    status, _, err = mlscale(TINY_PP, "run", PP, "--variants", "gpipe", "--sizes", "256,1024", "--iters", "1",
                             "--warmup", "0", "--csv", path)
    assert status == 0, err
    small, big = (row["params"]["peak_activation_mib"][0] for row in rows_of(path))
    assert big == pytest.approx(4 * small, rel=0.01)  # GPipe holds every micro-batch: memory grows with the batch


def _refusal(suite, environment, call):
    """The `InputError` message of ``call(case)`` for ``suite`` with the ``MLSCALE_*`` ``environment`` (its
    settings read as the command line reads them: an error there counts too)."""
    from bench.registry import case_class, get_case
    from bench.settings import resolve

    with pytest.raises(InputError) as refused:
        call(get_case(suite, resolve(case_class(suite).declared_settings, (), environment, suite)))
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_pp_impossible_settings_are_one_line_errors_with_status_2(tmp_path):
    """One launch for the command line's one line and status 2; the other refusals where the launch meets them."""
    status, _, err = mlscale(TINY_PP, "run", PP, "--variants", "1f1b", "--sizes", "10", "--csv", str(tmp_path / "x"))
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "global batch (10) must be a multiple of MLSCALE_PP_MICROBATCHES=4" in err
    for settings, call, message in [
            (dict(TINY_PP, MLSCALE_PP_BALANCE="flops"), None, "MLSCALE_PP_BALANCE='flops'"),
            (dict(TINY_PP, MLSCALE_PP_LAYERS="1"), lambda case: case.check_ranks(2, "1f1b"),
             "2 stages need at least 2 layers"),
            (dict(TINY_PP, MLSCALE_PP_BALANCE="parts"), lambda case: case.check_ranks(1, "1f1b"),
             "MLSCALE_PP_BALANCE=parts is the lecture's")]:
        assert message in _refusal(PP, settings, call or (lambda case: None)), message


def test_hybrid_sweep_runs_every_grid_that_fits_and_checks_it(tmp_path):
    path = str(tmp_path / "hybrid.csv")
    status, out, err = mlscale(dict(TINY_HYBRID, MLSCALE_HYBRID_GRID="2x1x2", MLSCALE_HYBRID_COLLECTIVES="ring"),
                               "sweep", HYBRID, "--np", "4",
                               "--ranks", "2,4", "--sizes", "8", "--iters", "1", "--warmup", "0", "--csv", path)
    assert status == 0, err
    assert "skipped dp_tp_pp on 4 ranks" in out
    rows = rows_of(path)
    shapes = [(row["ranks"], row["variant"], tuple(row["params"][axis] for axis in ("dp", "tp", "pp")))
              for row in rows]
    assert shapes == [("2", "dp", (2, 1, 1)), ("2", "tp", (1, 2, 1)), ("2", "pp", (1, 1, 2)),
                      ("4", "dp", (4, 1, 1)), ("4", "tp", (1, 4, 1)), ("4", "pp", (1, 1, 4)),
                      ("4", "dp_tp", (2, 2, 1)), ("4", "dp_pp", (2, 1, 2)), ("4", "tp_pp", (1, 2, 2)),
                      ("4", "grid", (2, 1, 2))]
    assert {row["wrong"] for row in rows} == {"0"}
    assert {json.loads(row["settings"])["MLSCALE_HYBRID_COLLECTIVES"] for row in rows} == {"ring"}  # the tp blocks' ring
    for row in rows:
        assert row["metric"] == "comm_share" and 0 <= float(row["metric_value"]) < 1
        assert len(row["params"]["tensor_s"]) == int(row["ranks"]) and float(row["items_per_s"]) > 0
        assert_rates(row, row["params"]["blocks"] * dense_flops(8, (12, 10, 12)), int(row["ranks"]))


def test_hybrid_impossible_grids_are_one_line_errors_with_status_2(tmp_path):
    status, _, err = mlscale(dict(TINY_HYBRID, MLSCALE_HYBRID_GRID="2x2"), "run", HYBRID, "--variants", "grid",
                             "--sizes", "8", "--csv", str(tmp_path / "x"))
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "MLSCALE_HYBRID_GRID='2x2': expected DPxTPxPP" in err
    for settings, variant, message in [
            (dict(MLSCALE_HYBRID_GRID="2x1x2"), "grid", "grid needs 4 ranks, not 1"),
            ({}, "grid", "needs MLSCALE_HYBRID_GRID"),
            ({}, "dp_tp", "1 ranks do not split over 2 axes")]:
        assert message in _refusal(HYBRID, dict(TINY_HYBRID, **settings),
                                   lambda case: case.check_ranks(1, variant)), message
