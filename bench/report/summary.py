"""summary.md: a digest per suite first (a dozen lines each), then the details, every table under a heading.

Renders the per-suite dicts of `bench.report.analysis.analyse`. Times are shown
in the unit that fits them (`format_time`: us, ms or s). A figure that rests on an
unstable point (its time, or what is shown for it: bandwidth, latency, time per
epoch; a ratio whose point or reference was unstable; a fit over one) carries
`MARK`, and `LEGEND` follows every table that has one; the digest's best-variant
cells leave unstable points out and say how many.
"""
from bench.report.scaling import COMMUNICATION, GROUP, ratio_unstable, unstable
from bench.stability import MAX_SPREAD
from bench.units import format_size

#: Appended to a figure that rests on an unstable point (one mark per cell: two would strike the text through).
MARK = "~"
LEGEND = (f"`{MARK}`: measured at an unstable point (a ratio: the point or the reference; a fit: any of its points); "
          "its samples spread more than the sweep's --max-spread, so the figure may be off.")


def format_time(seconds):
    """``3.5e-06 -> '3.50 us'``, ``0.0123 -> '12.30 ms'``, ``2.5 -> '2.50 s'``; '' for None."""
    if seconds is None:
        return ""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def markdown(reports, calib, model_notes=()):
    """The lines of summary.md; ``model_notes``: the model error and projection lines, listed under the constants."""
    lines = ["# mlscale report", ""]
    if calib:
        lines += [f"Model constants ({calib.get('scope', 'intra-node')}): overhead {calib['overhead_s'] * 1e6:.2f} us "
                  f"+ alpha {calib['alpha_s'] * 1e6:.2f} us per message, "
                  f"1/beta {1 / calib['beta_s_per_byte'] / 1e9:.2f} GB/s, "
                  f"1/gamma {1 / calib['gamma_s_per_byte'] / 1e9:.2f} GB/s "
                  f"({calib.get('host', '?')}, {calib.get('mpi_library', '?')}).", ""]
        lines += [f"- {line.removeprefix('report: ')}" for line in model_notes] + ([""] if model_notes else [])
    lines += ["## Digest", ""]
    for report in reports:
        lines += _digest(report)
    for report in reports:
        lines += [f"## {report['suite']}: details", ""]
        lines += _communication(report) if report["kind"] == COMMUNICATION else _compute(report)
    return lines


def _legend(marked):
    """The legend lines under a table (after its blank line: a line right under a table would be a row of it)."""
    return [LEGEND, ""] if marked else []


def _mark(text, shaky):
    return f"{text}{MARK}" if shaky and text else text


def _time(seconds, point):
    """`format_time` of ``seconds``, marked when ``point`` was unstable."""
    return _mark(format_time(seconds), unstable(point))


def _digest(report):
    unit, reference = report["size_unit"], report["reference"]
    lines = [f"### {report['suite']} ({report['kind']}; reference {reference})", ""]
    shaky = sum(map(unstable, report["points"]))
    if shaky:
        lines.append(f"- {shaky} of {len(report['points'])} points unstable (spread, the interquartile range of a "
                     f"point's samples over their median, above the sweep's --max-spread, {MAX_SPREAD:g} by default): "
                     f"marked `{MARK}` in every table, left out of the best-variant claims and the model errors")
    for table in report.get("communication", []):
        lines.append(f"- {table['ranks']} ranks{_suffix(table['group'], report['suite'])}: "
                     f"average bus bandwidth {_averages(table)}")
        if table["latency"]:
            ends = (table["latency"][0], table["latency"][-1])
            lines.append(f"- {table['ranks']} ranks: latency {_time(ends[0]['latency_s'], ends[0])} at "
                         f"{format_size(ends[0]['size'])} {unit}, {_time(ends[1]['latency_s'], ends[1])} at "
                         f"{format_size(ends[1]['size'])} {unit}")
    if report["superlinear"]:
        lines.append(f"- {len(report['superlinear'])} superlinear point(s): see the details")
    if report["batch_size"]:
        lines.append(f"- {len(report['batch_size'])} batch-size table(s) (time per epoch, peak memory): "
                     "see the details")
    fractions = [r["peak_fraction"] for table in report.get("compute_rate", []) for r in table["rows"]]
    if fractions:
        lines.append(f"- GFLOP/s per rank: {min(fractions):.2f}-{max(fractions):.2f} of the calibrated GEMM peak "
                     "(see the details)")
    if lines[-1] != "":
        lines.append("")
    for table in report["digest"]:
        shown = "" if len(table["sizes"]) == table["sizes_measured"] else \
            f"; {len(table['sizes'])} of {table['sizes_measured']} sizes"
        lines += [f"Best variant by size and rank count{_suffix(table['group'], report['suite'])}{shown}: "
                  f"variant, T_{reference} / T_best (time"
                  + (", efficiency)" if report["kind"] != COMMUNICATION else ")"), "",
                  f"| size ({unit}) | " + " | ".join(f"{p} rank{'s' if p > 1 else ''}" for p in table["ranks"]) + " |",
                  "|---" * (len(table["ranks"]) + 1) + "|"]
        for size in table["sizes"]:
            cells = [table["cells"].get(f"{size} {p}") for p in table["ranks"]]
            lines.append(f"| {format_size(size)} | " + " | ".join(_digest_cell(c, reference) for c in cells) + " |")
        lines.append("")
        if table["unstable_left_out"]:
            count, empty = table["unstable_left_out"], table["unstable_cells"]
            lines += [f"{count} unstable point{'s' if count > 1 else ''} left out"
                      + (f"; {empty} cell{'s' if empty > 1 else ''} had no stable point" if empty else "") + ".", ""]
    return lines


