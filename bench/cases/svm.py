"""Suite ``svm``: training a binary RBF C-SVM (C = 1, gamma = "scale", tol = 1e-3) serially and in parallel.

Variants: ``sklearn`` (``sklearn.svm.SVC``, the reference), ``smo`` (`svm.solver.svc.SVC`,
this project's serial SMO), ``dis_smo`` (`svm.distributed.dis_smo.DisSMO`), ``cascade``
(`svm.distributed.cascade.CascadeSVM`), ``dcsvm`` (`svm.distributed.dcsvm.DCSVM`), ``cpsvm`` and ``casvm``
(`svm.distributed.casvm.CPSVM`, `svm.distributed.casvm.CASVM`; imported when a point needs them). The
serial variants train on rank 0 only while the other ranks wait in a sleeping
barrier, so their rows on p ranks time one core's work (and leave the rest idle).

Data: setting ``SVM_DATA`` (`DATA`), a name of `svm.datasets.NAMES`
or the path of an svmlight / LIBSVM file (default ``mnist``: the MNIST sample, odd
vs even digits, 4,000 training and 1,000 test images; use ``synthetic`` or the
non-linear ``moons`` for sizes beyond a real set's training part). Size is the
number of training samples (the first of the shuffled training part; weak scaling: samples per rank). Every rank
loads the whole set, as the estimators expect; one run is one ``fit``.

Check (rank 0 counts, once per point): 1 wrong when the test accuracy falls
below the sklearn reference's (same data, same settings) by more than the
variant's tolerance (`TOLERANCE`: 0.5% for the exact solvers, 1% for the cascade,
whose passes stop on a tolerance, 5% for the approximate DC-SVM, CP-SVM and
CA-SVM); for ``dis_smo``, plus one per test sample predicted otherwise than by
the serial SMO without shrinking (same iterates), where that model's decision
value exceeds ``tol`` in magnitude. The references are computed on rank 0 and
cached per data set and size.

Metrics: items_per_s = training samples / s; metric ``accuracy`` (test set);
params: dataset, n_features, n_test, n_sv, n_iter (SMO iterations; cascade: passes),
bytes_sent (max over ranks, convention of `svm.distributed.common`), predict_s,
reference_accuracy, accuracy_gap (the serial reference's test accuracy minus
this variant's, in percentage points: positive = worse than serial), tolerance,
mismatches and kernel_rows (dis_smo: the kernel rows each rank computed, its cache's misses, which
the cost model counts).

Backends: numpy and cupy. On a device the training and test sets are loaded on
the host (same seeds) and moved once in setup; every variant but ``sklearn``
(host only: scikit-learn has no device version) trains, predicts and scores
on the device with ``backend.comm(comm)``; the check reads the predictions
back for the comparison with the host references.
"""
import importlib
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from mpi4py import MPI

from bench.case import Case, Metrics
from bench.faults import sleeping_barrier
from bench.models.svm import DATA, ESTIMATORS, SVMModel
from kernels.backend import get_backend
from kernels.errors import InputError
from svm.datasets import load_dataset
from svm.solver.gram import kernel_product, make_kernel
from svm.solver.smo import smo_solve

SETTINGS = dict(C=1.0, kernel="rbf", gamma="scale", tol=1e-3)
SERIAL = ("sklearn", "smo")
#: Largest accuracy drop below the sklearn reference that still passes the check.
TOLERANCE = {"sklearn": 0.0, "smo": 0.005, "dis_smo": 0.005, "cascade": 0.01, "dcsvm": 0.05, "cpsvm": 0.05,
             "casvm": 0.05}
_references = {}  # (data, n, kind) -> reference values, on rank 0


def make_estimator(variant, comm):
    """A new estimator of ``variant`` with `SETTINGS` (parallel ones on ``comm``)."""
    module_name, _, class_name = ESTIMATORS[variant].partition(":")
    try:
        estimator = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise InputError(f"variant {variant} needs {ESTIMATORS[variant]}, which is not available: {error}") from None
    return estimator(**SETTINGS) if variant in SERIAL else estimator(comm=comm, **SETTINGS)


@dataclass
class _State:
    """One point: the model and the sets it trains and predicts on (device arrays on a device backend)."""

    comm: object
    variant: str
    data: str
    model: object
    X_train: np.ndarray
    X_test: np.ndarray
    y_train: np.ndarray
    y_test: np.ndarray
    evaluation: Optional[dict] = None
    backend: object = field(default_factory=get_backend)
    host: tuple = ()  #: (X_train, X_test, y_train, y_test) on the host, for the references (default: the sets)

    def __post_init__(self):
        self.host = self.host or (self.X_train, self.X_test, self.y_train, self.y_test)


