"""The ``blas1``, ``gemv`` and ``gemm`` suites: end to end through the command line, checks, models."""
import json
import re

import numpy as np
import pytest
from mpi4py import MPI

from bench.cases.blas1 import Blas1
from bench.families.blas import seeded_rows
from bench.cases.gemm import Gemm
from bench.cases.gemv import Gemv
from bench.families.blas import TF32_EPS
from bench.models import collective_terms
from bench.models.blas1 import CALLS, Blas1Model
from bench.models.gemm import GemmModel
from bench.models.gemv import GemvModel
from kernels.backend import get_backend
from kernels.errors import InputError
from tests.bench.report_rows import calibration
from tests.clitools import mlscale, rows_of

SUITES = {"blas1": "bench.cases.blas1:Blas1", "gemv": "bench.cases.gemv:Gemv", "gemm": "bench.cases.gemm:Gemm"}
CASES = {"blas1": Blas1, "gemv": Gemv, "gemm": Gemm}


@pytest.mark.parametrize("suite, size, expected", [
    ("blas1", "1001", {"numpy_dot": "1", "numpy_nrm2": "1", "numpy_axpy": "1", "dot": "12", "nrm2": "12",
                       "axpy": "12"}),
    ("gemv", "13", {"numpy": "1", "rows": "12", "cols": "12", "2d": "12"}),
    ("gemm", "13", {"numpy": "1", "1d_ring": "12", "1d_allgather": "12", "summa": "12", "summa_lookahead": "12",
                    "summa_shared": "12", "cannon": "1", "cannon_overlap": "1", "25d": "2"}),
])
def test_weak_sweep_of_every_variant_on_1_and_2_ranks(tmp_path, suite, size, expected):
    path = str(tmp_path / "out.csv")
    on_host = ",".join(v for v in CASES[suite].variants if v not in CASES[suite].device_only_variants)
    status, out, err = mlscale("sweep", SUITES[suite], "--np", "2", "--ranks", "1,2", "--sizes", size,
                               "--scaling", "weak", "--iters", "1", "--warmup", "0", "--csv", path,
                               "--variants", on_host)
    assert status == 0, err
    rows = rows_of(path)
    ranks_of = {variant: "".join(sorted(r["ranks"] for r in rows if r["variant"] == variant))
                for variant in {r["variant"] for r in rows}}
    assert ranks_of == expected
    assert {row["wrong"] for row in rows} == {"0"}
    case = CASES[suite]()
    for row in rows:
        params, ranks = json.loads(row["params"]), int(row["ranks"])
        assert params["problem_size"] == case.model.problem_size(int(size), ranks, "weak")
        assert row["metric"] == "comm_share" and 0 <= float(row["metric_value"]) <= 1
        assert 0 <= params["exposed_comm_s"] <= params["busy_s"]
        assert float(row["gflops"]) > 0
        if row["variant"].startswith("numpy"):
            assert params["layout"] == "1 process" and params["comm_bytes_per_rank"] == 0
            assert float(row["metric_value"]) == 0
    assert "skipped numpy" in out


def test_gemm_on_three_ranks_runs_the_non_square_variants(tmp_path):
    path = str(tmp_path / "gemm.csv")
    status, out, err = mlscale("sweep", SUITES["gemm"], "--np", "3", "--sizes", "10", "--iters", "1",
                               "--warmup", "0", "--dtype", "float32", "--csv", path)
    assert status == 0, err
    rows = rows_of(path)
    assert sorted(row["variant"] for row in rows) == ["1d_allgather", "1d_ring", "summa", "summa_lookahead",
                                                      "summa_shared"]
    assert {row["wrong"] for row in rows} == {"0"}
    for summa in (row for row in rows if row["variant"].startswith("summa")):
        assert json.loads(summa["params"])["layout"] == "3x1" and json.loads(summa["params"])["panel"] == 256
    assert "skipped cannon on 3 ranks: cannon needs a perfect square" in out
    assert "skipped cannon_overlap on 3 ranks: cannon_overlap needs a perfect square" in out
    assert "skipped 25d on 3 ranks" in out


