"""Unstable points in a report: marked in every table, left out of the digest's claims and the model errors,
drawn open over each series' min-max band."""
import csv
import re

import matplotlib.pyplot as plt
import pytest

from bench.report.output import write_report
from bench.report.plots import _draw, plotted
from bench.report.summary import LEGEND, MARK
from tests.bench.report_rows import CALIB, judged, p2p_points, point, write_points

#: (variant, size, ranks) measured unstable: the 8-byte cell all through, tree's 1K, the reference's 4K...
UNSTABLE = {("mpi", 8, 2), ("ring", 8, 2), ("tree", 8, 2), ("tree", 1024, 2), ("mpi", 4096, 2),
            ("rows", 100, 4), ("cols", 100, 2), ("latency", 8, 2), ("mpi", 32, 1)}
#: ...and ring's 1K from a file written before the columns: unknown, counted as stable.
UNKNOWN = {("ring", 1024, 2)}


def sweep_points():
    """allreduce (mpi; ring 2x slower; tree 1.25x faster) on 2 ranks, gemv on 1, 2, 4 (cols superlinear at 2),
    p2p's latency and bandwidth, dp's batch sizes."""
    points = [point(v, 2, t * s, size=s, suite="allreduce") for v, t in (("mpi", 1e-9), ("ring", 2e-9),
                                                                          ("tree", 0.8e-9)) for s in (8, 1024, 4096)]
    points += [point(v, p, t / p, size=100) for v, t in (("numpy", 1.0), ("rows", 1.5)) for p in (1, 2, 4)]
    points += [point("cols", 1, 2.0, size=100), point("cols", 2, 0.5, size=100)]
    points += p2p_points((8, 1024))
    points += [point("mpi", 1, 1e-3 * b, size=b, suite="dp", size_unit="samples", metric="comm_share",
                     metric_value=0.1, params={"model": "mlp", "samples_per_epoch": 4000}) for b in (32, 64)]
    return judged(points, UNSTABLE, UNKNOWN)


def report(tmp_path, points, calib=None, plots=False):
    path = write_points(tmp_path / "a.csv", points)
    out = tmp_path / "out"
    notes, document = write_report([path], str(out), calib, plots=plots)
    return notes, {s["suite"]: s for s in document["suites"]}, (out / "summary.md").read_text(), out


def sections(summary):
    """Each ``###`` section of summary.md as (heading, its table rows and list items, its other lines)."""
    for section in summary.split("\n### ")[1:]:
        heading, *lines = section.splitlines()
        table = [line for line in lines if line.startswith(("|", "- "))]
        yield heading, table, [line for line in lines if line not in table]


def test_every_table_marks_unstable_figures_and_has_the_legend_under_it(tmp_path):
    _, _, summary, _ = report(tmp_path, sweep_points())
    for line in ("| 1K | 1.000 | 0.500 | 1.250~ |",  # bus bandwidth: tree's 1K; ring's unknown one unmarked
                 "| 4K | 0.50x~ | 1.25x~ |", "| 1K | 0.50x | 1.25x~ |",  # ratios: the reference's 4K, tree's 1K
                 "| 1K | tree | 0.82 us~ | 1.250 |", "| 1K | ring | 2.05 us | 0.500 |",  # time, algbw, busbw
                 "| rows | strong | 100 | 4 | 375.00 ms~ | 4.000 | 1.000 | 0.000 | 0.67x~ |",  # compute: time, ratio
                 "| rows | strong | 100 | 2 | 750.00 ms | 2.000 | 1.000 | 0.000 | 0.67x |",
                 "| rows | 100 | amdahl | 0.000~ | 1 2 4 |", "| numpy | 100 | amdahl | 0.000 | 1 2 4 |",  # fits
                 "| 8 | latency | 3.00 us~ |", "| 1K | latency | 3.10 us |",  # p2p latency
                 "| 32 | 4.000~ | n/a |", "| 64 | 4.032 | n/a |",  # dp's time per epoch
                 "- cols, 100 n, 2 ranks (numpy, float64, strong): efficiency 2.00~;",  # superlinear, yet unstable
                 "- 2 ranks: latency 3.00 us~ at 8 bytes, 3.10 us at 1K bytes",
                 "average bus bandwidth mpi 1 GB/s~, ring 0.5 GB/s~, tree 1.25 GB/s~"):
        assert line in summary, line
    marked = 0
    for heading, table, other in sections(summary):
        if "; reference " in heading:  # a digest: its best-variant cells hold stable points only
            assert not any(MARK in line for line in table if line.startswith("|")) and LEGEND not in other
            continue
        has_mark = any(MARK in line for line in table)
        assert (LEGEND in other) == has_mark, (table, other)
        marked += has_mark
        assert all(cell.count(MARK) <= 1 for line in table for cell in line.split("|"))  # ~~ strikes through
    assert marked == 11 and summary.count(LEGEND) == 11
    for at in (m.start() for m in re.finditer(re.escape(LEGEND), summary)):
        # after the table's blank line (a line right under a table would be a row of it)
        assert summary[:at].endswith("\n\n") and summary[:at].rstrip().splitlines()[-1].startswith(("|", "- "))
    for stable_only in (judged(sweep_points()), judged(sweep_points(), unknown={tuple(r[c] for c in (
            "variant", "size", "ranks")) for r in sweep_points()})):
        _, _, clean, _ = report(tmp_path, stable_only)
        assert MARK not in clean and LEGEND not in clean and "unstable" not in clean


