"""The batch-size table of training sweeps: time per epoch and peak memory against the global batch."""
import json
import math

import pytest

from bench.report.output import write_report
from tests.bench.report_rows import point, write_points

HEADING = "| batch size | time per epoch (s) | peak memory (MiB) |"


def dp_point(batch, ranks, seconds, model="mlp", scaling="strong", **params):
    settings = "{}" if model == "mlp" else json.dumps({"MLSCALE_DP_MODEL": model})
    return point("mpi", ranks, seconds, size=batch, scaling=scaling, suite="dp", size_unit="samples",
                 metric="comm_share", metric_value=0.1, settings=settings, params=dict(params, model=model))


def batch_tables(tmp_path, points, name="dp"):
    path = write_points(tmp_path / f"{name}.csv", points)
    _, document = write_report([path], str(tmp_path / name), plots=False)
    (dp,) = document["suites"]
    return dp["batch_size"], (tmp_path / name / "summary.md").read_text()


def test_time_per_epoch_is_the_measured_step_times_the_steps_per_epoch_per_model_and_rank_count(tmp_path):
    points = [dp_point(b, p, 1e-3 * b / p, model, samples_per_epoch=4000, peak_memory_mib=100.0 + b)
              for model in ("cnn", "keras_cnn") for p in (1, 2) for b in (32, 64, 128, 256, 3000)]
    tables, summary = batch_tables(tmp_path, points)
    assert [(t["model"], t["ranks"]) for t in tables] == [("cnn", 1), ("cnn", 2), ("keras_cnn", 1), ("keras_cnn", 2)]
    rows = tables[1]["rows"]
    assert [r["batch"] for r in rows] == [32, 64, 128, 256, 3000]
    for row in rows:
        assert row["time_per_epoch_s"] == pytest.approx(1e-3 * row["batch"] / 2 * math.ceil(4000 / row["batch"]))
        assert row["peak_memory_mib"] == 100.0 + row["batch"] and row["time_source"] == "measured"
    assert summary.count(HEADING) == 4
    assert "### Batch size: model keras_cnn, 2 ranks, numpy (float64, mpi, strong scaling" in summary
    assert f"{HEADING}\n|---|---|---|\n| 32 | 2.000 | 132.0 |\n| 64 | 2.016 | 164.0 |" in summary
    assert "| 3000 | 3.000 | 3100.0 |" in summary  # ceil(4000 / 3000) = 2 steps of 1.5 s


def test_missing_memory_is_na_and_older_rows_use_the_suites_epoch_estimate(tmp_path):
    points = [dp_point(32, 1, 1e-3, samples_per_epoch=4000), dp_point(64, 1, 2e-3, epoch_s_estimate=0.126),
              dp_point(128, 1, 4e-3, samples_per_epoch=4000, peak_memory_mib=float("nan")), dp_point(256, 1, 8e-3)]
    (table,), summary = batch_tables(tmp_path, points[:3])
    assert [r["peak_memory_mib"] for r in table["rows"]] == [None, None, None]
    assert [r["time_source"] for r in table["rows"]] == ["measured", "estimate", "measured"]
    assert "| 32 | 0.125 | n/a |\n| 64 | 0.126 (estimate) | n/a |\n| 128 | 0.128 | n/a |" in summary
    tables, _ = batch_tables(tmp_path, points[3:], name="bare")
    assert tables == []  # neither samples per epoch nor an estimate: not a training sweep's point


def test_the_batch_is_the_global_one_under_weak_scaling(tmp_path):
    points = [dp_point(32, p, 1e-3, scaling="weak", samples_per_epoch=4000) for p in (1, 2)]
    tables, _ = batch_tables(tmp_path, points)
    assert [(t["ranks"], t["rows"][0]["batch"]) for t in tables] == [(1, 32), (2, 64)]
    assert tables[1]["rows"][0]["time_per_epoch_s"] == pytest.approx(1e-3 * math.ceil(4000 / 64))


def test_suites_without_epochs_have_no_batch_size_table(tmp_path):
    path = write_points(tmp_path / "pp.csv", [point("gpipe", p, 1.0 / p, size=64, suite="pp", size_unit="samples",
                                                    params={"model": "mlp"}) for p in (1, 2)])
    _, document = write_report([path], str(tmp_path / "out"), plots=False)
    assert document["suites"][0]["batch_size"] == []
    assert HEADING not in (tmp_path / "out" / "summary.md").read_text()
