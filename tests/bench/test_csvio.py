"""The results file: cut rows, failed writes, one writer at a time, bad rows, non-UTF-8 files."""
import errno
import os
import subprocess
import sys

import pytest

import bench.csvio
from bench.csvio import COLUMNS, ResultsFile, latest_rows, point_key, read_rows, row_problem
from kernels.errors import InputError
from tests.clitools import MPIEXEC, ROOT, TIMEOUT, mlscale, rows_of

HEADER = ",".join(COLUMNS) + "\n"


def point(size, seconds=1e-3, **changes):
    row = dict(suite="allreduce", benchmark="allreduce", variant="mpi", backend="numpy", dtype="float64",
               ranks=2, nodes=1, threads=1, scaling="strong", size=size, size_unit="bytes", iters=3, warmup=1,
               t_min_s=seconds, t_med_s=seconds, t_max_s=seconds, busbw_gbs=1.0, wrong=0, settings="{}",
               mpi_library="MPICH \u00e9", host="h", timestamp="t")
    row.update(changes)
    return row


def written(path, *points):
    with ResultsFile(str(path)) as results:
        for row in points:
            results.append(row)
    return path.read_bytes()


def reopen(path):
    warnings = []
    return ResultsFile(str(path), warn=warnings.append), warnings


# -- a row cut mid-write ---------------------------------------------------------------------------

@pytest.mark.parametrize("kept", [1, 10, -1])
def test_a_cut_last_row_is_removed_with_one_warning_and_measured_again(tmp_path, kept):
    path = tmp_path / "r.csv"
    whole = written(path, point(8))
    data = written(path, point(16))
    path.write_bytes(data[:len(whole) + kept % (len(data) - len(whole))])  # a crash cut the second row
    results, warnings = reopen(path)
    assert len(warnings) == 1 and str(path) in warnings[0] and "cut mid-write" in warnings[0]
    assert path.read_bytes() == whole
    assert results.done == {point_key(point(8))}
    results.append(point(16))
    results.close()
    assert [r["size"] for r in rows_of(path)] == ["8", "16"]


def test_a_row_cut_inside_a_multibyte_character_is_removed(tmp_path):
    path = tmp_path / "r.csv"
    whole = written(path, point(8))
    data = written(path, point(16))
    cut = data.rindex("\u00e9".encode()) + 1  # the first byte of a two-byte character
    path.write_bytes(data[:cut])
    results, warnings = reopen(path)
    results.close()
    assert len(warnings) == 1 and path.read_bytes() == whole


