"""`write_report`: results CSVs in; scaling.csv, fits.csv, summary.md, plots and a JSON document out.

The JSON document (`document`) holds the same per-suite analysis as summary.md
(`bench.report.analysis.analyse`) as plain numbers: seconds, GB/s, MiB, ratios;
a value not measured or not defined is ``null`` (never NaN). A point's ``stable`` is
true, false, or null (a file written before the column: counted as stable); in
scaling.csv it is 1, 0 or empty, beside its ``spread``.
"""
import csv
import json
import math
import os
import statistics

from bench.report.analysis import analyse
from bench.report.model import (HANDOFF_STATE_TOLERANCE, MEMORY_STATE_TOLERANCE, for_projection, off_node_state,
                                provenance_note, shared_cores_note, unstable_note)
from bench.report.scaling import (FIT_COLUMNS, PROJECTION_COLUMNS, SCALING_COLUMNS, Suites, load_results,
                                  projections, scaling_table, serial_fractions, unstable)
from bench.report.summary import markdown
from kernels.errors import InputError

#: Version of the JSON document's layout (``mlscale_report``).
JSON_VERSION = 1


def write_report(paths, out_dir, calib=None, project=(), plots=True, json_path=None):
    """Write scaling.csv, fits.csv, summary.md (and projection.csv, PNG plots) into ``out_dir``.

    With ``json_path``, also write the JSON `document` there. Returns
    ``(notes, document)``: the lines to print (one warning line when invalid rows
    were skipped) and the document. Raises `InputError` when ``out_dir`` is an
    existing file or a file cannot be written.
    """
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(f"--out {out_dir} is an existing file, not a folder")
    rows, warning = load_results(paths)
    suites = Suites()
    table = scaling_table(rows, calib, suites)
    fits = serial_fractions(table)
    projected = projections(table, calib, project, suites) if calib and project else []
    reports = analyse(table, fits, projected, rows, suites)
    notes = []
    if warning:
        notes.append(warning)
    counts = sorted({entry["ranks"] for entry in table})
    if len(counts) < 2:
        notes.append(f"report: only one rank count ({counts[0]}) was measured, so speedup and efficiency are trivial")
    calibration_notes = [note for note in (unstable_note(calib), shared_cores_note(calib), provenance_note(calib, rows))
                         if note] if calib else []
    model_notes = model_error_lines(table) + calibration_notes
    if projected:
        model_notes.append(f"report: projection to {', '.join(map(str, project))} ranks uses "
                           f"{for_projection(calib)[1]}")
    notes += model_notes
    doc = document(paths, len(rows), reports, calib, notes)
    try:
        written, plot_notes = _write_outputs(out_dir, table, fits, projected, reports, calib, plots, model_notes)
        if json_path:
            _write_json(json_path, doc)
            written.append(json_path)
    except OSError as error:
        raise InputError(f"cannot write the report into {json_path if _is_json(error, json_path) else out_dir}: "
                         f"{error.strerror}" + (f" ({error.filename})" if error.filename else "")) from None
    notes.insert(0, f"report: {len(rows)} points from {len(paths)} file(s) -> {', '.join(written)}")
    return notes + plot_notes, doc


