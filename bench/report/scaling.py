"""Scaling reports from results CSVs: speedup, efficiency, Karp-Flatt, Amdahl / Gustafson fits, models.

For every suite / benchmark / variant / backend / dtype / scaling / size, the time
at p ranks is compared with the time at the smallest rank count measured (1
when present): speedup S = T_base / T_p x base ranks (strong scaling), efficiency
E = S / p (strong) or T_1 / T_p (weak), and the Karp-Flatt serial fraction
e = (1/S - 1/p) / (1 - 1/p). Each variant is also compared with the suite's
reference variant at the same point (``vs_ref`` = T_ref / T; a reference that only
runs on one rank, such as ``numpy`` with all BLAS threads, is taken at 1 rank, so
``vs_ref`` compares explicit with implicit parallelism). Groups with two or
more rank counts get a least-squares Amdahl serial fraction f (strong:
1/S = f + (1 - f)/p) or Gustafson serial fraction s (weak: p E = p - s (p - 1)).
With a calibration (`bench.report.model`), each point gets the suite's predicted time and
the relative error, and ``project`` rank counts get predictions only.
"""
import csv
import os
from collections import defaultdict

from bench.csvio import read_rows, row_problem
from bench.registry import get_case
from bench.units import format_size
from kernels.errors import InputError

GROUP = ("suite", "benchmark", "variant", "backend", "dtype", "scaling", "size", "settings")
SCALING_COLUMNS = GROUP + ("ranks", "t_med_s", "speedup", "efficiency", "karp_flatt", "vs_ref",
                           "predicted_s", "model_error", "busbw_gbs", "wrong")
FIT_COLUMNS = GROUP + ("rank_counts", "law", "serial_fraction")
PROJECTION_COLUMNS = GROUP + ("ranks", "predicted_s")


def load_results(paths):
    """Valid rows of every CSV in ``paths`` and a warning line (or None) counting the rows skipped.

    A later row replaces an earlier one of the same point. A row that is not a
    valid point (`bench.csvio.row_problem`: a cut row, NaN or non-positive time,
    an empty field, another schema...) is skipped and enters no table or fit.
    """
    latest, skipped, total = {}, [], 0
    for path in paths:
        if not os.path.isfile(path):
            raise InputError(f"no such results file: {path}")
        for line, row in read_rows(path):
            total += 1
            problem = row_problem(row)
            if problem:
                skipped.append(f"{path} line {line}: {problem}")
                continue
            latest[tuple(row[c] for c in GROUP) + (row["ranks"],)] = row
    first = f" (first: {skipped[0]})" if skipped else ""
    if not latest:
        raise InputError(f"no measured points in {', '.join(paths)}"
                         + (f": all {total} rows are invalid{first}" if skipped else ""))
    warning = (f"report: warning: skipped {len(skipped)} invalid row{'s' if len(skipped) > 1 else ''} of {total}"
               f"{first}") if skipped else None
    return list(latest.values()), warning


class _Suites:
    """Cases by suite name, loaded once; None for a suite this installation cannot load."""

    def __init__(self):
        self._cases = {}

    def __getitem__(self, name):
        if name not in self._cases:
            try:
                self._cases[name] = get_case(name)
            except InputError:
                self._cases[name] = None
        return self._cases[name]


def _predict(case, key, ranks, calib):
    if case is None or calib is None:
        return None
    suite, benchmark, variant, backend, dtype, scaling, size, settings = key
    return case.predict(variant, case.problem_size(int(size), ranks, scaling), ranks, calib)


