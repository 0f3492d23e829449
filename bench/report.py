"""Scaling reports from results CSVs: speedup, parallel efficiency, Karp-Flatt serial fraction.

For every suite / benchmark / variant / backend / dtype / scaling / size, the time
at p ranks is compared with the time at the smallest rank count measured (1
when present): speedup S = T_base / T_p (strong scaling; base 1), efficiency
E = S / p for strong scaling and T_1 / T_p for weak scaling, and the Karp-Flatt
serial fraction e = (1/S - 1/p) / (1 - 1/p). Each variant is also compared with
the suite's reference variant measured at the same point (``vs_ref`` = T_ref / T).
"""
import csv
import os
from collections import defaultdict

from bench.csvio import read_rows
from bench.registry import get_case
from bench.units import format_size
from kernels.errors import InputError

GROUP = ("suite", "benchmark", "variant", "backend", "dtype", "scaling", "size")
SCALING_COLUMNS = GROUP + ("ranks", "t_med_s", "speedup", "efficiency", "karp_flatt", "vs_ref", "wrong")


def load_results(paths):
    """Rows of every CSV in ``paths``; a later row replaces an earlier one of the same point and rank count."""
    latest = {}
    for path in paths:
        if not os.path.isfile(path):
            raise InputError(f"no such results file: {path}")
        for row in read_rows(path):
            latest[tuple(row[c] for c in GROUP) + (row["ranks"],)] = row
    if not latest:
        raise InputError(f"no measured points in {', '.join(paths)}")
    return list(latest.values())


def scaling_table(rows):
    """One dict per row with speedup, efficiency, Karp-Flatt fraction and ratio to the reference variant."""
    groups = defaultdict(list)
    for row in rows:
        groups[tuple(row[c] for c in GROUP)].append(row)
    reference = {}
    for key, members in groups.items():
        if key[2] == _reference_variant(key[0], rows):
            for row in members:
                reference[(key[0], key[1]) + key[3:] + (row["ranks"],)] = float(row["t_med_s"])
    table = []
    for key in sorted(groups, key=_sort_key):
        members = sorted(groups[key], key=lambda r: int(r["ranks"]))
        base = members[0]
        base_ranks, base_time = int(base["ranks"]), float(base["t_med_s"])
        for row in members:
            ranks, seconds = int(row["ranks"]), float(row["t_med_s"])
            speedup = base_time / seconds * (base_ranks if row["scaling"] == "strong" else 1)
            efficiency = speedup / ranks if row["scaling"] == "strong" else base_time / seconds
            ref_time = reference.get((key[0], key[1]) + key[3:] + (row["ranks"],))
            table.append(dict(
                zip(GROUP, key), ranks=ranks, t_med_s=seconds, speedup=speedup, efficiency=efficiency,
                karp_flatt=_karp_flatt(speedup, ranks) if row["scaling"] == "strong" and base_ranks == 1 else None,
                vs_ref=ref_time / seconds if ref_time else None, wrong=row["wrong"],
            ))
    return table


def _reference_variant(suite, rows):
    """The suite's reference variant (its first), or the first variant in the results if the suite will not load."""
    try:
        return get_case(suite).variants[0]
    except InputError:
        return next(row["variant"] for row in rows if row["suite"] == suite)


def _karp_flatt(speedup, ranks):
    if ranks < 2 or speedup <= 0:
        return None
    return (1 / speedup - 1 / ranks) / (1 - 1 / ranks)


def _sort_key(key):
    suite, benchmark, variant, backend, dtype, scaling, size = key
    return suite, benchmark, backend, dtype, scaling, variant, int(size)


def write_report(paths, out_dir):
    """Write ``scaling.csv`` and ``summary.md`` into ``out_dir``; return lines to print."""
    rows = load_results(paths)
    table = scaling_table(rows)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "scaling.csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=SCALING_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: _cell(v, "{:.6g}") for k, v in entry.items()} for entry in table)
    lines = _markdown(table)
    with open(os.path.join(out_dir, "summary.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    counts = sorted({entry["ranks"] for entry in table})
    notes = [f"report: {len(rows)} points from {len(paths)} file(s) -> {out_dir}/scaling.csv, {out_dir}/summary.md"]
    if len(counts) < 2:
        notes.append(f"report: only one rank count ({counts[0]}) was measured, so speedup and efficiency are trivial")
    return notes


def _markdown(table):
    lines = ["# mlscale scaling report", ""]
    by_suite = defaultdict(list)
    for entry in table:
        by_suite[entry["suite"]].append(entry)
    for suite, entries in by_suite.items():
        lines += [f"## {suite}", "",
                  "| variant | scaling | size | ranks | t_med (us) | speedup | efficiency | Karp-Flatt | vs ref | wrong |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for e in entries:
            lines.append(
                f"| {e['variant']} | {e['scaling']} | {format_size(int(e['size']))} | {e['ranks']} | "
                f"{e['t_med_s'] * 1e6:.2f} | {_cell(e['speedup'])} | {_cell(e['efficiency'])} | "
                f"{_cell(e['karp_flatt'])} | {_cell(e['vs_ref'])} | {e['wrong']} |"
            )
        lines.append("")
    return lines


def _cell(value, style="{:.3f}"):
    if value is None:
        return ""
    return style.format(value) if isinstance(value, float) else value
