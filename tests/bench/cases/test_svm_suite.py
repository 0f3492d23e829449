"""The ``svm`` suite (bench/cases/svm.py) end to end through the command line, and its check."""
import json

import numpy as np
import pytest
from mpi4py import MPI

from bench.cases import svm as suite
from kernels.errors import InputError
from svm.datasets import load_dataset
from tests.clitools import mlscale, rows_of

pytest.importorskip("sklearn")

SUITE = "bench.cases.svm:SVMSuite"


def test_sweep_of_serial_and_parallel_variants_is_valid(tmp_path):
    path = str(tmp_path / "svm.csv")
    status, out, err = mlscale("sweep", SUITE, "--np", "2", "--ranks", "1,2", "--sizes", "150", "--iters", "1",
                               "--warmup", "0", "--variants", "sklearn,smo,dis_smo,cascade", "--csv", path,
                               MLSCALE_SVM_DATA="breast_cancer")
    assert status == 0, err
    rows = rows_of(path)
    assert sorted((row["variant"], row["ranks"]) for row in rows) == [
        (variant, ranks) for variant in ("cascade", "dis_smo", "sklearn", "smo") for ranks in ("1", "2")]
    assert {row["wrong"] for row in rows} == {"0"} and {row["suite"] for row in rows} == {"svm"}
    assert "accuracy=" in out
    for row in rows:
        params = json.loads(row["params"])
        assert row["metric"] == "accuracy" and float(row["metric_value"]) == pytest.approx(params["accuracy"], rel=1e-5)
        assert params["accuracy"] >= params["reference_accuracy"] - params["tolerance"]
        assert params["accuracy_gap"] == pytest.approx(100 * (params["reference_accuracy"] - params["accuracy"]),
                                                       abs=0.006)
        assert (params["dataset"], params["n_features"], params["n_test"]) == ("breast_cancer", 30, 114)
        assert params["n_sv"] > 0 and params["n_iter"] > 0 and float(row["items_per_s"]) > 0
        parallel_on_two = row["variant"] in ("dis_smo", "cascade") and row["ranks"] == "2"
        assert (params["bytes_sent"] > 0) == parallel_on_two
        assert params.get("mismatches", 0) == 0


@pytest.mark.parametrize("args, environment, message", [
    (["--sizes", "100"], {"MLSCALE_SVM_DATA": "nosuch"}, "MLSCALE_SVM_DATA must be one of"),
    (["--sizes", "456"], {"MLSCALE_SVM_DATA": "breast_cancer"}, "has 455 training samples"),
])
def test_impossible_settings_are_input_errors(tmp_path, args, environment, message):
    status, _, err = mlscale("run", SUITE, "--variants", "smo", "--csv", str(tmp_path / "x.csv"),
                             *args, **environment)
    assert status == 2 and message in err


class _ConstantModel:
    """A 'fitted model' predicting class 0 everywhere."""

    support_, n_iter_, bytes_sent_ = np.arange(3), 1, 0

    def predict(self, X):
        return np.zeros(len(X), dtype=np.int64)


@pytest.mark.parametrize("variant", ["cascade", "dis_smo"])
def test_check_counts_a_poor_model_as_wrong(variant):
    parts = load_dataset("breast_cancer", n=120)
    state = suite._State(MPI.COMM_SELF, variant, "breast_cancer", _ConstantModel(), *parts)
    evaluation = suite._evaluate(state)
    assert evaluation["accuracy"] == pytest.approx(np.mean(parts[3] == 0))
    assert evaluation["reference_accuracy"] > evaluation["accuracy"] + 0.2
    wrong = suite.SVMSuite().check(state)
    if variant == "cascade":
        assert wrong == 1
    else:  # plus every test sample the serial SMO puts in class 1 with a clear margin
        assert wrong == 1 + evaluation["mismatches"] and evaluation["mismatches"] > 50


def test_accuracy_gap_is_in_points_below_the_serial_reference():
    parts = load_dataset("moons", n=120)
    state = suite._State(MPI.COMM_SELF, "casvm", "moons", _ConstantModel(), *parts)
    evaluation = suite._evaluate(state)
    expected = 100 * (evaluation["reference_accuracy"] - np.mean(parts[3] == 0))
    assert evaluation["accuracy_gap"] == pytest.approx(expected, abs=0.005) and expected > 20


def test_missing_estimator_is_an_input_error(monkeypatch):
    monkeypatch.setitem(suite.ESTIMATORS, "casvm", "svm.no_such_module:CASVM")
    with pytest.raises(InputError, match="variant casvm needs svm.no_such_module:CASVM"):
        suite.make_estimator("casvm", MPI.COMM_SELF)


DEVICE_VARIANTS = [variant for variant in suite.ESTIMATORS if variant not in suite.SVMSuite.host_only_variants]


@pytest.mark.mpi
@pytest.mark.parametrize("variant", DEVICE_VARIANTS)
def test_every_device_variant_trains_and_passes_its_check_on_the_device(comm, device_backend, variant):
    case = suite.SVMSuite({suite.DATA.name: "breast_cancer"})
    host_case = suite.SVMSuite({suite.DATA.name: "breast_cancer"})
    state = case.setup(comm, 201, variant, device_backend, "float64")
    case.run(state)
    wrong = case.check(state)
    params = case.params(state)
    host_state = host_case.setup(comm, 201, variant, suite.get_backend("numpy"), "float64")
    host_case.run(host_state)
    host_params = host_case.params(host_state)
    trained = comm.rank == 0 or variant not in suite.SERIAL
    on_device = not trained or all(device_backend.is_device_array(array) for array in (
        state.X_train, state.model.support_vectors_, state.model.dual_coef_, state.model.predict(state.X_test)))
    same = all(params[key] == host_params[key] for key in ("accuracy", "n_sv", "n_iter", "mismatches")
               if key in params) and params.keys() == host_params.keys()
    verdicts = comm.allgather((wrong, on_device, same))
    assert verdicts == [(0, True, True)] * comm.size


def test_sklearn_is_host_only_and_refused_on_a_device(device_backend):
    case = suite.SVMSuite({suite.DATA.name: "breast_cancer"})
    assert case.unavailable(MPI.COMM_SELF, "sklearn", device_backend) == "scikit-learn's SVC runs on the host only"
    assert case.unavailable(MPI.COMM_SELF, "smo", device_backend) is None
    with pytest.raises(InputError, match="variant sklearn cannot run on backend cupy"):
        case.setup(MPI.COMM_SELF, 100, "sklearn", device_backend, "float64")