def scaling_table(rows, calib=None, suites=None):
    """One dict per row: speedup, efficiency, Karp-Flatt, ratio to the reference variant, model."""
    suites = suites or _Suites()
    groups = defaultdict(list)
    for row in rows:
        groups[tuple(row[c] for c in GROUP)].append(row)
    reference = {}
    for key, members in groups.items():
        case = suites[key[0]]
        ref_variant = case.variants[0] if case else next(r["variant"] for r in rows if r["suite"] == key[0])
        if key[2] == ref_variant:
            for row in members:
                reference[_peer_key(key, row["ranks"])] = float(row["t_med_s"])
    table = []
    for key in sorted(groups, key=_sort_key):
        members = sorted(groups[key], key=lambda r: int(r["ranks"]))
        base_ranks, base_time = int(members[0]["ranks"]), float(members[0]["t_med_s"])
        strong = key[5] == "strong"
        for row in members:
            ranks, seconds = int(row["ranks"]), float(row["t_med_s"])
            speedup = base_time / seconds * (base_ranks if strong else 1)
            ref_time = reference.get(_peer_key(key, row["ranks"]), reference.get(_peer_key(key, 1)))
            predicted = _predict(suites[key[0]], key, ranks, calib)
            table.append(dict(
                zip(GROUP, key), ranks=ranks, t_med_s=seconds, speedup=speedup,
                efficiency=speedup / ranks if strong else base_time / seconds,
                karp_flatt=_karp_flatt(speedup, ranks) if strong and base_ranks == 1 else None,
                vs_ref=ref_time / seconds if ref_time else None, predicted_s=predicted,
                model_error=(predicted - seconds) / seconds if predicted is not None else None,
                busbw_gbs=float(row["busbw_gbs"]) if row["busbw_gbs"] else None, wrong=row["wrong"],
            ))
    return table


def _peer_key(key, ranks):
    return (key[0], key[1]) + key[3:] + (str(ranks),)


def _karp_flatt(speedup, ranks):
    if ranks < 2 or speedup <= 0:
        return None
    return (1 / speedup - 1 / ranks) / (1 - 1 / ranks)


def _sort_key(key):
    suite, benchmark, variant, backend, dtype, scaling, size, settings = key
    return suite, benchmark, backend, dtype, settings, scaling, variant, int(size)


def serial_fractions(table):
    """Amdahl (strong) or Gustafson (weak) serial fraction per group with >= 2 rank counts, base 1 rank."""
    groups = defaultdict(list)
    for entry in table:
        groups[tuple(entry[c] for c in GROUP)].append(entry)
    fits = []
    for key, entries in groups.items():
        counts = [e["ranks"] for e in entries]
        if len(entries) < 2 or counts[0] != 1:
            continue
        points = [(e["ranks"], e["speedup"], e["efficiency"]) for e in entries if e["ranks"] > 1]
        if key[5] == "strong":
            xs = [1 - 1 / p for p, _, _ in points]
            ys = [1 / s - 1 / p for p, s, _ in points]
            law = "amdahl"
        else:
            xs = [p - 1 for p, _, _ in points]
            ys = [p - p * e for p, _, e in points]
            law = "gustafson"
        fraction = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
        fits.append(dict(zip(GROUP, key), rank_counts=" ".join(map(str, counts)), law=law,
                         serial_fraction=fraction))
    return fits


def projections(table, calib, rank_counts, suites=None):
    """Predicted seconds at ``rank_counts`` for every group whose suite declares a cost model."""
    suites = suites or _Suites()
    keys = sorted({tuple(e[c] for c in GROUP) for e in table}, key=_sort_key)
    rows = []
    for key in keys:
        for ranks in rank_counts:
            predicted = _predict(suites[key[0]], key, ranks, calib)
            if predicted is not None:
                rows.append(dict(zip(GROUP, key), ranks=ranks, predicted_s=predicted))
    return rows


def write_report(paths, out_dir, calib=None, project=(), plots=True):
    """Write scaling.csv, fits.csv, summary.md (and projection.csv, PNG plots) into ``out_dir``.

    Returns the lines to print (one warning line when invalid rows were skipped).
    Raises `InputError` when ``out_dir`` is an existing file or cannot be written.
    """
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(f"--out {out_dir} is an existing file, not a folder")
    rows, warning = load_results(paths)
    suites = _Suites()
    table = scaling_table(rows, calib, suites)
    fits = serial_fractions(table)
    projected = projections(table, calib, project, suites) if calib and project else []
    try:
        written, notes = _write_outputs(out_dir, table, fits, projected, calib, plots)
    except OSError as error:
        raise InputError(f"cannot write the report into {out_dir}: {error.strerror}"
                         + (f" ({error.filename})" if error.filename else "")) from None
    notes.insert(0, f"report: {len(rows)} points from {len(paths)} file(s) -> {', '.join(written)}")
    if warning:
        notes.insert(1, warning)
    counts = sorted({entry["ranks"] for entry in table})
    if len(counts) < 2:
        notes.append(f"report: only one rank count ({counts[0]}) was measured, so speedup and efficiency are trivial")
    errors = [abs(e["model_error"]) for e in table if e["model_error"] is not None]
    if errors:
        errors.sort()
        notes.append(f"report: model error at measured points: median {errors[len(errors) // 2]:.0%}, "
                     f"max {errors[-1]:.0%} over {len(errors)} points")
    return notes


