"""Memory and core checks before measuring (bench.resources, the models' memory_bytes), --force, --np, --threads."""
import os

import pytest

from bench import resources
from bench.cli import build_parser
from bench.models import get_model
from bench.models.base import Model
from bench.options import make_config
from bench.registry import SUITES, get_case
from kernels.errors import InputError
from tests.clitools import mlscale

GIB = 1 << 30
SMALL = {"allreduce": 1 << 20, "allgather": 1 << 20, "reduce_scatter": 1 << 20, "alltoall": 1 << 20, "bcast": 1 << 20,
         "reduce": 1 << 20, "p2p": 1 << 20, "blas1": 1 << 20, "gemv": 1024, "gemm": 512, "attention": 1024,
         "conv": 256, "svm": 500, "dp": 64, "tp": 256, "moe": 512, "pp": 64, "hybrid": 64, "ps": 64}
RANKS = {"p2p": 2, "ps": 2}


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_every_suite_estimates_memory_that_grows_with_the_size(suite):
    case = get_case(suite)
    model = case.model
    assert type(model).memory_bytes is not Model.memory_bytes, f"{suite} keeps the default estimate"
    ranks, variant, dtype = RANKS.get(suite, 1), case.variants[0], case.dtypes[0]
    if suite in ("gemm", "gemv", "blas1", "tp"):
        variant = {"gemm": "numpy", "gemv": "numpy", "blas1": "numpy_axpy", "tp": "serial"}[suite]
    small = model.memory_bytes(SMALL[suite], ranks, variant, dtype)
    large = model.memory_bytes(64 * SMALL[suite], ranks, variant, dtype)
    assert 0 < small < large
    assert model.memory_bytes(SMALL[suite], ranks, variant, dtype, check=False) <= small


def test_the_gemm_and_allreduce_examples_of_the_issue():
    gemm = get_model("gemm").memory_bytes(32 << 10, 1, "numpy", "float64")
    assert 24 * GIB <= gemm < 48 * GIB
    assert get_model("allreduce").memory_bytes(64 * GIB, 1, "mpi", "float64") >= 128 * GIB


def fake_node(monkeypatch, memory, cores=2):
    monkeypatch.setattr(resources, "node_memory", lambda: (memory, "MemAvailable"))
    monkeypatch.setattr(resources.os, "cpu_count", lambda: cores)


def test_sweep_refuses_a_point_that_does_not_fit_the_node_and_force_overrides(monkeypatch):
    fake_node(monkeypatch, 1 * GIB)
    args = build_parser().parse_args(["sweep", "allreduce", "--sizes", "8,1G", "--np", "2"])
    with pytest.raises(InputError) as error:
        make_config(args, 2)
    message = str(error.value)
    assert "allreduce mpi size 1073741824 on 2 rank(s) needs about" in message
    assert "GiB per rank" in message and "for the 2 rank(s) on this node" in message
    assert "the node has 1.0 GiB (MemAvailable)" in message and "--force" in message
    args = build_parser().parse_args(["sweep", "allreduce", "--sizes", "8,1G", "--np", "2", "--force"])
    make_config(args, 2)
    args = build_parser().parse_args(["sweep", "allreduce", "--sizes", "8,1M", "--np", "2"])
    make_config(args, 2)


def test_the_rank_baseline_counts_every_rank_on_the_node(monkeypatch):
    fake_node(monkeypatch, 4 * GIB)
    args = build_parser().parse_args(["sweep", "allreduce", "--sizes", "8", "--np", "1000"])
    with pytest.raises(InputError, match="for the 1000 rank"):
        make_config(args, 1000)


def test_slurm_renders_without_checking_the_login_node(monkeypatch):
    fake_node(monkeypatch, 1)
    args = build_parser().parse_args(["slurm", "allreduce", "--sizes", "1G", "--ntasks-per-node", "2"])
    make_config(args, 2)


