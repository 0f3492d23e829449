"""The results CSV: a fixed header, one row per measured point, resumable, one writer at a time.

Only rank 0 touches the file, and only one run at a time: `ResultsFile` holds an
exclusive ``flock`` on it from open to close, so a second run on the same file
stops with one line instead of measuring every point again (or writing a second
header). Each row is written whole with ``os.write`` as soon as its point is
measured; a write that fails (a full disk) is cut back to the previous size, so
the file always ends on a complete row. A row cut by a crash is found on the next
open, removed after a one-line warning, and its point measured again. Rows that do
not fit the schema (`row_problem`) are neither counted as done nor reported.
"""
import csv
import errno
import fcntl
import io
import json
import math
import os
import sys
import tempfile

from kernels.errors import InputError

SCHEMA_VERSION = 2

COLUMNS = (
    "suite", "benchmark", "variant", "backend", "dtype", "ranks", "nodes", "threads",
    "scaling", "size", "size_unit", "iters", "warmup", "t_min_s", "t_med_s", "t_max_s", "spread", "stable",
    "gflops", "algbw_gbs", "busbw_gbs", "items_per_s", "metric", "metric_value", "wrong",
    "mpi_library", "device", "host", "timestamp", "params", "settings", "schema",
)
#: Columns added within schema 2: files written before them lack them, are still read (the
#: field as empty) and resumed (new rows follow the file's own header).
OPTIONAL_COLUMNS = ("device", "spread", "stable")

#: The columns that identify a point: a row with the same values is not measured again.
KEY_COLUMNS = ("suite", "benchmark", "variant", "backend", "dtype", "ranks", "threads", "scaling", "size",
               "settings")

_TEXT = ("suite", "benchmark", "variant", "backend", "dtype", "settings")
_TIMES = ("t_min_s", "t_med_s", "t_max_s")
_RATES = ("gflops", "algbw_gbs", "busbw_gbs", "items_per_s", "metric_value")
_COUNTS = (("ranks", 1), ("threads", 1), ("size", 0))
_NO_LOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def point_key(row):
    """The identity of a point, as strings, from a row dict."""
    return tuple(str(row[column]) for column in KEY_COLUMNS)


def row_problem(row):
    """Why a row read from a results CSV is not a valid point of this schema, or None when it is.

    Checks the field count, the schema version, the identity columns (non-empty,
    whole ``ranks`` >= 1, ``threads`` >= 1, ``size`` >= 0, ``scaling`` strong or
    weak), the times (finite, > 0), the rates (empty or finite), ``wrong``
    (empty or a whole number >= 0), ``spread`` (empty or a number >= 0) and ``stable``
    (empty, 0 or 1).
    """
    if None in row:
        return "more fields than the header"
    if any(value is None for value in row.values()):
        return "fewer fields than the header (a cut row)"
    if row["schema"] != str(SCHEMA_VERSION):
        return f"schema {row['schema']!r}, not {SCHEMA_VERSION}"
    for column in _TEXT:
        if not row[column].strip():
            return f"empty {column}"
    if row["scaling"] not in ("strong", "weak"):
        return f"scaling {row['scaling']!r}"
    for column, minimum in _COUNTS:
        if not _is_count(row[column], minimum):
            return f"{column} {row[column]!r} is not a whole number >= {minimum}"
    for column in _TIMES:
        value = _number(row[column])
        if value is None or not value > 0:
            return f"{column} {row[column]!r} is not a time > 0"
    for column in _RATES:
        if row[column] and _number(row[column]) is None:
            return f"{column} {row[column]!r} is not a number"
    if row["wrong"] and not _is_count(row["wrong"], 0):
        return f"wrong {row['wrong']!r} is not a whole number >= 0"
    spread = row.get("spread", "")
    if spread and not (_number(spread) is not None and _number(spread) >= 0):
        return f"spread {spread!r} is not a number >= 0"
    if row.get("stable", "") not in ("", "0", "1"):
        return f"stable {row['stable']!r} is not 0 or 1"
    return None


def _number(text):
    """The finite float ``text`` names, else None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _is_count(text, minimum):
    return text.strip().isdigit() and int(text) >= minimum


def latest_rows(rows):
    """The valid rows of ``rows`` (``(line number, row)`` pairs, as `read_rows` gives them), the last one of each
    point: a point measured again (``--remeasure-unstable``) replaces its earlier row."""
    latest = {}
    for _, row in rows:
        if row_problem(row) is None:
            latest.pop(point_key(row), None)
            latest[point_key(row)] = row
    return list(latest.values())


def read_rows(path):
    """The rows of a results CSV as ``(line number, row dict)`` pairs, rows of any validity.

    Raises `InputError` naming ``path`` when it cannot be read, is not UTF-8 text
    or its header is not this schema's.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror}") from None
    return _parse(path, _decode(path, data))[1]


def _decode(path, data):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{path} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}): "
                         "not an mlscale results file") from None


def _parse(path, text):
    """``(header columns, [(line number, row)])``; the optional columns a file lacks are empty in its rows."""
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = tuple(reader.fieldnames or ())
    missing = [c for c in COLUMNS if c not in header and c not in OPTIONAL_COLUMNS]
    if missing:
        raise InputError(f"{path}: not an mlscale results file of schema {SCHEMA_VERSION} "
                         f"(missing column {missing[0]!r})")
    absent = {column: "" for column in OPTIONAL_COLUMNS if column not in header}
    try:
        return header, [(reader.line_num, {**row, **absent}) for row in reader]
    except csv.Error as error:
        raise InputError(f"{path} line {reader.line_num}: not a CSV row ({error})") from None