@pytest.mark.parametrize("nodes, shared, sent", [("1", "B", 0), ("2", "none", 13 * 13 * 8)])
def test_summa_shared_reads_in_place_on_one_node_and_broadcasts_across_nodes(tmp_path, nodes, shared, sent):
    # MPIR_CVAR_NUM_CLIQUES=2 makes MPICH place the two ranks on two nodes (no shared memory between them).
    path = str(tmp_path / "gemm.csv")
    status, _, err = mlscale("sweep", SUITES["gemm"], "--np", "2", "--ranks", "2", "--sizes", "13", "--variants",
                             "summa_shared", "--iters", "1", "--warmup", "0", "--csv", path,
                             MPIR_CVAR_NUM_CLIQUES=nodes)
    assert status == 0, err
    [row] = rows_of(path)
    params = json.loads(row["params"])
    assert row["wrong"] == "0" and params["layout"] == "2x1"
    assert params["node_shared"] == shared and params["comm_bytes_per_rank"] == sent
    if nodes == "1":  # nothing timed as communication at all; across nodes it broadcasts (bytes above)
        assert params["exposed_comm_s"] == 0


def test_gemv_on_three_ranks_with_a_chosen_grid(tmp_path):
    path = str(tmp_path / "gemv.csv")
    status, _, err = mlscale("sweep", SUITES["gemv"], "--np", "3", "--sizes", "11", "--variants", "rows,cols,2d",
                             "--iters", "1", "--warmup", "0", "--dtype", "float32", "--csv", path, MLSCALE_GRID="1x3")
    assert status == 0, err
    rows = rows_of(path)
    assert {row["wrong"] for row in rows} == {"0"} and len(rows) == 3
    assert {row["variant"]: json.loads(row["params"])["layout"] for row in rows} == {
        "rows": "rows", "cols": "cols", "2d": "1x3"}


@pytest.mark.parametrize("args, environment, message", [
    (["--np", "3", "--variants", "cannon"], {}, "cannon needs a perfect square rank count, not 3"),
    (["--np", "2", "--variants", "cannon_overlap"], {}, "cannon_overlap needs a perfect square rank count, not 2"),
    (["--np", "2", "--variants", "summa_lookahead"], {"MLSCALE_GRID": "1x3"}, "MLSCALE_GRID=1x3 does not fit 2"),
    (["--np", "2", "--variants", "summa"], {"MLSCALE_GRID": "2x2"}, "MLSCALE_GRID=2x2 does not fit 2 ranks"),
    (["--np", "1"], {"MLSCALE_GEMM_PANEL": "0"}, "MLSCALE_GEMM_PANEL='0': expected an integer >= 1"),
])
def test_impossible_settings_are_one_line_errors(tmp_path, args, environment, message):
    status, _, err = mlscale("sweep", SUITES["gemm"], "--sizes", "8", "--csv", str(tmp_path / "x.csv"), *args,
                             **environment)
    assert status == 2 and message in err
    assert len(err.strip().splitlines()) == 1


def test_rank_checks_and_settings(monkeypatch):
    gemm = Gemm()
    gemm.check_ranks(4, "cannon")
    gemm.check_ranks(8, "25d")
    for ranks, variant in [(2, "cannon"), (3, "25d"), (4, "25d"), (2, "numpy")]:
        with pytest.raises(InputError):
            gemm.check_ranks(ranks, variant)
    monkeypatch.setenv("MLSCALE_GEMM_REPLICAS", "4")
    Gemm().check_ranks(4, "25d")
    monkeypatch.setenv("MLSCALE_GRID", "2by2")
    with pytest.raises(InputError, match="MLSCALE_GRID"):
        Gemv()


