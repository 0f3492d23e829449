"""Cascade SVM (Graf, Cosatto, Bottou, Durdanovic & Vapnik, NIPS 2005) on any number of ranks.

One pass: every rank trains a serial SMO (`svm.solver.smo.smo_solve`) on its
`block_range` block of the training set plus the support vectors fed back by the
previous pass; the support vectors then move up a binary tree: at level ``l``
(``s = 2^l``) rank ``r`` with ``r % 2s == s`` sends its set to ``r - s``, which
trains on the union of both sets. Rank counts need not be powers of two (a rank
without partner just carries its set up a level). After ``ceil(log2 p)`` levels
rank 0 holds the pass's model; it broadcasts its support vectors, which start
the next pass on every rank. The support vectors have settled when the root's
set is the one of the previous pass, or its dual objective changed by at most
``objective_rtol`` (relative). Then every rank checks the KKT conditions of the
broadcast model on its own block (the solves only ever saw subsets: two
non-support vectors in different leaves may form a violating pair no solve
sees): passes stop when no sample outside the root's set violates them (the
KKT gap over all samples is then the root solve's, below ``tol``); otherwise
the violating samples join the fed-back set. The bias is LIBSVM's over all
samples (from the same check), not the root's over its subset.

Sets travel as rows ``(global index, label -1/+1, alpha, features...)`` of
``d + 3`` float64 values, so a rank trains only on samples it owns or received.
Every solve is warm-started: a leaf from the fed-back alphas (zeros on its own
other samples), a merge from the sum of both children's alphas for each
distinct sample, halved when a sum exceeds C (duplicates arise because every
leaf gets the fed-back set); both starts satisfy ``y^T alpha = 0``.

Communication per pass, with ``k`` support vectors in a set: one message of
``8 k (d + 3)`` bytes per tree edge (``ceil(log2 p)`` levels), then a broadcast
of a 3-double header and ``8 k (d + 3)`` bytes from rank 0. Each check: an
Allgatherv of 4 doubles and one of 1 int64 per rank, one of the violators' rows,
and ``n k / p`` kernel values per rank.

On a device (CuPy samples, a `kernels.backend.Backend.comm`) the packed sets,
solves and checks stay in device memory; headers and counts are host values.
"""
import warnings
from numbers import Real

import numpy as np

from kernels.backend import array_module
from kernels.distribution import block_range
from kernels.errors import InputError
from svm.solver.gram import kernel_product
from svm.distributed.common import ParallelSVC, allgather_blocks, recv_rows, send_rows
from svm.solver.smo import DEFAULT_CACHE_BYTES, ConvergenceWarning, bias_from_parts, bias_parts, smo_solve, up_low

INDEX, LABEL, ALPHA, FEATURES = 0, 1, 2, 3  # columns of a packed sample set


def pack(indices, labels, alpha, X):
    """Rows ``(index, label, alpha, x...)`` of a sample set (shape (k, d + 3), in the array module of ``X``)."""
    return array_module(X).column_stack((indices, labels, alpha, X)).astype(np.float64, copy=False)


def union(first, second):
    """Distinct samples of two packed sets (sorted by index) and the sum of their alphas per sample.

    Each set holds a sample at most once, so a sum has at most two terms (exact in any order)."""
    xp = array_module(first)
    rows = xp.vstack((first, second))
    _, where, inverse = xp.unique(rows[:, INDEX], return_index=True, return_inverse=True)
    alpha = xp.bincount(inverse.reshape(-1), weights=rows[:, ALPHA], minlength=len(where))
    return rows[where], alpha


