"""Progress lines, --time-limit and the OSU / nccl-tests option aliases, end to end."""
import json
import os
import pty
import subprocess

import pytest

from bench.options import size_range
from kernels.errors import InputError
from tests.clitools import PROMPT, ROOT, command, mlscale, rows_of


def test_a_log_gets_plain_numbered_lines_after_the_header(tmp_path):
    path = str(tmp_path / "allreduce.csv")
    status, out, err = mlscale("sweep", "allreduce", "--np", "2", "--ranks", "1,2", "--variants", "mpi,ring",
                               "--sizes", "8,1K", "-n", "2", "-w", "0", "--csv", path)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("# mlscale allreduce") and "busbw_GB/s" in lines[1]
    progress = [line for line in lines if line.startswith("[")]
    assert [line.split(" left")[0].split("  ~")[0] for line in progress] == [
        f"[{k}/8] {variant} size={size} ranks={ranks}" for k, (ranks, variant, size) in enumerate(
            [(r, v, s) for r in (1, 2) for v in ("mpi", "ring") for s in ("8", "1K")], 1)]
    assert all(line.endswith(" left") for line in progress[4:])  # every variant ran at 1 rank
    assert "\r" not in out
    assert len(rows_of(path)) == 8


def test_a_terminal_gets_one_line_rewritten_in_place(tmp_path):
    main, secondary = pty.openpty()
    process = subprocess.Popen(command("sweep", "allreduce", "--np", "1", "--variants", "mpi", "--sizes", "8,16",
                                       "-n", "2", "-w", "0", "--csv", str(tmp_path / "a.csv")),
                               cwd=ROOT, stdout=secondary, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the terminal closed with the last writer
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert process.wait(timeout=PROMPT) == 0, process.stderr.read()
    out = b"".join(chunks).decode()
    assert "\r\x1b[K[1/2] mpi size=8 ranks=1" in out and "\r\x1b[K[2/2] mpi size=16 ranks=1" in out
    assert "[1/2] mpi size=8 ranks=1\r\n" not in out  # never a line of its own


def test_a_time_limit_stops_between_points_with_a_whole_csv_then_resume_finishes(tmp_path):
    path = str(tmp_path / "slow.csv")
    args = ["sweep", "tests.fake_cases:SlowSetup", "--np", "2", "--ranks", "1,2", "--sizes", "1,2", "--csv", path]
    status, out, err = mlscale(*args, "--time-limit", "1.5s")  # each point takes >= 1 s: 2 points exceed it
    assert status == 3, err
    note = next(line for line in out.splitlines() if line.startswith("# time limit 1.5s"))
    not_measured = int(note.split("; ")[1].split(" ")[0])
    rows = rows_of(path)
    assert len(rows) + not_measured == 4 and len(rows) <= 1
    assert all(row["wrong"] == "0" and row["t_med_s"] for row in rows)
    status, out, err = mlscale(*args, FAKE_SETUP_SECONDS="0")  # the resume has no limit to reach
    assert status == 0, err
    assert sorted((row["ranks"], row["size"]) for row in rows_of(path)) == [("1", "1"), ("1", "2"), ("2", "1"),
                                                                            ("2", "2")]


def test_size_aliases_multiply_from_begin_to_end():
    assert size_range("8", "1K", None) == "8,16,32,64,128,256,512,1024"
    assert size_range("1K", "1M", 4) == "1024,4096,16384,65536,262144,1048576"
    assert size_range("3", "100", 3) == "3,9,27,81"
    assert size_range("64", None, None) == "64" and size_range(None, "64", None) == "64"


@pytest.mark.parametrize("begin, end, factor, message", [
    (None, None, 2, "-f needs -b"), ("8", "64", 1, "-f must be an integer >= 2"),
    ("64", "8", 2, "expected 1 <= begin <= end"), ("0", "8", 2, "expected 1 <= begin <= end"),
])
def test_bad_size_aliases_are_input_errors(begin, end, factor, message):
    with pytest.raises(InputError, match=message):
        size_range(begin, end, factor)


def test_short_options_set_sizes_iterations_warmup_and_check(tmp_path):
    unchecked, checked = str(tmp_path / "unchecked.csv"), str(tmp_path / "checked.csv")
    status, _, err = mlscale("run", "allreduce", "--variants", "mpi", "-b", "8", "-e", "64", "-f", "8", "-n", "3",
                             "-w", "1", "-c", "0", "--csv", unchecked)
    assert status == 0, err
    rows = rows_of(unchecked)
    assert [(r["size"], r["iters"], r["warmup"], r["wrong"]) for r in rows] == [("8", "3", "1", ""), ("64", "3", "1", "")]
    status, _, err = mlscale("run", "allreduce", "--variants", "mpi", "-b", "8", "-c", "1", "--csv", checked)
    assert status == 0, err
    assert [(r["size"], r["wrong"]) for r in rows_of(checked)] == [("8", "0")]


@pytest.mark.parametrize("args, message", [
    (["--sizes", "8", "-b", "8"], "either with --sizes or with -b/-e/-f"),
    (["-c", "2"], "expected 0 or 1"),
    (["-f", "2.5", "-b", "8"], "invalid int value"),
    (["--time-limit", "soon"], "malformed duration"),
])
def test_bad_short_options_are_one_line_and_status_2(args, message, tmp_path):
    status, _, err = mlscale("run", "allreduce", *args, "--csv", str(tmp_path / "x.csv"))
    assert status == 2 and message in err and len(err.splitlines()) == 1, err


def test_each_unstable_point_is_named_as_it_is_measured_and_counted_at_the_end(tmp_path):
    path = str(tmp_path / "jitter.csv")
    status, out, err = mlscale("run", "tests.fake_cases:Jittery", "--sizes", "1,2", "--csv", path,
                               "--max-point-seconds", "0.5")  # one more batch of 4 samples each at least: a
    # stall of half a second before the first would be needed to skip it (0.1 s was, once, beside the other tests)
    assert status == 0, err
    assert all(json.loads(row["params"])["samples"] >= 8 for row in rows_of(path))
    assert out.count("# unstable: only size=") == 2 and "spread" in out and "> 0.25" in out
    assert ("# 2 of 2 points unstable (spread > 0.25); run the same command with --remeasure-unstable to measure "
            "them again (on a quieter node, or with more --iters)") in out.splitlines()
    assert [(row["stable"], float(row["spread"]) > 0.25) for row in rows_of(path)] == [("0", True)] * 2
    status, out, err = mlscale("run", "tests.fake_cases:Jittery", "--sizes", "1,2,3", "--csv", path,
                               "--max-spread", "1000", "--remeasure-unstable", "--max-point-seconds", "0")
    assert status == 0 and "# unstable" not in out and "points unstable" not in out
    assert [(row["size"], row["stable"]) for row in rows_of(path)] == [("1", "1"), ("2", "1"), ("3", "1")]
    status, out, err = mlscale("run", "tests.fake_cases:Jittery", "--sizes", "3", "--csv", path,
                               "--max-spread", "0")
    assert status == 2 and err == "mlscale: error: --max-spread must be a number > 0, got 0.0\n"
    status, out, err = mlscale("run", "tests.fake_cases:Jittery", "--sizes", "3", "--csv", path,
                               MLSCALE_MAX_POINT_SECONDS="soon")
    assert status == 2 and err == "mlscale: error: MLSCALE_MAX_POINT_SECONDS must be a number of seconds >= 0, " \
                                  "got 'soon'\n"

