"""Reports shaped by the kind of suite: bandwidth for communication, scaling for compute, a digest first."""
import pytest

from bench.report.analysis import GENERIC_SUPERLINEAR_REASON, digest, spread
from bench.report.output import write_report
from bench.report.plots import _powers_of_two
from bench.report.scaling import scaling_table
from bench.report.summary import format_time
from tests.bench.report_rows import as_read, p2p_points, point, write_points

SIZES = (8, 1024, 1 << 20)


def allreduce_points():
    """mpi, ring (2x slower) and tree (1.25x faster) on 1, 2, 4 ranks."""
    return [point(v, p, t * s, size=s, suite="allreduce")
            for v, t in (("mpi", 1e-9), ("ring", 2e-9), ("tree", 0.8e-9)) for p in (1, 2, 4) for s in SIZES]


def report_of(tmp_path, points, name="a.csv", **options):
    path = write_points(tmp_path / name, points)
    _, document = write_report([path], str(tmp_path / "out"), plots=options.pop("plots", False), **options)
    summary = (tmp_path / "out" / "summary.md").read_text()
    return {s["suite"]: s for s in document["suites"]}, summary


def test_a_collective_leads_with_bus_bandwidth_ratio_to_mpi_and_the_average(tmp_path):
    suites, summary = report_of(tmp_path, allreduce_points())
    allreduce = suites["allreduce"]
    assert allreduce["kind"] == "communication" and allreduce["fits"] == [] and allreduce["superlinear"] == []
    (two, four) = allreduce["communication"]  # one rank sends nothing: no table
    assert (two["ranks"], four["ranks"]) == (2, 4)
    busbw_ring_2 = [p["busbw_gbs"] for p in two["points"] if p["variant"] == "ring"]
    assert two["average_busbw"]["ring"] == pytest.approx(sum(busbw_ring_2) / len(busbw_ring_2))
    assert {p["variant"]: p["vs_ref"] for p in four["points"] if p["size"] == 1024} == pytest.approx(
        {"mpi": 1.0, "ring": 0.5, "tree": 1.25})
    for heading in ("### Bus bandwidth (GB/s) against size, 2 ranks", "### Ratio to mpi (T_mpi / T) against size, "
                    "4 ranks", "### Time, algbw and busbw per variant, 4 ranks"):
        assert heading in summary
    assert "Average bus bandwidth: mpi " in summary
    assert "| 1K | 0.50x | 1.25x |" in summary
    for word in ("speedup", "efficiency", "Karp-Flatt", "serial fraction", "Projected"):
        assert word.lower() not in summary.lower()


def test_p2p_has_a_latency_table_and_plot_and_no_ratio_between_latency_and_bandwidth(tmp_path):
    suites, summary = report_of(tmp_path, p2p_points(SIZES), plots=True)
    p2p = suites["p2p"]
    (table,) = p2p["communication"]
    assert all(p["vs_ref"] is None for p in table["points"] if p["variant"] == "bandwidth")
    assert [r["size"] for r in table["latency"]] == list(SIZES)
    assert table["latency"][0]["latency_s"] == pytest.approx(3e-6 + 8e-10)
    assert p2p["digest"] == []
    assert "### Latency against size, 2 ranks" in summary and "| 8 | latency | 3.00 us |" in summary
    assert "- 2 ranks: latency 3.00 us at 8 bytes, 107.86 us at 1M bytes" in summary
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"p2p_bandwidth.png", "p2p_latency.png"} <= names
    assert not any("efficiency" in name for name in names)


def test_summary_opens_with_a_digest_of_the_best_variant_per_size_and_rank_count(tmp_path):
    points = allreduce_points() + [point(v, p, t / p, size=s) for v, t in (("numpy", 1.0), ("rows", 1.5))
                                   for p in (1, 2, 4) for s in (100, 200)]
    suites, summary = report_of(tmp_path, points)
    digest_at, details_at = summary.index("## Digest"), summary.index("## allreduce: details")
    assert digest_at < summary.index("### gemv (compute; reference numpy)") < details_at
    assert "| 1K | tree 1.25x (0.82 us) | tree 1.25x (0.82 us) |" in summary[:details_at]
    (gemv,) = suites["gemv"]["digest"]
    assert gemv["cells"]["100 4"] == {"variant": "numpy", "t_med_s": 0.25, "vs_ref": 1.0, "efficiency": 1.0}
    assert gemv["ranks"] == [1, 2, 4] and suites["allreduce"]["digest"][0]["ranks"] == [2, 4]


