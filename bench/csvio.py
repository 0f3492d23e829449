"""The results CSV: a fixed header, one row per measured point, resumable.

Only rank 0 touches the file. Each row is written with one ``write`` and flushed
as soon as its point is measured, so an interrupted sweep leaves whole rows only;
re-running the same command skips the points already in the file.
"""
import csv
import io
import json
import os

from kernels.errors import InputError

SCHEMA_VERSION = 2

COLUMNS = (
    "suite", "benchmark", "variant", "backend", "dtype", "ranks", "nodes", "threads",
    "scaling", "size", "size_unit", "iters", "warmup", "t_min_s", "t_med_s", "t_max_s",
    "gflops", "algbw_gbs", "busbw_gbs", "items_per_s", "metric", "metric_value", "wrong",
    "mpi_library", "host", "timestamp", "params", "settings", "schema",
)

#: The columns that identify a point: a row with the same values is not measured again.
KEY_COLUMNS = ("suite", "benchmark", "variant", "backend", "dtype", "ranks", "threads", "scaling", "size",
               "settings")


def point_key(row):
    """The identity of a point, as strings, from a row dict."""
    return tuple(str(row[column]) for column in KEY_COLUMNS)


def read_rows(path):
    """Return the rows of a results CSV as dicts; raise `InputError` when its header is not ours."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise InputError(f"{path}: not an mlscale results file of schema {SCHEMA_VERSION} (missing column {missing[0]!r})")
        return list(reader)


class ResultsFile:
    """Append-only results CSV owned by one process (rank 0).

    Opening checks that the path is writable and, when the file exists, that its
    header is this schema's; `done` holds the keys of the points already measured.
    """

    def __init__(self, path):
        self.path = path
        folder = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(folder, exist_ok=True)
            exists = os.path.exists(path) and os.path.getsize(path) > 0
            self.done = {point_key(row) for row in read_rows(path)} if exists else set()
            self._handle = open(path, "a", newline="")
        except OSError as error:
            raise InputError(f"cannot write results to {path}: {error.strerror}") from None
        if not exists:
            self._write_line(COLUMNS)

    def _write_line(self, values):
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerow(values)
        self._handle.write(buffer.getvalue())
        self._handle.flush()

    def append(self, row):
        """Write one point (a dict with every column) and flush it."""
        row = dict(row, schema=SCHEMA_VERSION)
        row["params"] = json.dumps(row.get("params") or {}, sort_keys=True)
        self._write_line([_format(row.get(column)) for column in COLUMNS])
        self.done.add(point_key(row))

    def close(self):
        self._handle.close()


def _format(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
