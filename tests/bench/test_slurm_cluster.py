"""``mlscale slurm --submit`` on a real two-node Slurm cluster started on this machine.

The cluster (munged, slurmctld, ``slurmd -N n1`` and ``slurmd -N n2``) comes from
`slurm_cluster.running_cluster`; every daemon is stopped by PID when the module's
tests end, pass or fail. Skipped where Slurm is not installed (``.ci/install-slurm``).
"""
import csv
import json
import os
import re
import subprocess
import sys

import pytest

from parallel.collectives import ALLREDUCE_ALGORITHMS
from tests.clitools import ROOT
from tests.slurm_cluster import namespaces_allowed, running_cluster, slurm_installed

#: Seconds a job may spend in the queue (pending and running) before the test fails.
JOB_TIMEOUT = 180
VARIANTS = ("mpi",) + tuple(ALLREDUCE_ALGORITHMS)  # every variant of the allreduce suite

pytestmark = [
    pytest.mark.skipif(not slurm_installed(), reason="Slurm is not installed (needs slurmctld, slurmd, sbatch, "
                       "squeue, sinfo and munged on PATH); .ci/install-slurm installs slurm-wlm and munge"),
    pytest.mark.skipif(os.geteuid() != 0 or not namespaces_allowed(),
                       reason="the test cluster needs root allowed to make UTS and mount namespaces (unshare)"),
    pytest.mark.xdist_group("slurm_cluster"),  # one cluster on its fixed ports: every test on one worker
]


@pytest.fixture(scope="module")
def cluster():
    with running_cluster(nodes=("n1", "n2"), cpus=2) as started:
        yield started


def submit_sweep(cluster, out_dir, *options, nodes="1,2"):
    """Run ``mlscale slurm allreduce --nodes NODES ... --submit``, wait for its jobs (one per node count);
    return their ids."""
    command = [sys.executable, "-m", "bench.cli", "slurm", "allreduce", "--nodes", nodes, "--ntasks-per-node", "1",
               "--sizes", "8,1K", "--iters", "2", "--out", str(out_dir), "--submit", *options]
    done = cluster.run(*command, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    job_ids = re.findall(r"^submitted job (\d+): ", done.stdout, re.MULTILINE)
    assert len(job_ids) == len(nodes.split(",")), done.stdout
    for job_id in job_ids:
        cluster.wait_for_job(job_id, JOB_TIMEOUT)
    return job_ids


def job_state(cluster, job_id):
    """``(JobState, ExitCode)`` of a finished job, from ``scontrol show job``."""
    text = cluster.run("scontrol", "-o", "show", "job", job_id).stdout
    fields = dict(re.findall(r"(\w+)=(\S+)", text))
    return fields.get("JobState"), fields.get("ExitCode")


def read_results(out_dir, stem):
    """Rows of ``OUT/STEM.csv``; fail with the job's log when the job wrote none."""
    path = os.path.join(out_dir, f"{stem}.csv")
    if not os.path.exists(path):
        logs = [name for name in os.listdir(out_dir) if name.startswith(stem) and name.endswith(".log")]
        text = "".join(open(os.path.join(out_dir, name)).read() for name in logs)
        pytest.fail(f"{stem}: no CSV written; job log:\n{text}")
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def check_rows(rows, nodes, variants):
    assert sorted((row["variant"], row["size"]) for row in rows) == sorted(
        (variant, size) for variant in variants for size in ("8", "1024"))
    assert {row["wrong"] for row in rows} == {"0"}
    assert {row["ranks"] for row in rows} == {str(nodes)}
    assert {row["nodes"] for row in rows} == {str(nodes)}, "a job did not spread over all its nodes"


def test_srun_jobs_on_one_and_two_nodes_write_valid_rows(cluster, tmp_path):
    job_ids = submit_sweep(cluster, tmp_path)
    assert [job_state(cluster, job_id) for job_id in job_ids] == [("COMPLETED", "0:0")] * 2
    for nodes in (1, 2):
        check_rows(read_results(tmp_path, f"allreduce-strong-N{nodes}"), nodes, VARIANTS)
    report = subprocess.run([sys.executable, "-m", "bench.cli", "report", *map(str, tmp_path.glob("*.csv")),
                             "--out", str(tmp_path / "report")], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert report.returncode == 0, report.stderr


def test_mpiexec_inside_the_allocation_spans_both_nodes(cluster, tmp_path):
    job_ids = submit_sweep(cluster, tmp_path, "--launcher", "mpiexec", "--variants", "mpi,ring", "--scaling", "weak",
                           "--calibrate", "quick", nodes="2")  # one node: the srun test's job
    assert [job_state(cluster, job_id) for job_id in job_ids] == [("COMPLETED", "0:0")]
    check_rows(read_results(tmp_path, "allreduce-weak-N2"), 2, ("mpi", "ring"))
    with open(tmp_path / "allreduce-weak-N2.calib.json") as handle:  # the job's own, between its two nodes
        assert json.load(handle)["scope"] == "inter-node"