def test_a_digest_shows_at_most_six_sizes_spread_over_the_range():
    assert spread(range(20), 6) == [0, 4, 8, 11, 15, 19]
    assert spread([3, 1, 2], 6) == [1, 2, 3]
    rows = as_read([point(v, 2, 1e-3, size=1 << k) for v in ("numpy", "rows") for k in range(12)])
    (table,) = digest(scaling_table(rows), "numpy", "compute")
    assert len(table["sizes"]) == 6 and table["sizes_measured"] == 12
    assert table["sizes"][0] == 1 and table["sizes"][-1] == 1 << 11


def test_compute_suites_show_speedup_with_the_suites_own_metric_and_accuracy(tmp_path):
    points = [point("mpi", p, 1.0 / p, size=64, suite="dp", size_unit="samples", metric="comm_share",
                    metric_value=0.25, params={"test_accuracy": 0.875}) for p in (1, 2)]
    suites, summary = report_of(tmp_path, points)
    assert "| vs mpi | comm_share | accuracy |" in summary
    assert "| mpi | strong | 64 | 2 | 500.00 ms | 2.000 | 1.000 | 0.000 | 1.00x | 0.250 | 0.875 |" in summary
    assert suites["dp"]["points"][1]["accuracy"] == 0.875


def test_dp_is_compared_with_its_framework_reference_when_measured_else_with_mpi(tmp_path):
    def dp(variant, ranks, seconds):
        return point(variant, ranks, seconds, size=64, suite="dp", size_unit="samples", metric="comm_share",
                     metric_value=0.0)

    suites, summary = report_of(tmp_path, [dp("keras", 1, 0.25), dp("mpi", 1, 1.0), dp("mpi", 2, 0.5)])
    assert suites["dp"]["reference"] == "keras" and "| vs keras | comm_share |" in summary
    assert [p["vs_ref"] for p in suites["dp"]["points"] if p["variant"] == "mpi"] == [0.25, 0.5]
    suites, _ = report_of(tmp_path / "without", [dp("mpi", 1, 1.0), dp("mpi", 2, 0.5)])
    assert suites["dp"]["reference"] == "mpi"


def test_superlinear_speedup_is_flagged_with_the_suites_reason_or_a_generic_one(tmp_path):
    times = {("sklearn", 1): 1.0, ("casvm", 1): 2.0, ("casvm", 2): 0.5, ("casvm", 4): 0.49,
             ("dis_smo", 1): 2.0, ("dis_smo", 2): 0.96}
    points = [point(v, p, t, size=500, suite="svm", size_unit="samples", metric="accuracy", metric_value=0.9)
              for (v, p), t in times.items()]
    points += [point("rows", p, 1.0 / p ** 1.5) for p in (1, 2)]
    suites, summary = report_of(tmp_path, points)
    flagged = {(s["variant"], s["ranks"]): s["reason"] for s in suites["svm"]["superlinear"]}
    assert list(flagged) == [("casvm", 2)]  # 2 ranks: efficiency 2.0; 4 ranks 1.02 and dis_smo 1.04: within noise
    assert "smaller problems, not the same one faster" in flagged[("casvm", 2)]
    assert [s["reason"] for s in suites["gemv"]["superlinear"]] == [GENERIC_SUPERLINEAR_REASON]
    assert "| 2.000 (superlinear) |" in summary and "### Superlinear points (efficiency above 1.05)" in summary


@pytest.mark.parametrize("seconds, text", [(3.5e-6, "3.50 us"), (9.994e-4, "999.40 us"), (1e-3, "1.00 ms"),
                                           (0.25, "250.00 ms"), (2.5, "2.50 s"), (None, "")])
def test_times_are_shown_in_a_unit_that_fits(seconds, text):
    assert format_time(seconds) == text


def test_log_axes_only_for_powers_of_two():
    assert _powers_of_two([1, 2, 8, 1 << 20]) and not _powers_of_two([1, 2, 3, 4]) and not _powers_of_two([0, 2])
