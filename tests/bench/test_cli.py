"""The command line end to end, as a user runs it: exit codes, one-line errors, resumable CSV."""
import errno
import json
import os
import subprocess

import pytest

from kernels.errors import InputError
from tests.clitools import PROMPT, ROOT, command, mlscale, rows_of


def mlscale_under_mpi(ranks, *args, **environment):
    """Run ``mpiexec -n RANKS mlscale run ARGS`` (as inside a batch job) with extra environment variables."""
    return mlscale("run", *args, ranks=ranks, **environment)


def test_list_names_every_suite_and_variant():
    status, out, err = mlscale("list", file_size_limit=1 << 17)  # no MPI started: see the report test
    assert (status, err) == (0, "")
    assert ("allreduce: variants mpi, ring, recursive_doubling, rabenseifner, tree, hierarchical, auto, nccl, "
            "ring+nccl, recursive_doubling+nccl, rabenseifner+nccl, tree+nccl, auto+nccl; backends numpy, cupy") in out
    assert "p2p: variants latency, bandwidth; backends numpy, cupy" in out
    first_lines = [line for line in out.splitlines() if not line.startswith(" ")]
    assert len(first_lines) == 19 and all(line.endswith("; backends numpy, cupy") for line in first_lines)


def test_sweep_measures_every_point_then_resumes(tmp_path):
    path = str(tmp_path / "allreduce.csv")
    args = ["sweep", "allreduce", "--np", "3", "--ranks", "1:3", "--sizes", "8,24K", "--iters", "2",
            "--warmup", "0", "--csv", path]
    status, out, err = mlscale(*args)
    assert status == 0, err
    rows = rows_of(path)
    assert len(rows) == 3 * 7 * 2   # ranks x variants (mpi and six hand-written) x sizes
    assert {row["wrong"] for row in rows} == {"0"}
    assert {row["ranks"] for row in rows} == {"1", "2", "3"}
    assert all(float(row["t_min_s"]) <= float(row["t_med_s"]) <= float(row["t_max_s"]) for row in rows)
    assert "busbw_GB/s" in out
    assert out.count("# nccl skipped on numpy: NCCL sums device buffers only (--backend cupy)") == 1
    assert out.count("# ring+nccl, recursive_doubling+nccl, rabenseifner+nccl, tree+nccl, auto+nccl skipped on numpy: "
                     "its messages go over NCCL, between device buffers only (--backend cupy)") == 1  # one per reason
    status, out, err = mlscale(*args)
    assert status == 0, err
    assert "nothing measured" in out
    assert len(rows_of(path)) == 42


def test_weak_scaling_and_p2p_rows(tmp_path):
    path = str(tmp_path / "p2p.csv")
    status, _, err = mlscale("sweep", "p2p", "--np", "2", "--sizes", "8,1K", "--iters", "3", "--csv", path,
                             "--scaling", "weak")
    assert status == 0, err
    rows = rows_of(path)
    assert [(r["variant"], r["size"]) for r in rows] == [("latency", "8"), ("latency", "1024"),
                                                         ("bandwidth", "8"), ("bandwidth", "1024")]
    assert rows[0]["metric"] == "latency_us" and float(rows[0]["metric_value"]) > 0


@pytest.mark.parametrize("args, message", [
    (["run", "nosuch"], "unknown suite 'nosuch'"),
    (["run", "allreduce", "--variants", "ring,bogus"], "unknown variant 'bogus'"),
    (["run", "allreduce", "--sizes", "8:12Q"], "malformed size"),
    (["run", "allreduce", "--sizes", "9:15"], "no power of two"),
    (["run", "allreduce", "--ranks", "1,x"], "malformed rank list"),
    (["run", "allreduce", "--ranks", "2"], "asked for 2 ranks but the MPI job has 1"),
    (["run", "allreduce", "--iters", "0"], "--iters must be >= 1"),
    (["run", "allreduce", "--dtype", "int8"], "runs dtype float64 or float32"),
    (["run", "allreduce", "--sizes", "12", "--dtype", "float64"], "not a whole number of float64"),
    (["run", "p2p", "--variants", "latency"], "even rank count"),
    (["run", "allreduce", "--backend", "cupy"], "backend"),
    (["run", "allreduce", "--csv", "/proc/no/such/dir/x.csv"], "cannot write results"),
    (["report", "/no/such.csv"], "no such results file"),
    (["bogus-command"], "invalid choice"),
    (["run", "tests.fake_cases:NotACase"], "'tests.fake_cases:NotACase' is not a bench.case.Case subclass"),
    (["run", "os:path"], "'os:path' is not a bench.case.Case subclass"),
])
def test_bad_input_is_one_line_and_status_2(args, message, tmp_path):
    if args[0] == "run" and "--csv" not in args:
        args = args + ["--csv", str(tmp_path / "results.csv")]
    status, out, err = mlscale(*args)
    assert status == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_a_foreign_csv_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    status, _, err = mlscale("run", "allreduce", "--sizes", "8", "--csv", str(path))
    assert status == 2 and "not an mlscale results file" in err
    assert path.read_text() == "a,b\n1,2\n"


