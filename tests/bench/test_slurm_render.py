"""``mlscale slurm`` without a cluster: rendered scripts, submission through a stand-in sbatch, bad input."""
import csv
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from bench.cli import main
from bench.registry import SUITES

from tests.clitools import ROOT
BASE = ["slurm", "allreduce", "--ntasks-per-node", "2", "--sizes", "8,1K", "--iters", "2"]


def mlscale_slurm(capsys, *args):
    """Run ``mlscale ARGS`` in this process; return (exit status, stdout lines, stderr lines)."""
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err.splitlines()


def sbatch_lines(text):
    return re.findall(r"^#SBATCH (\S+)$", text, re.MULTILINE)


def run_line(text):
    """The script's last line: the launcher and the ``mlscale run`` command."""
    return text.rstrip("\n").splitlines()[-1]


def test_strong_scripts_one_per_node_count(capsys, tmp_path):
    out = tmp_path / "res"
    status, lines, _ = mlscale_slurm(capsys, *BASE, "--nodes", "4,1,2", "--partition", "batch", "--time",
                                     "00:10:00", "--account", "proj-1", "--out", str(out))
    assert status == 0
    paths = [str(out / f"allreduce-strong-N{n}.sbatch") for n in (1, 2, 4)]
    assert lines[:3] == paths
    assert lines[3] == f"# sbatch each script, then: mlscale report {out}/allreduce-strong-N*.csv"
    text = open(paths[2]).read()
    assert sbatch_lines(text) == [
        "--job-name=allreduce-strong-N4", "--nodes=4", "--ntasks-per-node=2", "--exclusive",
        f"--output={out}/allreduce-strong-N4-%j.log", "--partition=batch", "--time=00:10:00", "--account=proj-1"]
    assert run_line(text) == (f"srun --mpi=pmi2 {sys.executable} -m bench.cli run allreduce --scaling strong "
                              f"--csv {out}/allreduce-strong-N4.csv --sizes 8,1K --iters 2")
    assert 'cd "${SLURM_SUBMIT_DIR:-.}"' in text
    assert f"export PYTHONPATH={ROOT}" in text
    assert "mlscale slurm allreduce" in text.splitlines()[2]
    for path in paths:
        assert subprocess.run(["bash", "-n", path]).returncode == 0


def test_weak_and_gpu_templates(capsys, tmp_path):
    status, _, _ = mlscale_slurm(capsys, *BASE, "--nodes", "2", "--scaling", "weak", "--no-check",
                                 "--variants", "ring", "--out", str(tmp_path))
    assert status == 0
    text = open(tmp_path / "allreduce-weak-N2.sbatch").read()
    assert " --scaling weak " in run_line(text)
    assert run_line(text).endswith("--variants ring --sizes 8,1K --iters 2 --no-check")
    status, _, _ = mlscale_slurm(capsys, "slurm", "allreduce", "--nodes", "2", "--gpus-per-node", "4",
                                 "--backend", "cupy", "--launcher", "mpiexec", "--out", str(tmp_path))
    assert status == 0
    text = open(tmp_path / "allreduce-strong-gpu-N2.sbatch").read()
    assert "--ntasks-per-node=4" in sbatch_lines(text) and "--gpus-per-node=4" in sbatch_lines(text)
    assert re.match(r"\S*mpiexec -n 8 \S+ -m bench.cli run allreduce --backend cupy --scaling strong ",
                    run_line(text))


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_every_suite_renders_on_the_gpu_template_one_rank_per_gpu(capsys, tmp_path, suite):
    status, lines, _ = mlscale_slurm(capsys, "slurm", suite, "--nodes", "1,2", "--gpus-per-node", "2",
                                     "--backend", "cupy", "--out", str(tmp_path))
    assert status == 0
    for nodes in (1, 2):
        text = open(tmp_path / f"{suite}-strong-gpu-N{nodes}.sbatch").read()
        assert sbatch_lines(text)[1:4] == [f"--nodes={nodes}", "--ntasks-per-node=2", "--gpus-per-node=2"]
        assert f" -m bench.cli run {suite} --backend cupy --scaling strong " in run_line(text)
        assert subprocess.run(["bash", "-n", str(tmp_path / f"{suite}-strong-gpu-N{nodes}.sbatch")]).returncode == 0


