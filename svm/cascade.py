"""Cascade SVM (Graf, Cosatto, Bottou, Durdanovic & Vapnik, NIPS 2005) on any number of ranks.

One pass: every rank trains a serial SMO (`svm.smo.smo_solve`) on its
`block_range` block of the training set plus the support vectors fed back by the
previous pass; the support vectors then move up a binary tree: at level ``l``
(``s = 2^l``) rank ``r`` with ``r % 2s == s`` sends its set to ``r - s``, which
trains on the union of both sets. Rank counts need not be powers of two (a rank
without partner just carries its set up a level). After ``ceil(log2 p)`` levels
rank 0 holds the pass's model; it broadcasts its support vectors, which start
the next pass on every rank. Passes stop when the root's support-vector set is
the one of the previous pass, or its dual objective changed by at most
``objective_rtol`` (relative); the last broadcast is the final model.

Sets travel as rows ``(global index, label -1/+1, alpha, features...)`` of
``d + 3`` float64 values, so a rank trains only on samples it owns or received.
Every solve is warm-started: a leaf from the fed-back alphas (zeros on its own
other samples), a merge from the sum of both children's alphas for each
distinct sample, halved when a sum exceeds C (duplicates arise because every
leaf gets the fed-back set); both starts satisfy ``y^T alpha = 0``.

Communication per pass, with ``k`` support vectors in a set: one message of
``8 k (d + 3)`` bytes per tree edge (``ceil(log2 p)`` levels), then a broadcast
of a 4-double header and ``8 k (d + 3)`` bytes from rank 0.
"""
import warnings
from numbers import Real

import numpy as np

from kernels.distribution import block_range
from kernels.errors import InputError
from svm.parallel_common import ParallelSVC
from svm.smo import DEFAULT_CACHE_BYTES, ConvergenceWarning, smo_solve

INDEX, LABEL, ALPHA, FEATURES = 0, 1, 2, 3  # columns of a packed sample set


def pack(indices, labels, alpha, X):
    """Rows ``(index, label, alpha, x...)`` of a sample set (shape (k, d + 3))."""
    return np.column_stack((indices, labels, alpha, X)).astype(np.float64, copy=False)


def union(first, second):
    """Distinct samples of two packed sets (sorted by index) and the sum of their alphas per sample."""
    rows = np.vstack((first, second))
    _, where, inverse = np.unique(rows[:, INDEX], return_index=True, return_inverse=True)
    alpha = np.zeros(len(where))
    np.add.at(alpha, inverse.reshape(-1), rows[:, ALPHA])
    return rows[where], alpha


class CascadeSVM(ParallelSVC):
    """Binary C-SVC trained by the Cascade SVM; converges to the serial optimum with feedback passes.

    Parameters
    ----------
    C, kernel, gamma, degree, coef0, tol, comm
        As `svm.parallel_common.ParallelSVC`; ``tol`` is every SMO solve's.
    max_passes : int
        Cap on feedback passes (a warning when reached before convergence).
    objective_rtol : float
        Stop when the root's dual objective changes by at most this, relative.
    cache_bytes : int
        Kernel-row cache of each SMO solve.

    Attributes
    ----------
    As `ParallelSVC`; ``n_iter_`` is the number of passes, ``dual_objective_`` the
    root's in the last pass (over its training set), ``converged_`` whether the
    passes stopped before ``max_passes``; ``smo_iter_`` counts this rank's SMO
    iterations over all its solves.
    """

    _PARAMS = ParallelSVC._PARAMS + ("max_passes", "objective_rtol", "cache_bytes")

    def __init__(self, C=1.0, kernel="rbf", gamma="scale", degree=3, coef0=0.0, tol=1e-3, comm=None,
                 max_passes=10, objective_rtol=1e-6, cache_bytes=DEFAULT_CACHE_BYTES):
        super().__init__(C, kernel, gamma, degree, coef0, tol, comm)
        self.max_passes, self.objective_rtol, self.cache_bytes = max_passes, objective_rtol, cache_bytes

    def _solve(self, rows, alpha0):
        """Train on a packed set warm-started at ``alpha0``; return its support vectors, bias, objective.

        A set with one class only has no SVM to train: it is returned whole, so
        that its samples meet the other class higher up the tree.
        """
        labels = rows[:, LABEL]
        if len(np.unique(labels)) < 2:
            rows = rows.copy()
            rows[:, ALPHA] = 0.0
            return rows, 0.0, 0.0
        if alpha0.max() > self.C:
            alpha0 = alpha0 / 2
        result = smo_solve(rows[:, FEATURES:], labels, self.kernel_, self.C, self.tol, alpha0,
                           self.cache_bytes)
        self.smo_iter_ += result.n_iter
        support = result.alpha > 0
        kept = rows[support].copy()
        kept[:, ALPHA] = result.alpha[support]
        return kept, result.bias, result.objective

    def _pass(self, comm, own, fed_back):
        """One cascade pass; return the root's ``(support set, bias, objective)`` (rank 0 only, else None)."""
        rows, alpha0 = union(own, fed_back)
        model = self._solve(rows, alpha0)
        step = 1
        while step < comm.size:
            if comm.rank % (2 * step) == step:
                comm.send_rows(model[0], comm.rank - step)
                return None
            if comm.rank + step < comm.size:
                received = comm.recv_rows(comm.rank + step, own.shape[1])
                model = self._solve(*union(model[0], received))
            step *= 2
        return model

    @staticmethod
    def _broadcast(comm, model, converged, width):
        """Broadcast rank 0's model; return ``(support set, bias, objective, converged)`` on every rank."""
        header = np.zeros(4)
        if comm.rank == 0:
            header[:] = len(model[0]), converged, model[1], model[2]
        comm.Bcast(header)
        rows = model[0] if comm.rank == 0 else np.empty((int(header[0]), width))
        comm.Bcast(rows)
        return rows, header[2], header[3], bool(header[1])

    def fit(self, X, y):
        """Train on the full set ``X``, ``y`` (the same on every rank); return self."""
        if isinstance(self.max_passes, bool) or not isinstance(self.max_passes, (int, np.integer)) \
                or self.max_passes < 1:
            raise InputError(f"max_passes must be a positive integer, got {self.max_passes!r}")
        if not isinstance(self.objective_rtol, Real) or not self.objective_rtol >= 0:
            raise InputError(f"objective_rtol must be >= 0, got {self.objective_rtol!r}")
        comm, X, signs = self._begin_fit(X, y)
        start, stop = block_range(len(X), comm.size, comm.rank)
        own = pack(np.arange(start, stop), signs[start:stop], np.zeros(stop - start), X[start:stop])
        self.smo_iter_ = 0
        fed_back, previous, converged = own[:0], None, False
        for passes in range(1, self.max_passes + 1):
            root = self._pass(comm, own, fed_back)
            if root is not None and previous is not None:
                same_set = np.array_equal(root[0][:, INDEX], previous[0][:, INDEX])
                converged = same_set or abs(root[2] - previous[2]) <= self.objective_rtol * abs(root[2])
            fed_back, bias, objective, converged = self._broadcast(comm, root, converged, own.shape[1])
            previous = (fed_back, bias, objective)
            if converged:
                break
        if not converged:
            warnings.warn(f"Cascade SVM stopped at max_passes={self.max_passes} before its support vectors "
                          "settled", ConvergenceWarning, stacklevel=2)
        self.converged_ = converged
        coef = fed_back[:, LABEL] * fed_back[:, ALPHA]
        return self._end_fit(comm, fed_back[:, INDEX].astype(np.int64), fed_back[:, FEATURES:], coef, bias,
                             objective, passes)
