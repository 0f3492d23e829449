"""Distributed SMO: the serial solver of `svm.solver.smo` with the samples split in row blocks over ranks.

Every rank holds the whole training set (it is replicated, as every rank passes
the same ``X``), but owns the dual variables ``alpha``, the gradient ``F`` and
the kernel rows of its `block_range` block of samples only. Each iteration is
the serial second-order step (Fan, Chen & Lin 2005) with its two global
searches done by reductions:

1. each rank proposes its best ``i`` (max ``F`` over I_up) and its min ``F``
   over I_low; one Allreduce picks the global ones (stop when the gap ``m - M``
   is below ``tol``);
2. each rank computes ``K(x_i, X_block)`` and proposes its best ``j`` (max
   ``b^2 / a``); one Allreduce picks the global ``j`` with the values the update
   needs (``F_j``, ``alpha_j``, ``K_jj``, ``K_ij``);
3. every rank computes the same clipped Newton step; owners update ``alpha_i``,
   ``alpha_j``, and every rank updates its block of ``F`` with its blocks of
   the kernel rows of ``i`` and ``j`` (computed locally from the replicated
   ``X``: no feature vectors travel).

The reductions are MAXLOC-style on records ``(key, index, payload...)``: the
larger key wins, ties go to the smaller index, which is exactly NumPy's
``argmax`` (first maximum) of the serial solver. Hence the iterates are those of
``smo_solve(..., shrinking=False)``: same pairs, same alphas, same bias up to the
rounding of the final sums. Shrinking is left out (its decisions need global
extremes every few iterations and only save kernel columns).

On a device (CuPy arrays and a `kernels.backend.Backend.comm`), ``alpha``,
``F`` and the kernel rows stay in device memory; each rank reads back one
group of scalars per candidate record (`svm.solver.arrays.fetch`) and the
records, built on the host, travel as host buffers.

Communication per iteration: two Allreduces of 96 and 48 bytes
(``2 (alpha + 144 beta) log2 p``); at the end one Allreduce of 3 doubles and one
Allgatherv of ``alpha`` (``8 n (p - 1) / p`` bytes per rank).
"""
import warnings

import numpy as np
from mpi4py import MPI

from kernels.backend import array_module
from kernels.distribution import block_counts, block_range
from svm.solver.arrays import fetch, to_host
from svm.solver.gram import KernelRowCache
from svm.distributed.common import ParallelSVC, allgather_blocks
from svm.solver.smo import (DEFAULT_CACHE_BYTES, TAU, ConvergenceWarning, SMOResult, up_low, bias_from_parts,
                            check_samples, check_signs, check_solver_options, pair_step)

#: Width of a candidate record: key, global index, then four payload values.
RECORD = 6
_NONE = (-np.inf, np.inf, 0.0, 0.0, 0.0, 0.0)  # a record that loses to every real candidate


def _keep_better(inmem, inoutmem, datatype):
    """MPI user operation: per record, keep the larger key; on equal keys, the smaller index."""
    incoming = np.frombuffer(inmem, dtype=np.float64).reshape(-1, RECORD)
    kept = np.frombuffer(inoutmem, dtype=np.float64).reshape(-1, RECORD)
    better = (incoming[:, 0] > kept[:, 0]) | ((incoming[:, 0] == kept[:, 0]) & (incoming[:, 1] < kept[:, 1]))
    kept[better] = incoming[better]


class _BestCandidates:
    """Allreduce of candidate records with `_keep_better` (one committed record type, one user op)."""

    def __init__(self, comm):
        self.comm = comm
        self.record_type = MPI.DOUBLE.Create_contiguous(RECORD).Commit()
        self.op = MPI.Op.Create(_keep_better, commute=True)

    def __call__(self, records):
        """Return the global best of each row of ``records`` (shape (k, RECORD)), the same on every rank."""
        best = np.empty_like(records)
        self.comm.Allreduce([records, len(records), self.record_type], [best, len(records), self.record_type],
                            op=self.op)
        return best

    def free(self):
        self.op.Free()
        self.record_type.Free()


def _candidate(keys, start, *payload):
    """Record of the first maximum of ``keys`` (global index ``start + k``) with ``payload[...][k]``.

    Host floats (one `fetch` from a device)."""
    if len(keys) == 0:
        return _NONE
    xp = array_module(keys)
    k = xp.argmax(keys)
    k, key, *values = fetch(xp, k, keys[k], *(values[k] for values in payload))
    return (key, start + k, *values) + (0.0,) * (RECORD - 2 - len(payload))