def test_mpiexec_script_calibrates_then_runs_outside_slurm_and_the_hint_reports_both(capsys, tmp_path):
    status, lines, _ = mlscale_slurm(capsys, "slurm", "allreduce", "--nodes", "1", "--ntasks-per-node", "2",
                                     "--launcher", "mpiexec", "--variants", "mpi,tree", "--sizes", "24",
                                     "--iters", "2", "--warmup", "0", "--calibrate", "quick", "--out", str(tmp_path))
    assert status == 0
    assert lines[-1].endswith(f"--model {tmp_path}/allreduce-strong-N1.calib.json")
    done = subprocess.run(["bash", lines[0]], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "allreduce-strong-N1.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["variant"], row["ranks"], row["nodes"], row["wrong"]) for row in rows] == [
        ("mpi", "2", "1", "0"), ("tree", "2", "1", "0")]
    calibration = json.loads((tmp_path / "allreduce-strong-N1.calib.json").read_text())
    assert calibration["quick"] is True and calibration["scope"] == "intra-node"
    words = [found for word in lines[-1].split(": ", 1)[1].split()[1:] for found in glob.glob(word) or [word]]
    report = words + ["--out", str(tmp_path / "report"), "--no-plots"]  # the hint, its glob expanded as a shell would
    assert main(report) == 0 and "allreduce model error" in capsys.readouterr().out


def test_calibrate_runs_in_every_job_of_two_ranks_before_its_sweep(capsys, tmp_path):
    out = tmp_path / "res"
    status, lines, _ = mlscale_slurm(capsys, *BASE[:2], "--ntasks-per-node", "1", "--nodes", "1,2,4", "--calibrate",
                                     "--out", str(out))
    assert status == 0
    assert lines[0] == "# N1: one rank, no calibration (mlscale calibrate measures between two ranks)"
    assert lines[-1] == (f"# sbatch each script, then: mlscale report {out}/allreduce-strong-N*.csv "
                         f"--model {out}/allreduce-strong-N2.calib.json")  # N4's is inter-node too: one of each
    assert "bench.cli calibrate" not in open(out / "allreduce-strong-N1.sbatch").read()
    for nodes in (2, 4):
        calibrate, run = open(out / f"allreduce-strong-N{nodes}.sbatch").read().rstrip("\n").splitlines()[-2:]
        assert calibrate == (f"srun --mpi=pmi2 {sys.executable} -m bench.cli calibrate --in-job --force --out "
                             f"{out}/allreduce-strong-N{nodes}.calib.json")
        assert run.startswith(f"srun --mpi=pmi2 {sys.executable} -m bench.cli run allreduce ")


def test_submit_prints_the_job_ids(capsys, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho "$(wc -l < {calls});cluster"\n')
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    status, lines, _ = mlscale_slurm(capsys, *BASE, "--nodes", "1,2", "--submit", "--out", str(tmp_path / "r"))
    assert status == 0
    scripts = [str(tmp_path / "r" / f"allreduce-strong-N{n}.sbatch") for n in (1, 2)]
    assert lines[:2] == [f"submitted job 1: {scripts[0]}", f"submitted job 2: {scripts[1]}"]
    assert calls.read_text().splitlines() == [f"--parsable {path}" for path in scripts]


def test_rejected_submission_is_one_line(capsys, tmp_path, monkeypatch):
    sbatch = tmp_path / "sbatch"
    sbatch.write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Invalid partition' >&2\nexit 1\n")
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    status, _, err = mlscale_slurm(capsys, *BASE, "--submit", "--out", str(tmp_path / "r"))
    assert status == 2
    assert err == [f"mlscale: error: sbatch rejected {tmp_path}/r/allreduce-strong-N1.sbatch: "
                   "sbatch: error: Batch job submission failed: Invalid partition"]


@pytest.mark.parametrize("args, message", [
    (["--nodes", "0"], "--nodes: node counts must be >= 1, got 0"),
    (["--nodes", "1,two"], "malformed --nodes '1,two'"),
    (["--ntasks-per-node", "0"], "--ntasks-per-node must be >= 1, got 0"),
    (["--nodes", "1,2", "--ranks", "3"], "--ranks 3 asks for more ranks than the job of 1 node(s) x 2 task(s)"),
    (["--variants", "bogus"], "unknown variant 'bogus'"),
    (["--backend", "cupy"], "--backend cupy runs the GPU template, which needs --gpus-per-node"),
    (["--gpus-per-node", "2"], "--gpus-per-node selects the GPU template, which runs --backend cupy"),
    (["--gpus-per-node", "0", "--backend", "cupy"], "--gpus-per-node must be >= 1, got 0"),
    (["--gpus-per-node", "4", "--backend", "cupy"], "one rank per GPU: --ntasks-per-node 2 differs"),
    (["--csv", "x.csv"], "writes one CSV per node count into --out; drop --csv"),
    (["--time", "1 hour"], "--time '1 hour' is not a plain sbatch value"),
    (["--launcher", "mpirun"], "invalid choice: 'mpirun'"),
    (["--out", "my results"], "the path must not contain spaces"),
])
def test_bad_input_is_one_line_and_writes_nothing(capsys, tmp_path, args, message):
    out = tmp_path / "never"
    status, lines, err = mlscale_slurm(capsys, *BASE, "--out", str(out), *args)
    assert (status, lines, len(err)) == (2, [], 1)
    assert err[0].startswith("mlscale: error: ") and message in err[0]
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["slurm", "nosuch", "--ntasks-per-node", "1"], "unknown suite 'nosuch'"),
    (["slurm", "allreduce"], "--ntasks-per-node is required"),
    (["slurm", "p2p", "--nodes", "2,1", "--ntasks-per-node", "1"],
     "suite 'p2p' cannot run on 1 node(s) x 1 task(s) = 1 ranks: p2p pairs ranks"),
])
def test_impossible_jobs_are_refused(capsys, tmp_path, args, message):
    status, _, err = mlscale_slurm(capsys, *args, "--out", str(tmp_path / "never"))
    assert status == 2 and len(err) == 1 and message in err[0]
    assert not (tmp_path / "never").exists()