def test_a_cut_header_is_written_again(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text(HEADER[:17])
    results, warnings = reopen(path)
    results.close()
    assert len(warnings) == 1 and path.read_text() == HEADER


@pytest.mark.parametrize("content", [b"a,b\n1,2", b"a,b", b"\x00\x01\x02"])
def test_a_foreign_file_without_a_final_newline_is_refused_and_left_untouched(tmp_path, content):
    path = tmp_path / "other.csv"
    path.write_bytes(content)
    with pytest.raises(InputError, match=str(path)):
        ResultsFile(str(path), warn=pytest.fail)
    assert path.read_bytes() == content


# -- a write that fails ----------------------------------------------------------------------------

def failing_writer(monkeypatch, short):
    """Make `os.write` in bench.csvio write half of its bytes, then fail (at once, or on the next call)."""
    real, calls = os.write, []

    def write(fd, data):
        calls.append(len(data))
        if short and len(calls) == 1:
            return real(fd, bytes(data[:len(data) // 2]))
        real(fd, bytes(data[:len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(bench.csvio.os, "write", write)


@pytest.mark.parametrize("short", [False, True], ids=["error", "short-write-then-error"])
def test_a_failed_write_names_the_file_and_leaves_whole_rows(tmp_path, monkeypatch, short):
    path = tmp_path / "r.csv"
    results = ResultsFile(str(path))
    results.append(point(8))
    before = path.read_bytes()
    with monkeypatch.context() as patch:
        failing_writer(patch, short)
        with pytest.raises(InputError, match=f"cannot write results to {path}: No space left on device"):
            results.append(point(16))
    assert path.read_bytes() == before
    assert point_key(point(16)) not in results.done
    results.append(point(32))
    results.close()
    assert [r["size"] for r in rows_of(path)] == ["8", "32"]


def test_a_header_that_cannot_be_written_leaves_an_empty_file(tmp_path, monkeypatch):
    path = tmp_path / "r.csv"
    failing_writer(monkeypatch, short=False)
    with pytest.raises(InputError, match=str(path)):
        ResultsFile(str(path))
    assert path.read_bytes() == b""


# -- one writer at a time --------------------------------------------------------------------------

def test_a_second_writer_is_refused_and_no_second_header_is_written(tmp_path):
    path = tmp_path / "new.csv"
    first = ResultsFile(str(path))
    with pytest.raises(InputError, match=f"{path} is in use by another mlscale run"):
        ResultsFile(str(path))
    first.append(point(8))
    first.close()
    assert path.read_text().count("suite,") == 1
    with ResultsFile(str(path)) as second:  # the lock ends with the run that held it
        assert second.done == {point_key(point(8))}


def test_a_file_system_without_locks_is_said_and_used(tmp_path, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(bench.csvio.fcntl, "flock", no_locks)
    results, warnings = reopen(tmp_path / "r.csv")
    results.close()
    assert len(warnings) == 1 and "cannot lock" in warnings[0]


# -- rows that are not valid points ----------------------------------------------------------------

def as_text(row):
    return {column: "" if row.get(column) is None else str(row.get(column)) for column in COLUMNS} | {"schema": "2"}


@pytest.mark.parametrize("changes, reason", [
    ({"t_med_s": "nan"}, "t_med_s"), ({"t_min_s": "0"}, "t_min_s"), ({"t_max_s": "-1e-3"}, "t_max_s"),
    ({"t_med_s": "inf"}, "t_med_s"), ({"t_med_s": ""}, "t_med_s"), ({"suite": ""}, "empty suite"),
    ({"ranks": "0"}, "ranks"), ({"ranks": "1.5"}, "ranks"), ({"size": "-8"}, "size"),
    ({"scaling": "sideways"}, "scaling"), ({"busbw_gbs": "fast"}, "busbw_gbs"), ({"wrong": "-1"}, "wrong"),
    ({"schema": "3"}, "schema '3'"), ({"settings": None}, "fewer fields"), ({None: ["x"]}, "more fields"),
])
def test_row_problem_names_what_is_wrong(changes, reason):
    row = as_text(point(8)) | changes
    assert reason in row_problem(row)


def test_a_valid_row_has_no_problem_with_or_without_optional_fields():
    assert row_problem(as_text(point(8))) is None
    assert row_problem(as_text(point(8, wrong=None, busbw_gbs=None))) is None


def test_an_invalid_row_is_not_done_so_its_point_is_measured_again(tmp_path):
    path = tmp_path / "r.csv"
    written(path, point(8), point(16, seconds=float("nan")))
    results, _ = reopen(path)
    results.close()
    assert results.done == {point_key(point(8))}


# -- files written before the device, spread and stable columns ----------------------------------

OLD_COLUMNS = tuple(column for column in COLUMNS if column not in ("device", "spread", "stable"))


def old_file(path, *points):
    """A results file as mlscale wrote it before the ``device``, ``spread`` and ``stable`` columns (same
    schema version)."""
    lines = [",".join(OLD_COLUMNS)] + [",".join(as_text(row)[column] for column in OLD_COLUMNS) for row in points]
    path.write_text("\n".join(lines) + "\n")


def test_a_file_without_the_device_column_is_read_with_the_field_empty(tmp_path):
    path = tmp_path / "old.csv"
    old_file(path, point(8))
    [(_, row)] = read_rows(str(path))
    assert (row["device"], row["spread"], row["stable"]) == ("", "", "") and row_problem(row) is None
    assert row["size"] == "8"


def test_a_file_without_the_device_column_is_resumed_in_its_own_columns(tmp_path):
    path = tmp_path / "old.csv"
    old_file(path, point(8))
    results, warnings = reopen(path)
    assert warnings == [] and results.done == {point_key(point(8))}
    results.append(point(16, device="NVIDIA H200 (CuPy 13.3.0, CUDA 12.4)", spread=0.5, stable=0))
    results.close()
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(OLD_COLUMNS) and len(lines[2].split(",")) == len(OLD_COLUMNS)
    assert [(row["size"], row["device"], row_problem(row)) for _, row in read_rows(str(path))] == [
        ("8", "", None), ("16", "", None)]


def test_a_new_file_records_the_device_and_the_stability(tmp_path):
    path = tmp_path / "new.csv"
    written(path, point(8, device="NVIDIA H200 (CuPy 13.3.0, CUDA 12.4)", spread=0.0123, stable=1), point(16))
    assert [(row["device"], row["spread"], row["stable"]) for _, row in read_rows(str(path))] == [
        ("NVIDIA H200 (CuPy 13.3.0, CUDA 12.4)", "0.0123", "1"), ("", "", "")]


@pytest.mark.parametrize("column, value, problem", [
    ("spread", "-0.1", "spread '-0.1' is not a number >= 0"), ("spread", "nan", "spread 'nan' is not a number >= 0"),
    ("stable", "yes", "stable 'yes' is not 0 or 1"), ("stable", "2", "stable '2' is not 0 or 1")])
def test_a_bad_stability_figure_makes_the_row_invalid(column, value, problem):
    assert row_problem(dict(as_text(point(8)), **{column: value})) == problem


# -- measuring unstable points again ---------------------------------------------------------------

def test_unstable_points_are_measured_again_and_their_rows_replaced(tmp_path):
    path = tmp_path / "r.csv"
    written(path, point(8, stable=1), point(16, stable=0, seconds=2e-3), point(32))  # 32: before the column
    results, _ = reopen(path)
    assert results.done == {point_key(point(size)) for size in (8, 16, 32)}
    results.close()
    with ResultsFile(str(path), remeasure_unstable=True) as results:
        assert results.done == {point_key(point(8)), point_key(point(32))}
        results.append(point(16, stable=1, seconds=1e-3))
    assert [(row["size"], row["stable"], row["t_med_s"]) for _, row in read_rows(str(path))] == [
        ("8", "1", "0.001"), ("32", "", "0.001"), ("16", "1", "0.001")]
    assert (path.stat().st_mode & 0o777, os.listdir(tmp_path)) == (0o666 & ~_umask(), ["r.csv"])


def test_a_failed_rewrite_keeps_both_rows_and_the_last_one_counts(tmp_path, monkeypatch):
    path = tmp_path / "r.csv"
    written(path, point(8, stable=0, seconds=2e-3))
    results = ResultsFile(str(path), remeasure_unstable=True)
    results.append(point(8, stable=1))

    def disk_full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(bench.csvio.os, "replace", disk_full)
    with pytest.raises(InputError, match="No space left on device; it keeps both rows of each .the last one counts.$"):
        results.close()
    rows = read_rows(str(path))
    assert len(rows) == 2 and [row["stable"] for row in latest_rows(rows)] == ["1"] and os.listdir(tmp_path) == [
        "r.csv"]


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- non-UTF-8 files -------------------------------------------------------------------------------

def test_a_non_utf8_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "latin1.csv"
    content = written(path, point(8)).replace("\u00e9".encode(), "\u00e9".encode("latin-1"))
    path.write_bytes(content)
    for read in (read_rows, ResultsFile):
        with pytest.raises(InputError, match=f"{path} is not UTF-8 text .byte 0xe9"):
            read(str(path))
    assert path.read_bytes() == content


# -- the command line ------------------------------------------------------------------------------

RUN = ("allreduce", "--variants", "mpi", "--sizes", "8,16", "--iters", "2", "--warmup", "0")


def test_run_after_a_crash_cuts_the_half_row_and_measures_it_again(tmp_path):
    path = tmp_path / "a.csv"
    status, _, err = mlscale("run", *RUN, "--csv", str(path))
    assert status == 0, err
    path.write_bytes(path.read_bytes()[:-40])
    status, out, err = mlscale("run", *RUN, "--csv", str(path))
    assert status == 0, err
    assert len(err.strip().splitlines()) == 1 and str(path) in err and "cut mid-write" in err
    assert [r["size"] for r in rows_of(path)] == ["8", "16"]
    assert all(row_problem(r) is None for r in rows_of(path))


@pytest.mark.parametrize("ranks", [None, 2])
def test_a_run_on_a_locked_file_stops_with_one_line(tmp_path, ranks):
    path = tmp_path / "a.csv"
    with ResultsFile(str(path)):  # another run holds the file
        before = path.read_bytes()
        status, _, err = mlscale("run", *RUN, "--csv", str(path), ranks=ranks)
        assert path.read_bytes() == before
    assert status == 2
    assert err.strip() == (f"mlscale: error: {path} is in use by another mlscale run (it holds the file's lock); "
                           "wait for that run to end or choose another --csv")


def test_sweep_on_a_non_utf8_file_is_status_2_naming_it(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes(HEADER.encode() + b"\xff\xfe\n")
    for command in (("run",), ("sweep", "--np", "2")):
        status, _, err = mlscale(*command, *RUN, "--csv", str(path))
        assert status == 2 and len(err.strip().splitlines()) == 1
        assert f"{path} is not UTF-8 text" in err


LIMITED = """import resource, sys
from mpi4py import MPI  # MPI's own shared-memory files are made before the limit
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]),) * 2)
from bench.cli import main
sys.exit(main(sys.argv[2:]))
"""


def limited_mlscale(limit, *args, ranks=None):
    """``mlscale ARGS`` (under ``mpiexec -n RANKS``) whose writes may not grow a file beyond ``limit`` bytes."""
    launcher = [MPIEXEC, "-n", str(ranks)] if ranks else []
    done = subprocess.run(launcher + [sys.executable, "-c", LIMITED, str(limit), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT,
                          env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("ranks", [None, 2, 3])
def test_a_full_file_system_stops_every_rank_with_one_line_and_whole_rows(tmp_path, ranks):
    path = tmp_path / "a.csv"
    status, _, err = mlscale("run", "allreduce", "--variants", "mpi", "--sizes", "8", "--iters", "2",
                             "--csv", str(path))
    assert status == 0, err
    before = path.read_bytes()
    status, _, err = limited_mlscale(len(before) + 60, "run", *RUN, "--csv", str(path), ranks=ranks)
    assert status == 2
    assert err.strip().startswith(f"mlscale: error: cannot write results to {path}: File too large")
    assert len(err.strip().splitlines()) == 1
    assert path.read_bytes() == before


def test_a_file_that_cannot_be_read_back_is_one_line_naming_it(tmp_path, monkeypatch):
    def broken(fd, count):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(bench.csvio.os, "read", broken)
    with pytest.raises(InputError, match=f"cannot read results from {tmp_path / 'r.csv'}: Input/output error"):
        ResultsFile(str(tmp_path / "r.csv"))