class SVMSuite(Case):
    model_class = SVMModel
    benchmark = "svm_train"
    size_help = "training samples of the data set (SVM_DATA); one run = one fit"
    default_sizes = "500,1000,2000,4000"
    metrics_help = ("items_per_s = training samples/s; metric accuracy (test set); params accuracy_gap (points "
                    "below serial), n_sv, n_iter, bytes_sent, predict_s")
    dtypes = ("float64",)

    description = ("Training a binary RBF C-SVM (C = 1, gamma = scale): scikit-learn's SVC and this project's "
                   "serial SMO on one rank against the distributed solvers Dis-SMO, Cascade, DC-SVM, CP-SVM and "
                   "CA-SVM. One run is one fit; the check compares the test accuracy with scikit-learn's on the "
                   "same data, within each method's tolerance.")

    def __init__(self, settings=None):
        super().__init__(settings)
        self.data = self.settings[DATA.name]

    def iterations(self, size):
        return 3, 1

    def setup(self, comm, size, variant, backend, dtype):
        reason = self.unavailable(comm, variant, backend)
        if reason:
            raise InputError(f"variant {variant} cannot run on backend {backend.name}: {reason}")
        host = load_dataset(self.data, n=size, seed=0)
        model = make_estimator(variant, backend.comm(comm))
        return _State(comm, variant, self.data, model, *(backend.from_host(part) for part in host), backend=backend,
                      host=host)

    def run(self, state):
        state.evaluation = None
        if state.variant not in SERIAL:
            state.model.fit(state.X_train, state.y_train)
            return
        if state.comm.rank == 0:
            state.model.fit(state.X_train, state.y_train)
        sleeping_barrier(state.comm)

    def check(self, state):
        evaluation = _evaluate(state)
        if state.comm.rank != 0:
            return 0
        drop = evaluation["reference_accuracy"] - evaluation["accuracy"]
        return int(drop > TOLERANCE[state.variant] + 1e-12) + evaluation.get("mismatches", 0)

    def metrics(self, state, seconds):
        return Metrics(items_per_s=len(state.X_train) / seconds if seconds > 0 else None, metric="accuracy",
                       metric_value=_evaluate(state)["accuracy"])

    def params(self, state):
        return dict(_evaluate(state), dataset=state.data, n_features=int(state.X_train.shape[1]),
                    n_test=len(state.X_test), tolerance=TOLERANCE[state.variant])

def _evaluate(state):
    """Accuracy, model figures and references of the last fit, computed once (collective on ``state.comm``)."""
    if state.evaluation is not None:
        return state.evaluation
    comm, model, serial = state.comm, state.model, state.variant in SERIAL
    figures = None
    if comm.rank == 0 or not serial:
        start = MPI.Wtime()
        predictions = model.predict(state.X_test)
        predict_s = MPI.Wtime() - start
        figures = dict(accuracy=float((predictions == state.y_test).mean()), n_sv=int(len(model.support_)),
                       n_iter=int(np.sum(model.n_iter_)), predict_s=predict_s,
                       bytes_sent=0 if serial else model.bytes_sent_)
        if hasattr(model, "kernel_rows_"):
            figures["kernel_rows"] = int(model.kernel_rows_)
    if serial:
        figures = comm.bcast(figures, root=0)
    else:
        largest = np.array([figures["bytes_sent"], figures["predict_s"]])
        comm.Allreduce(MPI.IN_PLACE, largest, op=MPI.MAX)
        figures["bytes_sent"], figures["predict_s"] = round(largest[0]), float(largest[1])
    references = None
    if comm.rank == 0:
        reference_accuracy = _reference(state, "sklearn")["accuracy"]
        references = dict(reference_accuracy=reference_accuracy,
                          accuracy_gap=round(100 * (reference_accuracy - figures["accuracy"]), 2))
        if state.variant == "dis_smo":
            serial_smo = _reference(state, "smo_no_shrinking")
            decided = np.abs(serial_smo["decision"]) > SETTINGS["tol"]
            wrong = (state.backend.to_host(predictions) != serial_smo["predictions"]) & decided
            references["mismatches"] = int(np.count_nonzero(wrong))
    state.evaluation = dict(figures, **comm.bcast(references, root=0))
    return state.evaluation


def _reference(state, kind):
    """Test predictions, decision values and accuracy of a serial reference fit (rank 0; cached).

    ``kind`` is ``sklearn`` or ``smo_no_shrinking`` (`svm.solver.smo.smo_solve` with +1 for the
    larger label, as the parallel SVMs: the iterates `svm.distributed.dis_smo` reproduces).
    """
    X_train, X_test, y_train, y_test = state.host
    key = (state.data, len(X_train), kind)
    if key not in _references:
        if kind == "sklearn":
            model = make_estimator("sklearn", None).fit(X_train, y_train)
            predictions, decision = model.predict(X_test), model.decision_function(X_test)
        else:
            predictions, decision = _serial_smo(X_train, y_train, X_test)
        _references[key] = dict(predictions=predictions, decision=decision,
                                accuracy=float(np.mean(predictions == y_test)))
    return _references[key]


def _serial_smo(X_train, y_train, X_test):
    """Predictions and decision values on ``X_test`` of ``smo_solve(..., shrinking=False)``."""
    classes = np.unique(y_train)
    signs = np.where(y_train == classes[-1], 1.0, -1.0)
    kernel = make_kernel(SETTINGS["kernel"], X_train, SETTINGS["gamma"])
    result = smo_solve(X_train, signs, kernel, SETTINGS["C"], SETTINGS["tol"], shrinking=False)
    support = np.flatnonzero(result.alpha)
    decision = kernel_product(kernel, X_test, X_train[support], (result.alpha * signs)[support]) + result.bias
    return classes[(decision > 0).astype(np.int64)], decision