def test_a_rank_that_raises_aborts_the_job_with_one_line(tmp_path):
    path = str(tmp_path / "x.csv")
    status, _, err = mlscale_under_mpi(3, "tests.fake_cases:RaisesOnRankOne", "--csv", path,
                                       MLSCALE_GRACE_SECONDS="0.3")  # the others wait 0.3 s, not 10, to abort
    assert status != 0
    assert err.strip() == "mlscale: error: rank 1: RuntimeError: boom on purpose"
    assert len(rows_of(path)) == 0


def test_setup_failing_on_one_rank_is_reported_by_rank_0_without_abort(tmp_path):
    status, _, err = mlscale_under_mpi(3, "tests.fake_cases:SetupFailsOnLastRank", "--csv",
                                       str(tmp_path / "x.csv"))
    assert status == 1
    assert err.strip() == "mlscale: error: rank 2: MemoryError: no room on purpose"


def test_a_failed_check_exits_1_and_keeps_the_row(tmp_path):
    path = str(tmp_path / "x.csv")
    status, _, err = mlscale_under_mpi(2, "tests.fake_cases:AlwaysWrong", "--csv", path)
    assert status == 1 and "2 wrong elements" in err
    assert [row["wrong"] for row in rows_of(path)] == ["2"]


def test_report_gives_the_reference_ratio_and_no_speedup_for_a_collective(tmp_path):
    path = str(tmp_path / "a.csv")
    assert mlscale("sweep", "allreduce", "--np", "2", "--ranks", "1,2", "--sizes", "1K", "--iters", "2",
                   "--variants", "mpi,ring", "--csv", path)[0] == 0
    # MPI is not started by a command that runs no job: under 128 KiB per file MPICH could not make its segments
    status, out, err = mlscale("report", path, "--out", str(tmp_path / "rep"), file_size_limit=1 << 17)
    assert (status, err) == (0, "")
    table = rows_of(str(tmp_path / "rep" / "scaling.csv"))
    assert len(table) == 4
    mpi_rows = [r for r in table if r["variant"] == "mpi"]
    assert [float(r["vs_ref"]) for r in mpi_rows] == [1.0, 1.0]
    assert {r["speedup"] for r in table} == {""}
    assert "## allreduce: details" in (tmp_path / "rep" / "summary.md").read_text()


def test_calibrate_then_report_with_model_and_projection(tmp_path):
    """A quick calibration between two "nodes" (MPICH's cliques): its messages measured between them, rank 0's
    rates alone (a full one, three rounds of every size, takes 16-20 s here and is never run by the tests: the
    spreads of real rounds are checked on tiny plans in test_harness_mpi, their judgement in
    test_calibration_stability). ``--force``: whether its real rounds agree depends on the node's noise, and
    the refusal of an unstable one is checked on scripted spreads there."""
    calib = str(tmp_path / "calib.json")
    status, out, err = mlscale("calibrate", "--quick", "--force", "--out", calib, MPIR_CVAR_NUM_CLIQUES="2")
    assert status == 0, err
    assert out.splitlines()[-1].startswith("calibrate (inter-node, quick): ")
    constants = json.loads(open(calib).read())
    assert constants["scope"] == "inter-node" and "busy" not in constants  # rank 0's node holds one rank
    assert constants["quick"] is True and constants["max_spread"] == 0.25
    path = str(tmp_path / "a.csv")
    assert mlscale("sweep", "gemv", "--np", "2", "--ranks", "1,2", "--sizes", "256", "--iters", "2",
                   "--variants", "rows,cols", "--max-spread", "1e9", "--csv", path,
                   MLSCALE_MEMORY_PROBE="0")[0] == 0  # stable on a busy node; no probe: no point left out by state
    status, out, err = mlscale("report", path, "--out", str(tmp_path / "rep"), "--model", calib,
                               "--project", "64,1024")
    assert status == 0, err
    assert "report: gemv model error at >= 2 ranks: median " in out
    assert f"report: projection to 64, 1024 ranks uses inter-node message constants of {calib}" in out
    projected = rows_of(str(tmp_path / "rep" / "projection.csv"))
    assert {r["ranks"] for r in projected} == {"64", "1024"}
    status, _, err = mlscale("report", path, "--project", "64")
    assert status == 2 and "--project needs --model" in err


@pytest.mark.parametrize("where, message", [
    ("missing/calib.json", "the folder {tmp}/missing does not exist"),
    ("", "calibrate --out {tmp}/ is a folder; give a file name, e.g. {tmp}/calib.json"),
])
def test_calibrate_refuses_an_unwritable_out_before_it_measures(tmp_path, where, message):
    status, out, err = mlscale("calibrate", "--out", f"{tmp_path}/{where}", timeout=PROMPT)
    assert (status, out) == (2, "") and err.count("\n") == 1
    assert message.format(tmp=tmp_path) in err