def model_error_lines(table):
    """One line per suite with predictions at >= 2 ranks: the median and largest |predicted / measured - 1| of its
    stable points (unknown counts as stable) measured in the calibration's node state (`off_node_state`: the
    point's memory and handoff probes within their tolerances of the calibration's, or not probed; how many of
    them were priced with its other handoff state, ``calibration_state``), and how many
    unstable and off-state ones were left out; then, where some of those points are entries the calibration
    measured itself (``calibration_entry``: MPI's own call, or the ping-pong, on two ranks at a size of its
    table), how far those moved, which is how much the node changed between calibrate and the sweep whatever
    the model."""
    errors, left_out, off_state, drift, other = {}, {}, {}, {}, {}
    for entry in table:
        if entry["model_error"] is not None and entry["ranks"] >= 2:
            suite = entry["suite"]
            errors.setdefault(suite, [])
            left_out[suite] = left_out.get(suite, 0) + unstable(entry)
            off_state[suite] = off_state.get(suite, 0) + (not unstable(entry) and off_node_state(entry))
            if not unstable(entry) and not off_node_state(entry):
                errors[suite].append(abs(entry["model_error"]))
                other[suite] = other.get(suite, 0) + (entry.get("calibration_state") == "other")
                if entry.get("calibration_entry"):
                    drift.setdefault(suite, []).append(abs(entry["model_error"]))
    lines = []
    for suite, values in sorted(errors.items()):
        head, unstable_part = f"report: {suite} model error at >= 2 ranks: ", f"{left_out[suite]} unstable left out"
        if off_state[suite]:
            unstable_part += (f", {off_state[suite]} in another node state left out (the node's probe GEMV more than "
                              f"{MEMORY_STATE_TOLERANCE}x or its handoff more than {HANDOFF_STATE_TOLERANCE}x off the "
                              "calibration's)")
        priced = f" ({other[suite]} priced with the calibration's other handoff state)" if other.get(suite) else ""
        lines.append(f"{head}{_spread_of(values)}{priced}; {unstable_part}" if values
                     else f"{head}no stable points{' in the calibrated node state' * bool(off_state[suite])} "
                                           f"({unstable_part})")
        if suite in drift:
            lines.append(f"report: {suite} calibration drift: {_spread_of(drift[suite])} that repeat a calibration "
                         "entry (the same call and size on 2 ranks): the node changed that much between calibrate "
                         "and the sweep; model errors up to that size are drift, not the model")
    return lines


def _spread_of(values):
    """``median X%, max Y% over N stable point(s)`` of the fractions ``values``."""
    return (f"median {statistics.median(values):.0%}, max {max(values):.0%} over {len(values)} stable "
            f"point{'s' if len(values) > 1 else ''}")


def document(paths, points, reports, calib, notes):
    """The machine-readable report: files, point count, notes, calibration and one object per suite."""
    return _plain(dict(mlscale_report=JSON_VERSION, files=list(paths), points=points, notes=list(notes),
                       calibration=calib, suites=reports))


def _plain(value):
    """``value`` with NaN and infinities as None, tuples as lists: strict JSON."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps(doc):
    """The document as JSON text (strict: no NaN)."""
    return json.dumps(doc, indent=1, allow_nan=False)


def _is_json(error, json_path):
    return json_path is not None and error.filename == json_path


def _write_json(path, doc):
    with open(path, "w") as handle:
        handle.write(dumps(doc) + "\n")


def _write_outputs(out_dir, table, fits, projected, reports, calib, plots, model_notes):
    """Write the report's files; return their paths and notes (no plots without matplotlib)."""
    os.makedirs(out_dir, exist_ok=True)
    written = [_write_csv(out_dir, "scaling.csv", SCALING_COLUMNS, table),
               _write_csv(out_dir, "fits.csv", FIT_COLUMNS, fits)]
    if projected:
        written.append(_write_csv(out_dir, "projection.csv", PROJECTION_COLUMNS, projected))
    summary = os.path.join(out_dir, "summary.md")
    with open(summary, "w") as handle:
        handle.write("\n".join(markdown(reports, calib, model_notes)) + "\n")
    written.append(summary)
    notes = []
    if plots:
        try:
            from bench.report.plots import plot_suites
        except ImportError:
            notes.append("report: no plots: matplotlib is missing (pip install 'mlscale[plot]')")
        else:
            written += plot_suites(reports, out_dir)
    return written, notes


def _write_csv(out_dir, name, columns, entries):
    path = os.path.join(out_dir, name)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: _csv_cell(v) for k, v in entry.items()} for entry in entries)
    return path


def _csv_cell(value):
    if value is None:
        return ""
    if isinstance(value, bool):
        return int(value)
    return f"{value:.6g}" if isinstance(value, float) else value
