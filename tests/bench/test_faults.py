"""A job never hangs: an error on one rank, MLSCALE_DEBUG, Ctrl-C and SIGTERM end every rank with one line.

Each launch is bounded by `PROMPT` seconds: a hang fails the test (no other
assertion depends on time).
"""
import os
import signal
import time

import pytest

from tests.clitools import PROMPT, TIMEOUT, mlscale, processes_mentioning, rows_of, start, wait_for_rows


def mlscale_lines(err):
    """The lines mlscale itself wrote to stderr."""
    return [line for line in err.splitlines() if line.startswith("mlscale:")]


@pytest.mark.parametrize("case, status, line", [
    ("InputErrorInRunOnRankOne", 2, "mlscale: error: one class only on purpose"),
    ("RaisesOnRankOne", 1, "mlscale: error: rank 1: RuntimeError: boom on purpose"),
    ("InputErrorInCheckOnRankOne", 2, "mlscale: error: NaN feature on purpose"),
    ("CheckRaisesOnLastRank", 1, "mlscale: error: rank 2: ZeroDivisionError: check on purpose"),
    ("TeardownFailsOnLastRank", 1, "mlscale: error: rank 2: RuntimeError: teardown on purpose"),
    ("CheckFailsBeforeACollective", 2, "mlscale: error: cannot evaluate on purpose"),
    ("SetupFailsBeforeASplit", 1, "mlscale: error: rank 2: ValueError: setup on purpose"),
])
def test_an_error_on_one_rank_ends_every_rank_with_one_line(case, status, line, tmp_path):
    """Where the others wait in a collective the failing rank left, it aborts after the grace (0.3 s here, not
    the default 10 s); where they reach the agreement, every rank raises: the same line and status either way."""
    path = str(tmp_path / "x.csv")
    code, _, err = mlscale("run", f"tests.fake_cases:{case}", "--csv", path, ranks=3, timeout=PROMPT,
                           MLSCALE_GRACE_SECONDS="0.3")
    assert (code, err.strip()) == (status, line)
    assert rows_of(path) == []


def test_an_error_on_one_rank_ends_the_job_while_idle_ranks_sleep(tmp_path):
    code, _, err = mlscale("sweep", "tests.fake_cases:InputErrorInRunOnRankOne", "--np", "3", "--ranks", "2,3",
                           "--csv", str(tmp_path / "x.csv"), timeout=PROMPT, MLSCALE_GRACE_SECONDS="0.3")
    assert (code, err.strip()) == (2, "mlscale: error: one class only on purpose")


@pytest.mark.parametrize("ranks", ["3", "2,3"])
def test_an_input_error_of_every_rank_inside_the_timed_work_is_one_line(tmp_path, ranks):
    path = str(tmp_path / "x.csv")
    code, out, err = mlscale("sweep", "tests.fake_cases:InputErrorInRunOnEveryRank", "--np", "3", "--ranks", ranks,
                             "--csv", path, timeout=PROMPT)
    assert (code, err) == (2, "mlscale: error: three classes on purpose\n")
    assert rows_of(path) == []


def test_debug_prints_the_traceback_and_still_aborts(tmp_path):
    code, _, err = mlscale("run", "tests.fake_cases:RaisesOnRankOne", "--csv", str(tmp_path / "x.csv"), ranks=2,
                           timeout=PROMPT, MLSCALE_DEBUG="1", MLSCALE_GRACE_SECONDS="0.3")
    assert code == 1
    assert mlscale_lines(err) == ["mlscale: error: rank 1: RuntimeError: boom on purpose"]
    assert "Traceback (most recent call last)" in err and 'raise RuntimeError("boom on purpose")' in err


def _interrupt(process, csv_path, send):
    """Wait for the first row of ``csv_path``, call ``send(process)``; return (status, stderr)."""
    wait_for_rows(csv_path, 1, process)
    send(process)
    try:
        _, err = process.communicate(timeout=PROMPT)
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return process.returncode, err


def assert_whole_rows(path):
    """Every line of ``path`` is a complete row: the file ends with a newline, each row has every column."""
    with open(path) as handle:
        text = handle.read()
    assert text.endswith("\n")
    rows = rows_of(path)
    assert rows and all(None not in row and None not in row.values() for row in rows)


ALLREDUCE = ("allreduce", "--sizes", "8:64K", "--iters", "200")


def test_sigint_to_mpiexec_ends_every_rank_with_130_and_whole_rows(tmp_path):
    path = str(tmp_path / "a.csv")
    process = start("run", *ALLREDUCE, "--csv", path, ranks=2)
    code, err = _interrupt(process, path, lambda p: p.send_signal(signal.SIGINT))
    assert (code, mlscale_lines(err)) == (130, ["mlscale: interrupted by SIGINT; rows already written are complete"])
    assert "Traceback" not in err
    assert_whole_rows(path)


def test_ctrl_c_to_the_sweeps_process_group_prints_one_line(tmp_path):
    path = str(tmp_path / "a.csv")
    process = start("sweep", *ALLREDUCE, "--np", "2", "--csv", path)
    code, err = _interrupt(process, path, lambda p: os.killpg(p.pid, signal.SIGINT))
    assert (code, err.strip()) == (130, "mlscale: interrupted by SIGINT; rows already written are complete")
    assert_whole_rows(path)


def _job_left_running(path):
    """The processes still naming ``path`` once they had `TIMEOUT` seconds to end (killed, then returned)."""
    deadline = time.monotonic() + TIMEOUT
    while processes_mentioning(path) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_mentioning(path)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def test_sigterm_to_the_sweep_stops_mpiexec_and_its_ranks(tmp_path):
    path = str(tmp_path / "a.csv")
    process = start("sweep", *ALLREDUCE, "--np", "2", "--csv", path)
    code, err = _interrupt(process, path, lambda p: p.send_signal(signal.SIGTERM))
    assert _job_left_running(path) == []
    assert (code, err.strip()) == (143, "mlscale: interrupted by SIGTERM; rows already written are complete")
    assert_whole_rows(path)


def test_sigkill_of_the_sweep_alone_still_ends_mpiexec_and_its_ranks(tmp_path):
    """As the OOM killer ends it: only the mlscale process, which can forward nothing."""
    path = str(tmp_path / "a.csv")
    process = start("sweep", "tests.fake_cases:HangsAfterTheFirstPoint", "--sizes", "1,2", "--np", "2",
                    "--csv", path)
    wait_for_rows(path, 1, process)
    process.kill()
    process.communicate(timeout=PROMPT)
    assert _job_left_running(path) == []
    assert_whole_rows(path)