def test_submit_without_sbatch_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    status, _, err = mlscale_slurm(capsys, *BASE, "--submit", "--out", str(tmp_path / "never"))
    assert status == 2 and err == ["mlscale: error: --submit: no sbatch on PATH (run on a Slurm login node, "
                                   "or drop --submit)"]
    assert not (tmp_path / "never").exists()


def fake_command(bin_dir, name, body):
    """Write an executable ``bin_dir/name`` shell script with ``body``."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_settings_reach_the_job_that_runs(capsys, tmp_path, monkeypatch):
    """--set and MLSCALE_* become --set words of the run line, and the job measures with them."""
    bin_dir = tmp_path / "bin"
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    fake_command(bin_dir, "srun", f'[ "$1" = --mpi=pmi2 ] || exit 9\nshift\nexec {mpiexec} -n 2 "$@"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MLSCALE_GEMM_PANEL", "4")
    monkeypatch.setenv("MLSCALE_DP_MODEL", "cnn")  # another suite's: not forwarded
    status, lines, _ = mlscale_slurm(capsys, "slurm", "gemm", "--nodes", "1", "--ntasks-per-node", "2",
                                     "--variants", "summa", "--sizes", "9", "--iters", "1", "--warmup", "0",
                                     "--set", "grid=1x2", "--out", str(tmp_path / "r"))
    assert status == 0
    assert run_line(open(lines[0]).read()).endswith(
        "--variants summa --sizes 9 --iters 1 --warmup 0 --set GEMM_PANEL=4 --set GRID=1x2")
    monkeypatch.delenv("MLSCALE_GEMM_PANEL")
    done = subprocess.run(["bash", lines[0]], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, SLURM_SUBMIT_DIR=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "r" / "gemm-strong-N1.csv", newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert (row["ranks"], row["wrong"]) == ("2", "0")
    assert json.loads(row["settings"]) == {"MLSCALE_GEMM_PANEL": "4", "MLSCALE_GRID": "1x2"}
    assert (json.loads(row["params"])["layout"], json.loads(row["params"])["panel"]) == ("1x2", 4)


def test_report_hint_is_shell_quoted(capsys, tmp_path):
    out = tmp_path / "a&b$c"
    status, lines, _ = mlscale_slurm(capsys, *BASE, "--nodes", "1,2", "--out", str(out))
    assert status == 0
    prefix = "# sbatch each script, then: mlscale report "
    assert lines[-1].startswith(prefix)
    for nodes in (1, 2):
        (out / f"allreduce-strong-N{nodes}.csv").write_text("")
    listed = subprocess.run(["bash", "-c", "printf '%s\\n' " + lines[-1][len(prefix):]], capture_output=True,
                            text=True, check=True).stdout.splitlines()
    assert listed == [str(out / f"allreduce-strong-N{nodes}.csv") for nodes in (1, 2)]


@pytest.fixture
def two_node_partition(tmp_path, monkeypatch):
    """A stand-in sinfo: default partition ``debug`` of 2 nodes (one line per node state), ``big`` of 8."""
    fake_command(tmp_path / "bin", "sinfo", "printf 'debug* 1\\ndebug* 1\\nbig 8\\n'\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("args, message", [
    (["--nodes", "1,3"], "--nodes 3: partition 'debug' has 2 node(s) (sinfo); the job would pend forever"),
    (["--nodes", "9", "--partition", "big"], "--nodes 9: partition 'big' has 8 node(s) (sinfo); the job would pend "
                                                "forever"),
])
def test_more_nodes_than_the_partition_are_refused(capsys, tmp_path, two_node_partition, args, message):
    status, lines, err = mlscale_slurm(capsys, *BASE, "--submit", "--out", str(tmp_path / "never"), *args)
    assert (status, lines) == (2, []) and err == [f"mlscale: error: {message}"]
    assert not (tmp_path / "never").exists()


def test_node_counts_within_the_partition_render(capsys, tmp_path, two_node_partition):
    for args in (["--nodes", "1,2"], ["--nodes", "8", "--partition", "big"], ["--nodes", "4", "--partition", "x"]):
        status, _, err = mlscale_slurm(capsys, *BASE, "--out", str(tmp_path / "r"), *args)
        assert status == 0, err