class _BlockSolver:
    """One rank's part of a distributed SMO run: ``alpha``, ``F`` and kernel rows of rows ``start:stop``."""

    def __init__(self, comm, X, y, kernel, C, tol, cache_bytes):
        self.comm, self.y, self.C, self.tol = comm, y, C, tol
        self.xp = xp = array_module(X)
        self.signs = to_host(y)  # the labels of the working pair, read on the host
        self.start, self.stop = block_range(len(X), comm.size, comm.rank)
        self.y_block = y[self.start:self.stop]
        self.diag = kernel.diagonal(X[self.start:self.stop])
        self.cache = KernelRowCache(kernel, X, cache_bytes)
        self.cache.set_columns(np.arange(self.start, self.stop))
        self.best = _BestCandidates(comm)
        self.restart()

    def restart(self):
        """Set the dual variables to the solve's start: ``alpha = 0``, ``F = y`` (cached rows are kept)."""
        self.alpha = self.xp.zeros(self.stop - self.start)
        self.F = self.y_block.copy()
        self.up, self.low = up_low(self.alpha, self.y_block, self.C)

    def select_i(self):
        """Return ``(m, i, alpha_i, K_ii, M)`` over all ranks (one Allreduce)."""
        xp = self.xp
        f_up = xp.where(self.up, self.F, -np.inf)
        f_low = xp.where(self.low, self.F, np.inf)
        records = np.array([_candidate(f_up, self.start, self.alpha, self.diag),
                            _candidate(-f_low, self.start)])
        (m, i, alpha_i, diag_i, _, _), (minus_M, *_) = self.best(records)
        return m, int(i), alpha_i, diag_i, -minus_M

    def select_j(self, m, i, diag_i):
        """Return ``(j, F_j, alpha_j, K_jj, K_ij)`` by the second-order rule, and the local row of ``i``."""
        row_i = self.cache.row(i)
        xp = self.xp
        b = m - xp.where(self.low, self.F, np.inf)
        a = diag_i + self.diag - 2.0 * row_i
        xp.maximum(a, TAU, out=a)
        gain = xp.where(b > 0, b * b / a, -np.inf)
        record = _candidate(gain, self.start, self.F, self.alpha, self.diag, row_i)
        (_, j, F_j, alpha_j, diag_j, K_ij), = self.best(np.array([record]))
        return (int(j), F_j, alpha_j, diag_j, K_ij), row_i

    def update(self, i, F_i, alpha_i, diag_i, j, F_j, alpha_j, diag_j, K_ij, row_i):
        """Apply the clipped Newton step of `svm.solver.smo` to the pair (same arithmetic on every rank)."""
        C = self.C
        step, new_i, new_j = pair_step(C, self.signs[i], self.signs[j], alpha_i, alpha_j, F_i, F_j,
                                       diag_i + diag_j - 2.0 * K_ij)
        for index, value in ((i, new_i), (j, new_j)):
            if self.start <= index < self.stop:
                k = index - self.start
                self.alpha[k] = value
                self.up[k], self.low[k] = up_low(value, self.signs[index], C)
        change = row_i - self.cache.row(j)
        change *= step
        self.F -= change

    def run(self, max_iter):
        """Iterate until the KKT gap is below ``tol`` or ``max_iter`` updates; return ``(n_iter, m, M)``."""
        for n_iter in range(max_iter + 1):
            m, M, _ = self.step(last=n_iter == max_iter)
            if m - M < self.tol or n_iter == max_iter:
                return n_iter, m, M

    def step(self, last=False):
        """One iteration: the first search, then (unless the KKT gap is below ``tol`` or ``last``) the second
        and the update of the pair; return the extremes ``(m, M)`` of the first and the pair ``(i, j)``
        updated (None when none was)."""
        m, i, alpha_i, diag_i, M = self.select_i()
        if m - M < self.tol or last:
            return m, M, None
        pair_j, row_i = self.select_j(m, i, diag_i)
        self.update(i, m, alpha_i, diag_i, *pair_j, row_i)
        return m, M, (i, pair_j[0])

    def result(self, n_iter, m, M):
        """Gather ``alpha`` and reduce the bias and objective sums into an `SMOResult` (same on every rank)."""
        xp = self.xp
        free = (self.alpha > 0) & (self.alpha < self.C)
        local = np.array(fetch(xp, self.F[free].sum(), xp.count_nonzero(free),
                               self.alpha @ (-self.y_block * self.F - 1.0)))
        total = np.empty(3)
        self.comm.Allreduce(local, total)
        free_sum, n_free, objective_twice = total
        bias = bias_from_parts([free_sum, n_free, m, M])
        alpha = xp.empty(len(self.y))
        allgather_blocks(self.comm, self.alpha, alpha, block_counts(len(self.y), self.comm.size))
        return SMOResult(alpha, float(bias), n_iter, 0.5 * float(objective_twice), m - M, m - M < self.tol,
                         self.cache.misses)