def _write_outputs(out_dir, table, fits, projected, calib, plots):
    """Write the report's files; return their paths and notes (no plots without matplotlib)."""
    os.makedirs(out_dir, exist_ok=True)
    written = [_write_csv(out_dir, "scaling.csv", SCALING_COLUMNS, table),
               _write_csv(out_dir, "fits.csv", FIT_COLUMNS, fits)]
    if projected:
        written.append(_write_csv(out_dir, "projection.csv", PROJECTION_COLUMNS, projected))
    summary = os.path.join(out_dir, "summary.md")
    with open(summary, "w") as handle:
        handle.write("\n".join(_markdown(table, fits, projected, calib)) + "\n")
    written.append(summary)
    notes = []
    if plots:
        try:
            from bench.report.plots import plot_suites
        except ImportError:
            notes.append("report: no plots: matplotlib is missing (pip install 'mlscale[plot]')")
        else:
            written += plot_suites(table, out_dir)
    return written, notes


def _write_csv(out_dir, name, columns, entries):
    path = os.path.join(out_dir, name)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: _cell(v, "{:.6g}") for k, v in entry.items()} for entry in entries)
    return path


def _markdown(table, fits, projected, calib):
    lines = ["# mlscale scaling report", ""]
    if calib:
        lines += [f"Model constants: alpha {calib['alpha_s'] * 1e6:.2f} us, "
                  f"1/beta {1 / calib['beta_s_per_byte'] / 1e9:.2f} GB/s, "
                  f"1/gamma {1 / calib['gamma_s_per_byte'] / 1e9:.2f} GB/s "
                  f"({calib.get('host', '?')}, {calib.get('mpi_library', '?')}).", ""]
    for suite in dict.fromkeys(e["suite"] for e in table):
        lines += [f"## {suite}", "",
                  "| variant | scaling | size | ranks | t_med (us) | speedup | efficiency | Karp-Flatt | vs ref "
                  "| model (us) | model error | wrong |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for e in (e for e in table if e["suite"] == suite):
            predicted = e["predicted_s"] * 1e6 if e["predicted_s"] is not None else None
            error = f"{e['model_error']:+.0%}" if e["model_error"] is not None else ""
            lines.append(
                f"| {e['variant']} | {e['scaling']} | {format_size(int(e['size']))} | {e['ranks']} | "
                f"{e['t_med_s'] * 1e6:.2f} | {_cell(e['speedup'])} | {_cell(e['efficiency'])} | "
                f"{_cell(e['karp_flatt'])} | {_cell(e['vs_ref'])} | {_cell(predicted, '{:.2f}')} | {error} | "
                f"{e['wrong']} |")
        lines.append("")
        suite_fits = [f for f in fits if f["suite"] == suite]
        if suite_fits:
            lines += ["| variant | size | law | serial fraction | rank counts |", "|---|---|---|---|---|"]
            lines += [f"| {f['variant']} | {format_size(int(f['size']))} | {f['law']} | "
                      f"{f['serial_fraction']:.3f} | {f['rank_counts']} |" for f in suite_fits]
            lines.append("")
        suite_projection = [p for p in projected if p["suite"] == suite]
        if suite_projection:
            lines += ["| variant | size | ranks | predicted (us) |", "|---|---|---|---|"]
            lines += [f"| {p['variant']} | {format_size(int(p['size']))} | {p['ranks']} | "
                      f"{p['predicted_s'] * 1e6:.2f} |" for p in suite_projection]
            lines.append("")
    return lines


def _cell(value, style="{:.3f}"):
    if value is None:
        return ""
    return style.format(value) if isinstance(value, float) else value