def _csv_line(values):
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(values)
    return buffer.getvalue()


def _stderr_line(line):
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class ResultsFile:
    """Append-only results CSV owned by one process (rank 0) of one run; a context manager.

    Opening takes an exclusive, non-blocking lock on the file (held until `close`),
    checks that the file is UTF-8 with this schema's header, removes a partial last
    row after saying so through ``warn`` (one line; default: stderr), and writes the
    header into a new file. `done` holds the keys of the valid points already in the
    file (with ``remeasure_unstable``, not those whose last row says ``stable`` 0:
    they are measured again, and `close` writes the file anew with the last row of each
    point, through a temporary file renamed over it, so a crash leaves the old file or
    the new one whole); `columns` is its header, which new rows follow (a file older than
    one of the `OPTIONAL_COLUMNS` goes on without it). Every problem is an `InputError`
    naming the file.
    """

    def __init__(self, path, warn=_stderr_line, remeasure_unstable=False):
        self.path = path
        self._warn = warn
        self._remeasure, self._replaced = remeasure_unstable, False
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
        except OSError as error:
            raise InputError(f"cannot write results to {path}: {error.strerror}") from None
        try:
            self._lock()
            self.done = self._resume()
        except OSError as error:
            self.close()
            raise InputError(f"cannot read results from {path}: {error.strerror}") from None
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def _lock(self):
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"{self.path} is in use by another mlscale run (it holds the file's lock); "
                             "wait for that run to end or choose another --csv") from None
        except OSError as error:
            if error.errno not in _NO_LOCK:
                raise InputError(f"cannot lock {self.path}: {error.strerror}") from None
            self._warn(f"mlscale: warning: cannot lock {self.path} ({error.strerror}): "
                       "do not start a second run on this file until this one ends")

    def _resume(self):
        """Read the file under the lock: check it, cut a partial last row, write a new file's header."""
        data = self._read_all()
        complete = data.rfind(b"\n") + 1
        header = _csv_line(COLUMNS).encode()
        if complete == 0 and data and not header.startswith(data):
            complete = len(data)  # one line, no newline, and not a cut header: let the header check refuse it
        self.columns, rows = _parse(self.path, _decode(self.path, data[:complete])) if complete else (COLUMNS, [])
        if complete < len(data):
            self._warn(f"mlscale: warning: {self.path} ends in a row cut mid-write ({len(data) - complete} bytes "
                       "without a newline); removing it, its point will be measured again")
            self._truncate(complete)
        if not complete:
            self._write(header)
        latest = latest_rows(rows)
        self.unstable = {point_key(row) for row in latest if row.get("stable") == "0"} if self._remeasure else set()
        return {point_key(row) for row in latest} - self.unstable

    def _read_all(self):
        chunks = []
        os.lseek(self._fd, 0, os.SEEK_SET)
        while True:
            chunk = os.read(self._fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    def _truncate(self, size):
        try:
            os.ftruncate(self._fd, size)
        except OSError as error:
            raise InputError(f"cannot cut {self.path} back to its last complete row: {error.strerror}") from None

    def _write(self, data):
        """Append ``data`` (whole lines); on any error cut the file back to its size before and raise."""
        size = os.fstat(self._fd).st_size
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                if not written:
                    raise OSError(errno.EIO, os.strerror(errno.EIO))
                view = view[written:]
        except OSError as error:
            self._truncate(size)
            raise InputError(f"cannot write results to {self.path}: {error.strerror}; "
                             "the file ends on its last complete row") from None

    def append(self, row):
        """Write one point (a dict with every column) as one whole line."""
        row = dict(row, schema=SCHEMA_VERSION)
        row["params"] = json.dumps(row.get("params") or {}, sort_keys=True)
        self._write(_csv_line([_format(row.get(column)) for column in self.columns]).encode())
        self.done.add(point_key(row))
        self._replaced |= point_key(row) in self.unstable

    def close(self):
        """Write the file anew if a point replaced its row, then release the lock and the file (again: nothing)."""
        if self._fd is not None:
            try:
                if self._replaced:
                    self._rewrite_latest()
            finally:
                os.close(self._fd)
                self._fd = None

    def _rewrite_latest(self):
        """The file with the last row of each point only, written to a temporary file renamed over it."""
        columns, rows = _parse(self.path, _decode(self.path, self._read_all()))
        kept = {id(row) for row in latest_rows(rows)}
        lines = [_csv_line(columns)] + [_csv_line([row[column] for column in columns]) for _, row in rows
                                         if id(row) in kept or row_problem(row) is not None]
        folder = os.path.dirname(os.path.abspath(self.path))
        handle, temporary = tempfile.mkstemp(prefix=".results-", suffix=".csv", dir=folder)
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write("".join(lines).encode())
                stream.flush()
                os.fsync(stream.fileno())
            os.chmod(temporary, os.fstat(self._fd).st_mode & 0o777)
            os.replace(temporary, self.path)
        except OSError as error:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise InputError(f"cannot write {self.path} with the points measured again: {error.strerror}; "
                             "it keeps both rows of each (the last one counts)") from None


def _format(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
