"""Shared pieces of the parallel SVMs: row and block exchanges and a binary estimator base.

Bytes sent (``bytes_sent_`` of every parallel SVM) are counted by the
`kernels.comm.counting.CountingComm` that `ParallelSVC` wraps around ``comm``
(convention of `kernels.comm.traffic`); the exchanges below take it or any
communicator.

The estimators compute in the array module of the training samples
(`kernels.backend.array_module`): pass device (CuPy) arrays, and a ``comm`` from
`kernels.backend.Backend.comm` that hands device buffers to MPI, and the model
stays on the device.
"""
import numpy as np
from mpi4py import MPI

from kernels.backend import array_module
from kernels.comm.counting import CountingComm
from kernels.errors import InputError
from svm.solver.gram import kernel_product, make_kernel
from svm.solver.checks import check_samples, check_solver_options


def resolve_comm(comm):
    """Return ``comm``, or ``MPI.COMM_WORLD`` when it is None (the estimators' ``comm=None``)."""
    return MPI.COMM_WORLD if comm is None else comm


def allgather_blocks(comm, local, result, counts):
    """Gather the 1D ``local`` blocks of ``counts[r]`` items of every rank ``r`` into ``result`` (rank order).

    One ``Allgatherv``: ``(p - 1) alpha + (p - 1) / p n beta`` for the ``n``
    bytes of ``result``.
    """
    displs = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
    comm.Allgatherv(local, [result, ([int(c) for c in counts], displs)])


def send_rows(comm, rows, dest, tag=0):
    """Send a 2D array as one float64 message to ``dest`` (its row count travels implicitly)."""
    comm.Send(array_module(rows).ascontiguousarray(rows, dtype=np.float64), dest, tag)


def recv_rows(comm, source, width, tag=0, xp=np):
    """Receive a message of `send_rows` with rows of ``width`` values; return it as ``(k, width)`` in ``xp``."""
    status = MPI.Status()
    comm.Probe(source=source, tag=tag, status=status)
    rows = xp.empty((status.Get_count(MPI.DOUBLE) // width, width))
    comm.Recv(rows, source, tag)
    return rows


def binary_labels(y, n):
    """Return ``(classes, signs)``: the two sorted labels and ``+1`` for ``classes[1]``, ``-1`` for ``classes[0]``.

    Raises `InputError` unless ``y`` holds ``n`` labels of exactly two classes.
    Both results are in the array module of ``y``.
    """
    xp = array_module(y)
    y = xp.asarray(y)
    if y.shape != (n,):
        raise InputError(f"y must hold one label per sample ({n}), got shape {y.shape}")
    classes, codes = xp.unique(y, return_inverse=True)
    if len(classes) != 2:
        raise InputError(f"the parallel SVMs are binary: need exactly 2 classes, got {len(classes)}")
    return classes, xp.where(codes.reshape(-1) == 1, 1.0, -1.0)


class ParallelSVC:
    """Base of the parallel binary C-SVMs: parameters, fit checks, and prediction from support vectors.

    Subclasses implement ``fit(X, y)`` with `_begin_fit` and `_end_fit`; every rank
    passes the same full training set and ends with the same model, so
    `decision_function`, `predict` and `score` need no communication and agree on
    every rank. ``+1`` internally is ``classes_[1]`` (positive decision values), as
    scikit-learn.

    Attributes (after fit)
    ----------------------
    classes_ : ndarray of shape (2,)
    kernel_ : svm.solver.gram.Kernel
    support_ : ndarray of shape (n_SV,)
        Indices of the support vectors in the training set.
    support_vectors_ : ndarray of shape (n_SV, d)
    dual_coef_ : ndarray of shape (1, n_SV)
        ``y_i alpha_i``.
    intercept_ : ndarray of shape (1,)
    dual_objective_ : float
        ``1/2 a^T Q a - e^T a`` of the final model's training problem.
    n_iter_ : int
    bytes_sent_ : float
        Bytes this rank sent during fit (module convention).
    """

    _PARAMS = ("C", "kernel", "gamma", "degree", "coef0", "tol", "comm")

    def __init__(self, C=1.0, kernel="rbf", gamma="scale", degree=3, coef0=0.0, tol=1e-3, comm=None):
        self.C, self.kernel, self.gamma, self.degree, self.coef0, self.tol = C, kernel, gamma, degree, coef0, tol
        self.comm = comm

    def get_params(self, deep=True):
        """Constructor parameters by name (as scikit-learn's ``get_params``)."""
        return {name: getattr(self, name) for name in self._PARAMS}

    def set_params(self, **params):
        """Set constructor parameters by name; return self."""
        for name, value in params.items():
            if name not in self._PARAMS:
                raise InputError(f"{type(self).__name__} has no parameter {name!r}")
            setattr(self, name, value)
        return self

    def _begin_fit(self, X, y, max_iter=None):
        """Check the inputs and options; set ``classes_`` and ``kernel_``.

        Returns
        -------
        comm : kernels.comm.counting.CountingComm
            ``self.comm`` (or COMM_WORLD) with a fresh byte count.
        X : ndarray of shape (n, d), float64
        signs : ndarray of shape (n,)
            Labels mapped to -1 / +1 (in the array module of ``X``).
        """
        X = check_samples(X)
        self.classes_, signs = binary_labels(array_module(X).asarray(y), len(X))
        check_solver_options(self.C, self.tol, max_iter)
        self.kernel_ = make_kernel(self.kernel, X, self.gamma, self.coef0, self.degree)
        return CountingComm(resolve_comm(self.comm)), X, signs

    def _end_fit(self, comm, support, support_vectors, coef, bias, objective, n_iter):
        """Set the learned attributes of the final model (the same on every rank, in the array module
        of ``support_vectors``)."""
        xp = array_module(support_vectors)
        self.support_ = xp.asarray(support, dtype=np.int64)
        self.support_vectors_ = xp.ascontiguousarray(support_vectors, dtype=np.float64)
        self.dual_coef_ = xp.asarray(coef, dtype=np.float64).reshape(1, -1)
        self.intercept_ = xp.asarray(np.array([float(bias)]))
        self.dual_objective_ = float(objective)
        self.n_iter_ = int(n_iter)
        self.bytes_sent_ = comm.bytes_sent
        return self

    def decision_function(self, X):
        """``sum_i y_i alpha_i K(x_i, x) + b`` for each row of ``X`` (shape (n,)); positive for ``classes_[1]``."""
        if not hasattr(self, "support_vectors_"):
            raise InputError(f"this {type(self).__name__} is not fitted yet; call fit first")
        X = check_samples(X)
        if X.shape[1] != self.support_vectors_.shape[1]:
            raise InputError(f"X has {X.shape[1]} features, the model was fitted with "
                             f"{self.support_vectors_.shape[1]}")
        return kernel_product(self.kernel_, X, self.support_vectors_, self.dual_coef_[0]) + self.intercept_[0]

    def predict(self, X):
        """Class of each row of ``X``: ``classes_[1]`` where the decision value is positive."""
        positive = self.decision_function(X) > 0
        return self.classes_[positive.astype(np.int64)]

    def score(self, X, y):
        """Mean accuracy of `predict` on ``X`` against ``y``."""
        predictions = self.predict(X)
        return float((predictions == array_module(predictions).asarray(y)).mean())