class CascadeSVM(ParallelSVC):
    """Binary C-SVC trained by the Cascade SVM; converges to the serial optimum with feedback passes.

    Parameters
    ----------
    C, kernel, gamma, degree, coef0, tol, comm
        As `svm.distributed.common.ParallelSVC`; ``tol`` is every SMO solve's.
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
    passes stopped before ``max_passes`` with no KKT violator outside the root's
    set (``gap_``: the KKT gap ``m - M`` over all samples); ``smo_iter_`` counts this rank's SMO
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
        if len(array_module(rows).unique(labels)) < 2:
            rows = rows.copy()
            rows[:, ALPHA] = 0.0
            return rows, 0.0, 0.0
        if float(alpha0.max()) > self.C:
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
                send_rows(comm, model[0], comm.rank - step)
                return None
            if comm.rank + step < comm.size:
                received = recv_rows(comm, comm.rank + step, own.shape[1], xp=array_module(own))
                model = self._solve(*union(model[0], received))
            step *= 2
        return model

    @staticmethod
    def _broadcast(comm, model, settled, width, xp):
        """Broadcast rank 0's model; return ``(support set, objective, settled)`` on every rank."""
        header = np.zeros(3)
        if comm.rank == 0:
            header[:] = len(model[0]), settled, model[2]
        comm.Bcast(header)
        rows = model[0] if comm.rank == 0 else xp.empty((int(header[0]), width))
        comm.Bcast(rows)
        return rows, header[2], bool(header[1])

    def fit(self, X, y):
        """Train on the full set ``X``, ``y`` (the same on every rank); return self."""
        if isinstance(self.max_passes, bool) or not isinstance(self.max_passes, (int, np.integer)) \
                or self.max_passes < 1:
            raise InputError(f"max_passes must be a positive integer, got {self.max_passes!r}")
        if not isinstance(self.objective_rtol, Real) or not self.objective_rtol >= 0:
            raise InputError(f"objective_rtol must be >= 0, got {self.objective_rtol!r}")
        comm, X, signs = self._begin_fit(X, y)
        xp = array_module(X)
        start, stop = block_range(len(X), comm.size, comm.rank)
        own = pack(xp.arange(start, stop), signs[start:stop], xp.zeros(stop - start), X[start:stop])
        self.smo_iter_ = 0
        fed_back, previous, converged, gap = own[:0], None, False, np.inf
        for passes in range(1, self.max_passes + 1):
            root = self._pass(comm, own, fed_back)
            settled = False
            if root is not None and previous is not None:
                same_set = bool(xp.array_equal(root[0][:, INDEX], previous[0][:, INDEX]))
                settled = same_set or abs(root[2] - previous[1]) <= self.objective_rtol * abs(root[2])
            fed_back, objective, settled = self._broadcast(comm, root, settled, own.shape[1], xp)
            previous = (fed_back, objective)
            if settled or passes == self.max_passes:
                bias, gap, violators = self._global_check(comm, own, start, fed_back)
                violators = self._gather_rows(comm, violators)
                converged = len(violators) == 0  # violating pairs, if any, lie in the root's set: solved to tol
                if converged:
                    break
                fed_back = xp.vstack((fed_back, violators))
        if not converged:
            warnings.warn(f"Cascade SVM stopped at max_passes={self.max_passes} before its support vectors "
                          f"settled (KKT gap over all samples {gap:.3g}, tol {self.tol})", ConvergenceWarning,
                          stacklevel=2)
        self.converged_, self.gap_ = converged, gap
        support = fed_back[:, INDEX].astype(np.int64)
        coef = fed_back[:, LABEL] * fed_back[:, ALPHA]
        return self._end_fit(comm, support, fed_back[:, FEATURES:], coef, bias, objective, passes)

    def _global_check(self, comm, own, start, model):
        """KKT check and bias of ``model`` over *all* training samples; the same on every rank.

        The root's solves see only the support vectors it is sent. Over every
        sample, the bias is LIBSVM's (mean ``F`` over free alphas, else the
        midpoint of ``[M, m]``, which samples with ``alpha = 0`` bound too), and the
        KKT gap ``m - M`` tells whether the model is the optimum: a pair of
        non-support vectors in different leaves can violate the KKT conditions
        while no solve ever sees both.

        Returns ``(bias, gap, violators)``: the packed rows (``alpha = 0``) of this
        rank's samples that form a violating pair with some sample
        (``F > M + tol`` in I_up or ``F < m - tol`` in I_low).

        Each rank evaluates ``F`` on its own block (``n / p`` rows times ``k``
        support vectors); one Allgatherv of 4 doubles per rank.
        """
        alpha = array_module(own).zeros(len(own))
        position = model[:, INDEX].astype(np.int64) - start  # own holds the samples start, start + 1, ...
        held = (position >= 0) & (position < len(own))
        alpha[position[held]] = model[held, ALPHA]
        labels = own[:, LABEL]
        F = labels - kernel_product(self.kernel_, own[:, FEATURES:], model[:, FEATURES:],
                                    model[:, LABEL] * model[:, ALPHA])
        parts = np.empty(4 * comm.size)
        allgather_blocks(comm, bias_parts(F, alpha, labels, self.C), parts, [4] * comm.size)
        parts = parts.reshape(comm.size, 4)
        m, M = parts[:, 2].max(), parts[:, 3].min()
        up, low = up_low(alpha, labels, self.C)
        violating = (alpha == 0) & (up & (F > M + self.tol) | low & (F < m - self.tol))
        return bias_from_parts(parts), float(m - M), own[violating]

    @staticmethod
    def _gather_rows(comm, rows):
        """Allgatherv every rank's packed rows; return them all (rank order), shape ``(total, width)``."""
        width = rows.shape[1]
        counts = np.empty(comm.size, dtype=np.int64)
        allgather_blocks(comm, np.array([rows.size], dtype=np.int64), counts, [1] * comm.size)
        xp = array_module(rows)
        gathered = xp.empty(int(counts.sum()))
        allgather_blocks(comm, xp.ascontiguousarray(rows).ravel(), gathered, counts)
        return gathered.reshape(-1, width)