def test_weak_scaling_keeps_the_work_per_rank():
    assert Blas1Model().problem_size(1000, 3, "weak") == 3000
    assert GemvModel().problem_size(100, 4, "weak") == 200
    assert GemvModel().problem_size(100, 2, "weak") == 141
    assert GemmModel().problem_size(100, 8, "weak") == 200
    assert GemmModel().problem_size(100, 2, "weak") == 126
    assert GemmModel().problem_size(100, 8, "strong") == 100


def _ran_once(case, variant, n, corrupt=None):
    """Set up ``variant`` on one process, corrupt its inputs, run it once; return the wrong count."""
    state = case.setup(MPI.COMM_SELF, n, variant, get_backend("numpy"), "float64")
    if corrupt:
        corrupt(state.data)
    case.run(state)
    return case.check(state)


def test_checks_count_nan_and_wrong_entries():
    n = 9
    nonzero_b_row = np.count_nonzero(seeded_rows("B", [0], n))
    for variant in ("numpy", "summa", "summa_lookahead", "summa_shared", "cannon_overlap"):
        assert _ran_once(Gemm(), variant, n) == 0
        assert _ran_once(Gemm(), variant, n, lambda d: d["A"].local.__setitem__((0, 0), np.nan)) == n
        assert _ran_once(Gemm(), variant, n, lambda d: d["A"].local.__setitem__((0, 0), 2.0)) == nonzero_b_row
    assert _ran_once(Gemv(), "rows", n, lambda d: d["x"].__setitem__(4, np.nan)) == n
    for variant in ("dot", "nrm2", "numpy_dot", "axpy"):
        assert _ran_once(Blas1(), variant, 1001) == 0
        assert _ran_once(Blas1(), variant, 1001, lambda d: d["x"].__setitem__(5, np.nan)) == 1


def test_cost_models():
    calib = calibration(alpha=1e-6, beta=1e-9, gamma=1e-10, overhead=1e-7, copy=1e-10, rate=1e10)
    gemm = GemmModel()
    assert gemm.predict("cannon", 64, 3, calib) is None and gemm.predict("numpy", 64, 2, calib) is None
    compute_only = calibration(alpha=0, beta=0, overhead=0, rate=1e10)
    assert gemm.predict("summa", 400, 4, compute_only) == pytest.approx(8 * gemm.predict("summa", 200, 4,
                                                                                        compute_only))
    assert gemm.predict("summa", 1000, 4, calib) > gemm.predict("summa", 1000, 4, compute_only)
    assert gemm.predict("numpy", 64, 1, calib) > 0 and Blas1Model().predict("numpy_dot", 64, 1, calib) > 0
    for plain, overlapped in (("summa", "summa_lookahead"), ("cannon", "cannon_overlap")):
        assert gemm.cost(overlapped, 1000, 4).words == gemm.cost(plain, 1000, 4).words
        assert gemm.memory_bytes(1000, 4, overlapped, "float64") > gemm.memory_bytes(1000, 4, plain, "float64")
    assert gemm.cost("summa_shared", 1000, 4).words == gemm.cost("summa_shared", 1000, 4).messages == 0
    # 2 x 2 grid: k = 1000 cut at the block boundary 500, two panels of 250 per half; 2 one-step Ibcasts each.
    assert gemm.cost("summa_lookahead", 1000, 4).messages == 4 * 2
    latency_only = calibration(alpha=1.0, beta=0, gamma=0, overhead=0.5, copy=0, rate=1e30)
    # the run's call, then MPI's: one Allgatherv call of 3 ring steps (rows); on the 2 x 2 grid an Allgatherv and a
    # Reduce_scatter of one step each
    assert GemvModel().predict("rows", 1000, 4, latency_only) == pytest.approx(0.5 + 0.5 + 3 * 1.0)
    assert GemvModel().predict("2d", 1000, 4, latency_only) == pytest.approx(0.5 + 2 * (0.5 + 1.0))
    blas1 = Blas1Model()
    assert blas1.predict("axpy", 1000, 4, latency_only) == 0.0  # no message; calls and passes free
    assert blas1.predict("dot", 1000, 4, latency_only) == pytest.approx(collective_terms.allreduce(latency_only, 16, 4))
    assert blas1.predict("nrm2", 1000, 4, latency_only) == pytest.approx(
        collective_terms.allreduce(latency_only, 24, 4) + collective_terms.allreduce(latency_only, 8, 4))
    calls_only = dict(latency_only, reduce=[[1, 1.0], [1 << 24, 1.0]])  # every call and reduction 1 s
    assert [blas1.predict(variant, 1000, 1, calls_only) for variant in ("numpy_axpy", "axpy")] == [
        CALLS["numpy_axpy"] + 1, CALLS["axpy"] + 1]  # and axpy's one in-place addition