def dis_smo_solve(comm, X, y, kernel, C=1.0, tol=1e-3, cache_bytes=DEFAULT_CACHE_BYTES, max_iter=None):
    """Solve the binary C-SVC dual by SMO with the samples distributed in row blocks.

    Every rank passes the same ``X`` and ``y`` (global shapes (n, d) and (n,));
    rank r owns rows ``block_range(n, p, r)`` (about n / p) of ``alpha`` and the
    gradient, and caches kernel rows restricted to its block (``cache_bytes`` per
    rank). Same iterates as ``smo_solve(X, y, kernel, C, tol, shrinking=False)``.

    Parameters
    ----------
    comm : MPI.Comm or kernels.comm.counting.CountingComm
        The ranks taking part (a `CountingComm` gets the bytes sent added to its count).
    X, y, kernel, C, tol, cache_bytes, max_iter
        As `svm.solver.smo.smo_solve` (``y`` in {-1, +1}).

    Returns
    -------
    svm.solver.smo.SMOResult
        With the full ``alpha`` (shape (n,)), the same on every rank.

    Notes
    -----
    Cost per iteration: two Allreduces of 96 and 48 bytes and up to two kernel
    rows of n / p entries per rank; at the end one Allgatherv of ``alpha``.
    """
    X = check_samples(X)
    check_solver_options(C, tol, max_iter)
    xp = array_module(X)
    y = check_signs(xp.asarray(y, dtype=xp.float64), len(X))
    if max_iter is None:
        max_iter = max(10_000_000, 100 * len(X))
    solver = _BlockSolver(comm, X, y, kernel, float(C), float(tol), cache_bytes)
    try:
        result = solver.result(*solver.run(max_iter))
    finally:
        solver.best.free()
    if not result.converged:
        warnings.warn(f"distributed SMO reached max_iter={max_iter} before the KKT gap fell below tol={tol}",
                      ConvergenceWarning, stacklevel=2)
    return result


class DisSMO(ParallelSVC):
    """Binary C-SVC trained by distributed SMO (`dis_smo_solve`); exact (the serial SMO's solution).

    Parameters
    ----------
    C, kernel, gamma, degree, coef0, tol, comm
        As `svm.distributed.common.ParallelSVC`.
    cache_bytes : int
        Kernel-row cache per rank.
    max_iter : int, optional
        Cap on SMO iterations (default as LIBSVM).

    Attributes
    ----------
    As `ParallelSVC`; ``n_iter_`` counts SMO pair updates, ``kernel_rows_`` the kernel rows each rank
    computed (of its ``n / p`` columns; the cache's misses, the same on every rank).
    """

    _PARAMS = ParallelSVC._PARAMS + ("cache_bytes", "max_iter")

    def __init__(self, C=1.0, kernel="rbf", gamma="scale", degree=3, coef0=0.0, tol=1e-3, comm=None,
                 cache_bytes=DEFAULT_CACHE_BYTES, max_iter=None):
        super().__init__(C, kernel, gamma, degree, coef0, tol, comm)
        self.cache_bytes, self.max_iter = cache_bytes, max_iter

    def fit(self, X, y):
        """Train on the full set ``X``, ``y`` (the same on every rank); return self."""
        comm, X, signs = self._begin_fit(X, y, self.max_iter)
        result = dis_smo_solve(comm, X, signs, self.kernel_, self.C, self.tol, self.cache_bytes, self.max_iter)
        support = array_module(X).flatnonzero(result.alpha)
        self.kernel_rows_ = result.kernel_rows
        return self._end_fit(comm, support, X[support], (result.alpha * signs)[support], result.bias,
                             result.objective, result.n_iter)