def test_node_verdict_on_threads(monkeypatch):
    case = get_case("allreduce")
    args = build_parser().parse_args(["run", "allreduce", "--sizes", "8", "--threads", "2"])
    _, config = make_config(args, 1)
    on_node = lambda ranks: 2  # noqa: E731
    assert resources.node_verdict(case, config, on_node, (GIB, "MemTotal"), 4, False) == (None, None)
    error, warning = resources.node_verdict(case, config, on_node, (GIB, "MemTotal"), 3, False)
    assert error is None and "--threads 2 x 2 rank(s) on this node is more than its 3 cores" in warning
    config.threads = 999
    error, _ = resources.node_verdict(case, config, on_node, (GIB, "MemTotal"), 2, False)
    assert error == "--threads 999 is more than the 2 cores of this node (--force to run anyway)"
    assert resources.node_verdict(case, config, on_node, (GIB, "MemTotal"), 2, True)[0] is None


def test_node_memory_reads_this_machine():
    available, source = resources.node_memory()
    assert available > 0 and source


def test_format_bytes():
    assert [resources.format_bytes(v) for v in (12, 2048, 24 * GIB, 3 << 40)] == [
        "12 B", "2.0 KiB", "24.0 GiB", "3.0 TiB"]


def test_cli_refuses_impossible_sizes_before_any_job_starts(tmp_path):
    csv = str(tmp_path / "x.csv")
    for argv in (["sweep", "allreduce", "--sizes", "64G", "--np", "1", "--csv", csv],
                 ["sweep", "gemm", "--sizes", "64K", "--variants", "numpy", "--np", "1", "--csv", csv],
                 ["run", "gemm", "--sizes", "64K", "--variants", "numpy", "--csv", csv]):
        status, _, err = mlscale(*argv)
        assert status == 2, err
        assert len(err.strip().splitlines()) == 1 and "GiB per rank" in err and "the node has" in err
    assert not os.path.exists(csv)


def test_cli_np_zero_is_refused(tmp_path):
    status, _, err = mlscale("sweep", "allreduce", "--np", "0", "--sizes", "8", "--iters", "1", "--csv",
                             str(tmp_path / "x.csv"))
    assert status == 2 and err.strip() == "mlscale: error: --np must be >= 1, got 0"


def test_cli_threads_beyond_the_cores_are_refused_unless_forced(tmp_path):
    csv = str(tmp_path / "x.csv")
    cores = os.cpu_count()
    status, _, err = mlscale("run", "allreduce", "--threads", "999", "--sizes", "8", "--iters", "1", "--csv", csv)
    assert status == 2 and err.strip() == (f"mlscale: error: --threads 999 is more than the {cores} cores of this "
                                           "node (--force to run anyway)")
    status, _, err = mlscale("run", "allreduce", "--threads", "999", "--sizes", "8", "--iters", "1", "--csv", csv,
                             "--variants", "mpi", "--force")
    assert status == 0, err
    assert err.strip() == (f"mlscale: warning: --threads 999 x 1 rank(s) on this node is more than its {cores} "
                           "cores: the ranks share cores, timings suffer")


@pytest.mark.mpi
def test_every_rank_of_the_job_gets_the_same_verdict(monkeypatch):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    fake_node(monkeypatch, (comm.rank + 1) * GIB)  # only each node's first rank reads it
    args = build_parser().parse_args(["run", "allreduce", "--sizes", "8,1G", "--ranks", f"1,{comm.size}"])
    try:
        make_config(args, comm.size, comm)
        message = None
    except InputError as error:
        message = str(error)
    assert set(comm.allgather(message)) == {message}
    assert f"size 1073741824 on {comm.size} rank(s) needs about" in message
    assert f"for the {comm.size} rank(s) on this node" in message and "the node has 1.0 GiB" in message
    args = build_parser().parse_args(["run", "allreduce", "--sizes", "8,1K"])
    assert make_config(args, comm.size, comm)[1].sizes == [8, 1024]


@pytest.mark.parametrize("data", ["digits", "mnist", "breast_cancer", "synthetic", "moons", "FILE"])
def test_the_svm_estimate_covers_every_data_source(tmp_path, data):
    from bench.models.svm import SVMModel
    from bench.settings import resolve

    if data == "FILE":
        data = str(tmp_path / "tiny.svm")
        with open(data, "w") as handle:
            handle.write("+1 1:0.5 2:1.0\n-1 1:0.1 2:0.2\n")
    model = SVMModel(resolve(SVMModel.declared_settings, [f"SVM_DATA={data}"], {}, "svm"))
    assert 0 < model.memory_bytes(100, 2, "smo", "float64", check=False) < model.memory_bytes(100, 2, "smo", "float64")