def _digest_cell(cell, reference):
    """``variant ratio (time[, efficiency])``; without the ratio where the reference's point was unstable."""
    if cell is None:
        return ""
    figures = format_time(cell["t_med_s"]) + ("" if cell["efficiency"] is None else f", {cell['efficiency']:.2f}")
    if cell["vs_ref"] is None:
        return f"{cell['variant']} ({figures}; {reference} unstable)"
    return f"{cell['variant']} {_ratio(cell['vs_ref'])} ({figures})"


def _averages(table):
    """``variant X GB/s`` per variant, marked when any of its points was unstable."""
    return ", ".join(_mark(f"{v} {bw:.3g} GB/s", any(unstable(p) for p in table["points"] if p["variant"] == v))
                     for v, bw in table["average_busbw"].items())


def _communication(report):
    unit, reference, lines = report["size_unit"], report["reference"], []
    for table in report["communication"]:
        where = f"{table['ranks']} ranks{_suffix(table['group'], report['suite'])}"
        by_point = {(p["size"], p["variant"]): p for p in table["points"]}
        lines += _matrix(f"Bus bandwidth (GB/s) against size, {where}", unit, table, by_point,
                         table["variants"], lambda p: _cell(p["busbw_gbs"], "{:.3f}"), unstable)
        lines += ["Average bus bandwidth: " + _averages(table), ""]
        others = [v for v in table["variants"]
                  if v != reference and any(p["vs_ref"] is not None for p in table["points"] if p["variant"] == v)]
        if others:
            lines += _matrix(f"Ratio to {reference} (T_{reference} / T) against size, {where}", unit, table, by_point,
                             others, lambda p: _ratio(p["vs_ref"]), ratio_unstable)
        if table["latency"]:
            lines += [f"### Latency against size, {where}", "", f"| size ({unit}) | variant | latency |",
                      "|---|---|---|"]
            lines += [f"| {format_size(r['size'])} | {r['variant']} | {_time(r['latency_s'], r)} |"
                      for r in table["latency"]]
            lines += [""] + _legend(any(map(unstable, table["latency"])))
        lines += [f"### Time, algbw and busbw per variant, {where}", "",
                  f"| size ({unit}) | variant | time | algbw (GB/s) | busbw (GB/s) | model | model error | wrong |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {format_size(p['size'])} | {p['variant']} | {_time(p['t_med_s'], p)} | "
                  f"{_cell(p['algbw_gbs'], '{:.3f}')} | {_cell(p['busbw_gbs'], '{:.3f}')} | "
                  f"{format_time(p['predicted_s'])} | {_error(p)} | {p['wrong']} |"
                  for p in table["points"]]
        lines += [""] + _legend(any(map(unstable, table["points"])))
    return lines


#: The columns that make one compute table (variant, scaling, size and rank count are its rows).
COMPUTE_GROUP = ("benchmark", "backend", "dtype", "settings")


