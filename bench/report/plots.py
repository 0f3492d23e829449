"""PNG plots of a scaling table (matplotlib, no display needed).

Per suite: time against ranks and parallel efficiency against ranks (log axes,
one panel per message/problem size, at most three sizes: smallest, middle,
largest), and, for suites with a bus bandwidth, bandwidth against size (one panel
per rank count, at most three: the largest counts).
"""
import os
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the non-interactive backend

from bench.units import format_size  # noqa: E402

MAX_PANELS = 3


def _spread(values):
    """At most `MAX_PANELS` values: the smallest, the middle and the largest."""
    values = sorted(values)
    if len(values) <= MAX_PANELS:
        return values
    return [values[0], values[len(values) // 2], values[-1]]


def _series(entries, x_key, y_key):
    lines = defaultdict(list)
    for entry in entries:
        if entry[y_key] is not None:
            lines[entry["variant"]].append((entry[x_key], entry[y_key]))
    return {variant: sorted(points) for variant, points in lines.items()}


def _figure(panels, title):
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    figure.suptitle(title)
    return figure, axes[0]


def _draw(axis, series, xlabel, ylabel, logy=True):
    for variant, points in series.items():
        axis.plot([x for x, _ in points], [y for _, y in points], marker="o", label=variant)
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


def plot_suites(table, out_dir):
    """Write the plots of every suite in ``table`` (entries of `bench.report.scaling.scaling_table`); return paths."""
    paths = []
    by_suite = defaultdict(list)
    for entry in table:
        by_suite[(entry["suite"], entry["scaling"])].append(entry)
    for (suite, scaling), entries in by_suite.items():
        sizes = _spread({int(e["size"]) for e in entries})
        if len({e["ranks"] for e in entries}) > 1:
            for y_key, label, logy in (("t_med_s", "time per run (s)", True), ("efficiency", "efficiency", False)):
                figure, axes = _figure(sizes, f"{suite}: {label} against ranks ({scaling} scaling)")
                for axis, size in zip(axes, sizes):
                    panel = [e for e in entries if int(e["size"]) == size]
                    _draw(axis, _series(panel, "ranks", y_key), "ranks", label, logy)
                    axis.set_title(f"size {format_size(size)}")
                name = "time" if y_key == "t_med_s" else "efficiency"
                paths.append(_save(figure, out_dir, f"{suite}_{scaling}_{name}.png"))
        with_bandwidth = [e for e in entries if e["busbw_gbs"] is not None and e["ranks"] > 1]
        if with_bandwidth and len({e["size"] for e in with_bandwidth}) > 1:
            counts = sorted({e["ranks"] for e in with_bandwidth})[-MAX_PANELS:]
            figure, axes = _figure(counts, f"{suite}: bus bandwidth against size")
            for axis, ranks in zip(axes, counts):
                panel = [dict(e, size_bytes=int(e["size"])) for e in with_bandwidth if e["ranks"] == ranks]
                _draw(axis, _series(panel, "size_bytes", "busbw_gbs"), "size (bytes)", "busbw (GB/s)")
                axis.set_title(f"{ranks} ranks")
            paths.append(_save(figure, out_dir, f"{suite}_{scaling}_bandwidth.png"))
    return paths