def test_a_calibration_that_cannot_be_written_whole_leaves_the_earlier_one(tmp_path, monkeypatch):
    from bench import calibrate as module

    path = tmp_path / "calib.json"
    path.write_text('{"earlier": true}')

    def disk_full(descriptor):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(module.os, "fsync", disk_full)
    with pytest.raises(InputError, match=f"^cannot write {path}: No space left on device$"):
        module.write_calibration(str(path), {"alpha_s": 1.0})
    assert path.read_text() == '{"earlier": true}' and os.listdir(tmp_path) == ["calib.json"]
    monkeypatch.undo()
    module.write_calibration(str(path), {"alpha_s": 1.0})
    assert json.loads(path.read_text()) == {"alpha_s": 1.0} and os.listdir(tmp_path) == ["calib.json"]
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("nodes", ["1", "2"])  # two (MPICH cliques): rank 0 measures alone, its partner sleeps
def test_calibrate_with_a_bad_suite_setting_ends_every_rank_with_one_line(tmp_path, nodes):
    calib = tmp_path / "calib.json"
    status, _, err = mlscale("calibrate", "--out", str(calib), MPIR_CVAR_NUM_CLIQUES=nodes,
                             MLSCALE_DP_DATASET=str(tmp_path / "nowhere"))
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("mlscale: error: MLSCALE_DP_DATASET=") and not calib.exists()


def test_a_setup_error_at_a_smaller_rank_count_ends_every_rank(tmp_path):
    status, _, err = mlscale("sweep", "tests.fake_cases:SetupFailsOnLastRank", "--np", "3", "--ranks", "2,3",
                             "--csv", str(tmp_path / "x.csv"))
    assert status == 1
    assert err.strip() == "mlscale: error: rank 1: MemoryError: no room on purpose"


def test_a_named_variant_is_skipped_where_it_cannot_run(tmp_path):
    path = str(tmp_path / "p2p.csv")
    status, out, err = mlscale("sweep", "p2p", "--np", "3", "--ranks", "1:3", "--variants", "latency",
                               "--sizes", "8", "--iters", "2", "--csv", path)
    assert status == 0, err
    assert [row["ranks"] for row in rows_of(path)] == ["2"]
    assert "# skipped latency on 1 ranks" in out and "# skipped latency on 3 ranks" in out


def test_a_named_variant_the_backend_cannot_run_is_one_line_and_status_2(tmp_path):
    path = tmp_path / "allreduce.csv"
    status, out, err = mlscale_under_mpi(2, "allreduce", "--variants", "mpi,nccl", "--sizes", "8", "--iters", "2",
                                         "--csv", str(path))
    assert status == 2
    assert err == "mlscale: error: variant 'nccl' cannot run on numpy: NCCL sums device buffers only (--backend cupy)\n"
    assert rows_of(path) == []


def test_list_into_a_closed_pipe_ends_quietly():
    read_end, write_end = os.pipe()
    os.close(read_end)  # as `mlscale list | head -1` once head has exited
    done = subprocess.run(command("list"), cwd=ROOT, stdout=write_end, stderr=subprocess.PIPE, text=True,
                          timeout=300)
    os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")


def test_version():
    status, out, err = mlscale("--version")
    assert status == 0 and out.startswith("mlscale ") and err == ""


def test_an_mlscale_mpiexec_that_does_not_exist_is_named_in_one_line():
    status, _, err = mlscale("sweep", "allreduce", "--np", "2", MLSCALE_MPIEXEC="/no/such/mpiexec")
    assert (status, err) == (2, "mlscale: error: MLSCALE_MPIEXEC=/no/such/mpiexec: no such executable\n")


FAKE_OPEN_MPI = """#!/bin/sh
if [ "$1" = --version ]; then echo "mpiexec (Open MPI) 5.0.3"; else echo "started $1 $2"; fi
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="Open MPI's refusal concerns root only")
def test_open_mpi_as_root_is_explained_in_one_line_unless_allowed(tmp_path):
    fake = tmp_path / "mpiexec"
    fake.write_text(FAKE_OPEN_MPI)
    fake.chmod(0o755)
    environment = {name: "" for name in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")}
    status, _, err = mlscale("sweep", "allreduce", "--np", "2", MLSCALE_MPIEXEC=str(fake), **environment)
    assert status == 2 and len(err.splitlines()) == 1
    assert "is Open MPI, which refuses to run as root" in err
    assert "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in err
    environment = dict.fromkeys(environment, "1")
    status, out, err = mlscale("sweep", "allreduce", "--np", "2", MLSCALE_MPIEXEC=str(fake), **environment)
    assert (status, out, err) == (0, "started -n 2\n", "")


def test_nodes_are_counted_by_shared_memory_not_host_names(tmp_path):
    path = str(tmp_path / "a.csv")
    status, _, err = mlscale("sweep", "allreduce", "--np", "3", "--ranks", "1,3", "--variants", "mpi", "--sizes", "8",
                             "--iters", "2", "--csv", path, MPIR_CVAR_NUM_CLIQUES="2")  # MPICH: two nodes on one host
    assert status == 0, err
    assert [(row["ranks"], row["nodes"]) for row in rows_of(path)] == [("1", "1"), ("3", "2")]