# --- the cupy backend (the simulated GPU always; CuPy when a GPU is visible) ---

DEVICE_SIZES = {"blas1": 1001, "gemv": 13, "gemm": 13}


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("suite", sorted(CASES))
def test_every_device_variant_runs_and_checks_on_device_blocks(comm, device_backend, suite, dtype):
    case = CASES[suite]()
    ran, expected = [], {v for v in case.variants if v not in case.host_only_variants and fits(case, comm.size, v)}
    for variant in case.variants:
        if not fits(case, comm.size, variant) or case.unavailable(comm, variant, device_backend):
            continue
        state = case.setup(comm, DEVICE_SIZES[suite], variant, device_backend, dtype)
        for _ in range(2):   # axpy alternates its alpha: the check follows
            case.run(state)
        result = state.result.local if hasattr(state.result, "local") else state.result
        inputs = [value.local if hasattr(value, "local") else value for key, value in state.data.items()
                  if key in ("A", "B", "x", "y")]
        wrong = case.check(state)
        metrics = case.metrics(state, 1.0)
        case.teardown(state)
        ok = wrong == 0 and all(device_backend.is_device_array(a) for a in [result, *inputs]) and metrics.gflops > 0
        assert comm.allreduce(int(not ok)) == 0, variant
        ran.append(variant)
    assert set(ran) == expected and ("cupy" in ran) == (suite == "gemm" and comm.size == 1)


def fits(case, ranks, variant):
    """Whether ``variant`` runs on ``ranks`` ranks (grids, one-process library variants)."""
    try:
        case.check_ranks(ranks, variant)
    except InputError:
        return False
    return True


def test_library_variants_stay_on_their_backend(device_backend):
    for case, variant, backend in [(Gemm(), "numpy", device_backend), (Gemv(), "numpy", device_backend),
                                   (Blas1(), "numpy_dot", device_backend), (Gemm(), "cupy", get_backend("numpy"))]:
        reason = case.unavailable(MPI.COMM_SELF, variant, backend)
        assert reason
        with pytest.raises(InputError, match=re.escape(reason)):
            case.setup(MPI.COMM_SELF, 8, variant, backend, "float64")


@pytest.mark.parametrize("tf32", ["0", "1"])
def test_gemm_cupy_records_tf32_and_loosens_the_float32_check(device_backend, monkeypatch, tf32):
    monkeypatch.setenv("CUPY_TF32", tf32)
    gemm = Gemm()
    state = gemm.setup(MPI.COMM_SELF, 9, "cupy", device_backend, "float32")
    gemm.run(state)
    assert device_backend.is_device_array(state.result) and gemm.check(state) == 0
    assert state.params["tf32"] is (tf32 == "1") and state.params["layout"] == "1 process"
    assert gemm.check_eps(state) == (TF32_EPS if tf32 == "1" else None)
    host = gemm.setup(MPI.COMM_SELF, 9, "summa", get_backend("numpy"), "float32")
    assert host.params["tf32"] is False and gemm.check_eps(host) is None
    gemm.teardown(host)