def test_scaling_csv_fits_csv_and_the_json_carry_each_points_stability(tmp_path):
    _, suites, _, out = report(tmp_path, sweep_points())
    with open(out / "scaling.csv") as handle:
        table = {(r["variant"], r["size"], r["ranks"]): r for r in csv.DictReader(handle)}
    expected = {("tree", "1024", "2"): ("0.6", "0"), ("ring", "1024", "2"): ("", ""),
                ("mpi", "1024", "2"): ("0.05", "1")}
    assert {key: (table[key]["spread"], table[key]["stable"]) for key in expected} == expected
    with open(out / "fits.csv") as handle:
        assert {r["variant"]: r["unstable_points"] for r in csv.DictReader(handle)} == {
            "numpy": "0", "rows": "1", "cols": "1"}
    points = {(p["variant"], p["size"]): p for p in suites["allreduce"]["points"]}
    assert [points[(v, "1024")]["stable"] for v in ("tree", "ring", "mpi")] == [False, None, True]
    assert points[("tree", "4096")]["ref_stable"] is False and points[("tree", "1024")]["ref_stable"] is True
    assert points[("tree", "1024")]["spread"] == 0.6 and points[("ring", "1024")]["spread"] is None
    (table,) = suites["allreduce"]["communication"]
    assert {(p["variant"], p["size"]): p["stable"] for p in table["points"]}[("tree", 1024)] is False
    assert [r["stable"] for r in suites["p2p"]["communication"][0]["latency"]] == [False, True]
    assert [r["stable"] for r in suites["dp"]["batch_size"][0]["rows"]] == [False, True]
    assert [(s["variant"], s["stable"]) for s in suites["gemv"]["superlinear"]] == [("cols", False)]


def test_the_digest_and_the_model_errors_leave_unstable_points_out_and_say_how_many(tmp_path):
    notes, suites, summary, _ = report(tmp_path, sweep_points(), CALIB)
    (allreduce,) = suites["allreduce"]["digest"]
    assert allreduce["unstable_left_out"] == 5 and allreduce["unstable_cells"] == 1
    assert "8 2" not in allreduce["cells"]  # every point of the cell unstable: no claim
    assert allreduce["cells"]["1024 2"]["variant"] == "mpi"  # tree was faster, but unstable
    assert allreduce["cells"]["4096 2"] == {"variant": "tree", "t_med_s": pytest.approx(3.2768e-6), "vs_ref": None,
                                            "efficiency": None}  # the reference's point unstable: no ratio
    digest = summary[summary.index("### allreduce (communication"):summary.index("### gemv (compute")]
    for line in ("- 5 of 9 points unstable (spread, the interquartile range of a point's samples over their median, "
                 "above the sweep's --max-spread, 0.25 by default): marked `~` in every table, left out of the "
                 "best-variant claims and the model errors",
                 "| 8 |  |", "| 1K | mpi 1.00x (1.02 us) |", "| 4K | tree (3.28 us; mpi unstable) |",
                 "\n5 unstable points left out; 1 cell had no stable point.\n"):
        assert line in digest, line
    (gemv,) = suites["gemv"]["digest"]
    assert (gemv["unstable_left_out"], gemv["unstable_cells"]) == (2, 0)
    assert gemv["cells"]["100 2"]["variant"] == "numpy"  # cols' 0.5 s at 2 ranks is unstable
    assert "\n2 unstable points left out.\n" in summary
    errors = {line.split()[1]: line for line in notes if "model error" in line}
    # allreduce: 4 stable points, ring's unknown 1K among them; gemv: rows at 2 ranks (numpy has no model)
    assert re.fullmatch(r"report: allreduce model error at >= 2 ranks: median \d+%, max \d+% over 4 stable points; "
                        r"5 unstable left out", errors["allreduce"])
    assert errors["gemv"].endswith(" over 1 stable point; 2 unstable left out")
    assert f"- {errors['allreduce'].removeprefix('report: ')}" in summary


def test_plots_draw_each_series_min_max_band_and_unstable_points_open(tmp_path):
    samples = dict(t_min_s=0.9, t_med_s=1.0, t_max_s=1.5)
    assert plotted(8, 2.0, dict(samples, stable=False), inverse=True) == (8, 2.0, 2.0 / 1.5, 2.0 / 0.9, True)
    assert plotted(8, 2.0, dict(samples, stable=None)) == (8, 2.0, 1.8, 3.0, False)
    for shaky in (True, False):
        figure, axis = plt.subplots()
        series = {"mpi": [plotted(s, 1.0 * s, dict(samples, stable=not (shaky and s == 4))) for s in (2, 4, 8)],
                  "ring": [plotted(s, 0.5 * s, dict(samples, stable=True)) for s in (2, 4, 8)]}
        _draw(axis, series, "size", "time")
        bands = [c.get_paths()[0].vertices[:, 1] for c in axis.collections]
        assert [(b.min(), b.max()) for b in bands] == [pytest.approx((1.8, 12.0)), pytest.approx((0.9, 6.0))]
        opened = [line for line in axis.lines if line.get_markerfacecolor() == "white"]
        assert [list(line.get_xdata()) for line in opened] == ([[4]] if shaky else [])
        labels = [t.get_text() for t in axis.get_legend().get_texts()]
        assert labels == ["mpi", "ring", "fastest - slowest sample"] + (["unstable point"] if shaky else [])
        plt.close(figure)
    _, _, _, out = report(tmp_path, sweep_points(), plots=True)
    names = {p.name for p in out.iterdir()}
    assert {"allreduce_bandwidth.png", "p2p_latency.png", "gemv_strong_time.png", "gemv_strong_efficiency.png"} <= names
