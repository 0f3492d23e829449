"""PNG plots of a report (matplotlib, no display needed), shaped by the suite's kind.

Communication suites: bus bandwidth against size per variant (one panel per rank
count >= 2, at most three: the largest counts) and, for latency tests, latency
against size. Compute suites: time and parallel efficiency against ranks (one
panel per size, at most three: smallest, middle, largest). Axes name the size
unit; an axis is logarithmic (base 2) where its values are powers of two. Each
series draws a light band from its points' fastest to slowest sample (``t_min_s``
.. ``t_max_s``, converted as the plotted quantity is: a bandwidth or an efficiency
goes as 1 / time), and an unstable point (`bench.report.scaling.unstable`) with an
open marker.
"""
import os
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the non-interactive backend
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from bench.report.analysis import spread  # noqa: E402
from bench.report.scaling import COMMUNICATION, unstable  # noqa: E402
from bench.units import format_size  # noqa: E402

MAX_PANELS = 3
#: Opacity of the min-max bands of one panel, together: each band gets its share (at most `BAND_ALPHA_MOST`), so
#: seven overlapping bands stay as light as two.
BAND_ALPHA, BAND_ALPHA_MOST = 0.4, 0.2


def plotted(x, value, point, inverse=False):
    """``(x, value, low, high, unstable)``: ``value`` at the point's median time and its band over the point's
    fastest and slowest samples; ``inverse`` for a quantity that goes as 1 / time (bandwidth, efficiency)."""
    fastest, slowest = point["t_min_s"] / point["t_med_s"], point["t_max_s"] / point["t_med_s"]
    low, high = (value / slowest, value / fastest) if inverse else (value * fastest, value * slowest)
    return x, value, low, high, unstable(point)


def _powers_of_two(values):
    return all(v > 0 and int(v) == v and int(v) & (int(v) - 1) == 0 for v in values)


def _figure(panels, title):
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 5), squeeze=False)
    figure.suptitle(title)
    return figure, axes[0]


def _draw(axis, series, xlabel, ylabel, logy=True):
    """One line per variant of ``series`` (variant -> [`plotted` tuples]) over its min-max band, unstable points
    with open markers; log2 x when every x is a power of two."""
    xs, shaky_seen = [], False
    alpha = min(BAND_ALPHA_MOST, BAND_ALPHA / max(1, len(series)))
    for variant, points in series.items():
        x, y, low, high, shaky = zip(*sorted(points))
        xs += x
        (line,) = axis.plot(x, y, marker="o", label=variant)
        axis.fill_between(x, low, high, color=line.get_color(), alpha=alpha, linewidth=0)
        opened = [(px, py) for px, py, flag in zip(x, y, shaky) if flag]
        if opened:
            shaky_seen = True
            axis.plot(*zip(*opened), linestyle="none", marker="o", markerfacecolor="white",
                      markeredgecolor=line.get_color(), zorder=line.get_zorder() + 0.1)
    handles = axis.get_legend_handles_labels()[0] + [Patch(color="gray", alpha=BAND_ALPHA_MOST,
                                                           label="fastest - slowest sample")]
    if shaky_seen:
        handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="white", markeredgecolor="gray",
                              label="unstable point"))
    if xs and _powers_of_two(xs):
        axis.set_xscale("log", base=2)
    if logy:
        axis.set_yscale("log")
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.grid(True, which="both", alpha=0.3)
    # under the panel: inside, a legend of many variants hides the lines and bands it names
    axis.legend(handles=handles, fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2),
                ncol=min(3, len(handles)), frameon=False)


def _save(figure, out_dir, name):
    path = os.path.join(out_dir, name)
    figure.tight_layout()
    figure.savefig(path, dpi=100, bbox_inches="tight")
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
                    series[p["variant"]].append(plotted(p["size"], p["busbw_gbs"], p, inverse=True))
            _draw(axis, series, f"size ({unit})", "busbw (GB/s)")
            axis.set_title(f"{table['ranks']} ranks")
        paths.append(_save(figure, out_dir, f"{suite}_bandwidth.png"))
    latency = [t for t in tables if len(t["latency"]) > 1]
    if latency:
        figure, axes = _figure(latency, f"{suite}: latency against size")
        for axis, table in zip(axes, latency):
            series, by_point = defaultdict(list), {(p["size"], p["variant"]): p for p in table["points"]}
            for r in table["latency"]:
                point = by_point[(r["size"], r["variant"])]
                series[r["variant"]].append(plotted(r["size"], r["latency_s"] * 1e6, point))
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
            inverse = key == "efficiency"
            figure, axes = _figure(sizes, f"{suite}: {label} against ranks ({scaling} scaling)")
            for axis, size in zip(axes, sizes):
                series = defaultdict(list)
                for e in entries:
                    if int(e["size"]) == size and e[key] is not None:
                        series[e["variant"]].append(plotted(e["ranks"], e[key], e, inverse))
                _draw(axis, series, "ranks", label, logy)
                axis.set_title(f"size {format_size(size)} {unit}")
            paths.append(_save(figure, out_dir, f"{suite}_{scaling}_{name}.png"))
    return paths