def _compute(report):
    lines = []
    groups = {}
    for p in report["points"]:
        groups.setdefault(tuple(p[c] for c in COMPUTE_GROUP), []).append(p)
    for key, points in groups.items():
        suffix = _suffix(dict(zip(COMPUTE_GROUP, key)), report["suite"])
        lines += _scaling(report, points, suffix)
        fits = [f for f in report["fits"] if tuple(f[c] for c in COMPUTE_GROUP) == key]
        unit = report["size_unit"]
        if fits:
            lines += [f"### Serial fraction fits (Amdahl: strong scaling; Gustafson: weak){suffix}", "",
                      f"| variant | size ({unit}) | law | serial fraction | rank counts |", "|---|---|---|---|---|"]
            lines += [f"| {f['variant']} | {format_size(int(f['size']))} | {f['law']} | "
                      f"{_mark(format(f['serial_fraction'], '.3f'), f['unstable_points'])} | {f['rank_counts']} |"
                      for f in fits]
            lines += [""] + _legend(any(f["unstable_points"] for f in fits))
        projected = [p for p in report["projection"] if tuple(p[c] for c in COMPUTE_GROUP) == key]
        if projected:
            lines += [f"### Projected time (cost model){suffix}", "", f"| variant | size ({unit}) | ranks | predicted |",
                      "|---|---|---|---|"]
            lines += [f"| {p['variant']} | {format_size(int(p['size']))} | {p['ranks']} | "
                      f"{format_time(p['predicted_s'])} |" for p in projected]
            lines.append("")
    if report["superlinear"]:
        lines += ["### Superlinear points (efficiency above 1.05)", ""]
        lines += [f"- {s['variant']}, {format_size(int(s['size']))} {report['size_unit']}, {s['ranks']} ranks"
                  f"{_suffix(s, report['suite'])}: efficiency {_mark(format(s['efficiency'], '.2f'), unstable(s))}; "
                  f"why it may be: {s['reason']}" for s in report["superlinear"]]
        lines += [""] + _legend(any(map(unstable, report["superlinear"])))
    return lines + _batch_sizes(report) + _model_states(report) + _compute_rates(report)


def _compute_rates(report):
    """Per group: GFLOP/s per computing rank against the calibrated GEMM peak of its dtype, threads and node sharing."""
    lines = []
    for table in report.get("compute_rate", []):
        lines += [f"### GFLOP/s per rank, fraction of the calibrated GEMM peak{_suffix(table['group'], report['suite'])}",
                  "", f"| variant | scaling | size ({report['size_unit']}) | ranks | threads | GFLOP/s | "
                  "GFLOP/s per rank | GEMM peak (GFLOP/s) | fraction of peak |", "|---" * 9 + "|"]
        lines += [f"| {r['variant']} | {r['scaling']} | {format_size(r['size'])} | {r['ranks']} | {r['threads']} | "
                  f"{_mark(_cell(r['gflops'], '{:.3g}'), unstable(r))} | "
                  f"{_mark(_cell(r['gflops_per_rank'], '{:.3g}'), unstable(r))} | {r['gemm_peak_gflops']:.3g} | "
                  f"{_mark(format(r['peak_fraction'], '.2f'), unstable(r))} |" for r in table["rows"]]
        lines += ["", "Peak: the calibration's largest GEMM at the point's dtype and BLAS threads (its `busy` rate "
                  "when 2+ ranks share a node); per rank: over the ranks that compute.", ""]
        lines += _legend(any(map(unstable, table["rows"])))
    return lines


def _scaling(report, points, suffix):
    """The table of one compute group: speedup, efficiency, Karp-Flatt, ratio to the reference, metric, model."""
    unit, reference = report["size_unit"], report["reference"]
    metrics = sorted({p["metric"] for p in points if p["metric"]})
    metric_head = metrics[0] if len(metrics) == 1 else "metric"
    with_accuracy = any(p["accuracy"] is not None for p in points)
    superlinear = {_point_id(s) for s in report["superlinear"]}
    lines = [f"### Speedup, efficiency and Karp-Flatt, with the ratio to {reference} and the suite's metric{suffix}",
             "", f"| variant | scaling | size ({unit}) | ranks | time | speedup | efficiency | Karp-Flatt | "
             f"vs {reference} | {metric_head} |" + (" accuracy |" if with_accuracy else "")
             + " model | model error | wrong |",
             "|---" * (13 + with_accuracy) + "|"]
    for p in points:
        flag = " (superlinear)" if _point_id(p) in superlinear else ""
        metric = _cell(p["metric_value"]) if len(metrics) <= 1 or not p["metric"] else \
            f"{p['metric']} {_cell(p['metric_value'])}"
        lines.append(
            f"| {p['variant']} | {p['scaling']} | {format_size(int(p['size']))} | {p['ranks']} | "
            f"{_time(p['t_med_s'], p)} | {_cell(p['speedup'])} | {_cell(p['efficiency'])}{flag} | "
            f"{_cell(p['karp_flatt'])} | {_mark(_ratio(p['vs_ref']), ratio_unstable(p))} | {metric} |"
            + (f" {_cell(p['accuracy'])} |" if with_accuracy else "")
            + f" {format_time(p['predicted_s'])} | {_error(p)} | {p['wrong']} |")
    return lines + [""] + _legend(any(map(ratio_unstable, points)))


