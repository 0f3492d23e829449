"""PNG plots of a report (matplotlib, no display needed), shaped by the suite's kind.

Communication suites: bus bandwidth against size per variant (one panel per rank
count >= 2, at most three: the largest counts) and, for latency tests, latency
against size. Compute suites: time and parallel efficiency against ranks (one
panel per size, at most three: smallest, middle, largest). Axes name the size
unit; an axis is logarithmic (base 2) where its values are powers of two.
"""
import os
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the non-interactive backend

from bench.report.analysis import spread  # noqa: E402
from bench.report.scaling import COMMUNICATION  # noqa: E402
from bench.units import format_size  # noqa: E402

MAX_PANELS = 3


def _powers_of_two(values):
    return all(v > 0 and int(v) == v and int(v) & (int(v) - 1) == 0 for v in values)


def _figure(panels, title):
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    figure.suptitle(title)
    return figure, axes[0]


def _draw(axis, series, xlabel, ylabel, logy=True):
    """One line per variant of ``series`` (variant -> [(x, y)]); log2 x when every x is a power of two."""
    xs = []
    for variant, points in series.items():
        points = sorted(points)
        xs += [x for x, _ in points]
        axis.plot([x for x, _ in points], [y for _, y in points], marker="o", label=variant)
    if xs and _powers_of_two(xs):
        axis.set_xscale("log", base=2)
    if logy:
        axis.set_yscale("log")
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize="small")


def _save(figure, out_dir, name):
    path = os.path.join(out_dir, name)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_suites(reports, out_dir):
    """Write the plots of every suite report (`bench.report.analysis.analyse`); return their paths."""
    paths = []
    for report in reports:
        if report["kind"] == COMMUNICATION:
            paths += _communication(report, out_dir)
        else:
            paths += _compute(report, out_dir)
    return paths


def _communication(report, out_dir):
    suite, unit, paths = report["suite"], report["size_unit"], []
    tables = [t for t in report["communication"] if len(t["sizes"]) > 1][-MAX_PANELS:]
    if tables:
        figure, axes = _figure(tables, f"{suite}: bus bandwidth against size")
        for axis, table in zip(axes, tables):
            series = defaultdict(list)
            for p in table["points"]:
                if p["busbw_gbs"]:
                    series[p["variant"]].append((p["size"], p["busbw_gbs"]))
            _draw(axis, series, f"size ({unit})", "busbw (GB/s)")
            axis.set_title(f"{table['ranks']} ranks")
        paths.append(_save(figure, out_dir, f"{suite}_bandwidth.png"))
    latency = [t for t in tables if len(t["latency"]) > 1]
    if latency:
        figure, axes = _figure(latency, f"{suite}: latency against size")
        for axis, table in zip(axes, latency):
            series = defaultdict(list)
            for r in table["latency"]:
                series[r["variant"]].append((r["size"], r["latency_s"] * 1e6))
            _draw(axis, series, f"size ({unit})", "latency (us)")
            axis.set_title(f"{table['ranks']} ranks")
        paths.append(_save(figure, out_dir, f"{suite}_latency.png"))
    return paths


def _compute(report, out_dir):
    suite, unit, paths = report["suite"], report["size_unit"], []
    by_scaling = defaultdict(list)
    for entry in report["points"]:
        by_scaling[entry["scaling"]].append(entry)
    for scaling, entries in by_scaling.items():
        if len({e["ranks"] for e in entries}) < 2:
            continue
        sizes = spread({int(e["size"]) for e in entries}, MAX_PANELS)
        for key, label, logy, name in (("t_med_s", "time per run (s)", True, "time"),
                                       ("efficiency", "efficiency", False, "efficiency")):
            figure, axes = _figure(sizes, f"{suite}: {label} against ranks ({scaling} scaling)")
            for axis, size in zip(axes, sizes):
                series = defaultdict(list)
                for e in entries:
                    if int(e["size"]) == size and e[key] is not None:
                        series[e["variant"]].append((e["ranks"], e[key]))
                _draw(axis, series, "ranks", label, logy)
                axis.set_title(f"size {format_size(size)} {unit}")
            paths.append(_save(figure, out_dir, f"{suite}_{scaling}_{name}.png"))
    return paths