def _point_id(point):
    return tuple(point[c] for c in GROUP) + (point["ranks"],)


def _batch_sizes(report):
    lines = []
    for table in report["batch_size"]:
        group = table["group"]
        lines += [f"### Batch size: model {table['model']}, {table['ranks']} rank{'s' if table['ranks'] > 1 else ''}, "
                  f"{group['backend']} ({group['dtype']}, {group['variant']}, {group['scaling']} scaling"
                  + (f", {group['settings']}" if group["settings"] != "{}" else "") + ")", "",
                  "| batch size | time per epoch (s) | peak memory (MiB) |", "|---|---|---|"]
        lines += [f"| {r['batch']} | "
                  + ("n/a" if r["time_per_epoch_s"] is None else
                     _mark(f"{r['time_per_epoch_s']:.3f}", unstable(r))
                     + (" (estimate)" if r["time_source"] == "estimate" else ""))
                  + f" | {'n/a' if r['peak_memory_mib'] is None else format(r['peak_memory_mib'], '.1f')} |"
                  for r in table["rows"]]
        lines += [""] + _legend(any(map(unstable, table["rows"])))
    return lines


def _model_states(report):
    """Per model and rank count: samples/s, the ratio to the reference and the model state of each variant."""
    lines = []
    for table in report["model_state"]:
        group = table["group"]
        lines += [f"### Model state and speed per variant: model {table['model']}, {table['ranks']} "
                  f"rank{'s' if table['ranks'] > 1 else ''}{_suffix(group, report['suite'])}", "",
                  f"| batch size | variant | samples/s | vs {report['reference']} | model state (MiB) | "
                  "peak model state (MiB) |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['batch']} | {r['variant']} | {_mark(format(r['items_per_s'], '.4g'), unstable(r))} | "
                  f"{_mark(_ratio(r['vs_ref']), ratio_unstable(r))} | {r['model_state_bytes'] / 2**20:.3f} | "
                  + ("n/a" if r["peak_model_state_bytes"] is None else f"{r['peak_model_state_bytes'] / 2**20:.3f}")
                  + " |" for r in table["rows"]]
        lines += [""] + _legend(any(unstable(r) or ratio_unstable(r) for r in table["rows"]))
    return lines


def _matrix(title, unit, table, by_point, variants, cell, shaky):
    """Sizes down, ``variants`` across: ``cell(point)``, marked where ``shaky(point)``; the legend when any is."""
    lines = [f"### {title}", "", f"| size ({unit}) | " + " | ".join(variants) + " |", "|---" * (len(variants) + 1) + "|"]
    shown = [[by_point.get((size, v)) for v in variants] for size in table["sizes"]]
    for size, points in zip(table["sizes"], shown):
        lines.append(f"| {format_size(size)} | " + " | ".join(
            "" if p is None else _mark(cell(p), shaky(p)) for p in points) + " |")
    return lines + [""] + _legend(any(shaky(p) for points in shown for p in points if p is not None))


def _suffix(group, suite):
    parts = [group["benchmark"]] if group.get("benchmark", suite) != suite else []
    parts += [group[c] for c in ("backend", "dtype", "scaling") if c in group]
    if group.get("settings", "{}") != "{}":
        parts.append(group["settings"])
    return f" ({', '.join(parts)})" if parts else ""


def _error(point):
    return "" if point["model_error"] is None else f"{point['model_error']:+.0%}"


def _ratio(value):
    return "" if value is None else f"{value:.2f}x"


def _cell(value, style="{:.3f}"):
    if value is None:
        return ""
    return style.format(value) if isinstance(value, float) else str(value)
