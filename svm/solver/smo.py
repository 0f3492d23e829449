"""C-SVC by SMO with second-order working-set selection (LIBSVM's solver); `svm.solver.svc.SVC` wraps it.

The dual solved is ``min_a 1/2 a^T Q a - e^T a`` subject to ``y^T a = 0`` and
``0 <= a <= C``, with ``Q_ij = y_i y_j K(x_i, x_j)``. The solver keeps
``F = -y * grad`` (``F_i = y_i - sum_j a_j y_j K_ij``): the KKT gap is
``m - M`` with ``m = max F over I_up`` and ``M = min F over I_low``
(Fan, Chen & Lin, JMLR 2005), and each step updates ``F`` with two kernel rows.

The solver runs on the array module of ``X`` (`kernels.backend.array_module`):
with CuPy arrays the samples, ``alpha``, ``F``, the masks and the kernel-row
cache stay in device memory, the working pair is chosen by ``argmax`` on the
device, and each iteration reads back two small groups of scalars (`svm.solver.arrays.fetch`):
``i`` with ``m`` and ``M``, then ``j`` with ``F_j`` and ``K_ij`` (the cache's keys); ``y``,
``K_kk`` and ``alpha`` are mirrored on the host. The gain of every ``j`` and the update of ``F``,
both alphas and both masks are one fused kernel each (`svm.solver.pair_update`).
"""
import warnings
from dataclasses import dataclass

import numpy as np

from kernels.backend import array_module
from kernels.errors import InputError
from svm.solver.arrays import fetch, to_host
from svm.solver.checks import check_samples, check_signs, check_solver_options
from svm.solver.gram import KernelRowCache, kernel_product
from svm.solver.kkt import TAU, bias_from_parts, bias_parts, extremes, pair_step, snap, up_low  # noqa: F401 (re-exported for Dis-SMO and Cascade)
from svm.solver.pair_update import fused_kernels

DEFAULT_CACHE_BYTES = 200 * 10**6


class ConvergenceWarning(UserWarning):
    """SMO stopped at the iteration cap before the KKT gap fell below tol."""


@dataclass
class SMOResult:
    """Solution of one binary C-SVC dual.

    Attributes
    ----------
    alpha : ndarray of shape (n,)
        Dual variables; the decision function is ``sum_i alpha_i y_i K(x_i, x) + bias``.
    bias : float
        Intercept (average over free support vectors, or midpoint of the bounds).
    n_iter : int
        Number of SMO pair updates.
    objective : float
        Dual objective ``1/2 a^T Q a - e^T a`` (LIBSVM's ``obj``; negative).
    gap : float
        Final KKT gap ``m(a) - M(a)``.
    converged : bool
        Whether ``gap < tol`` was reached before ``max_iter``.
    kernel_rows : int
        Misses of the kernel-row cache (`svm.solver.gram.KernelRowCache`): the rows computed on demand,
        on each rank for the distributed solvers (what their cost models count).
    """

    alpha: np.ndarray
    bias: float
    n_iter: int
    objective: float
    gap: float
    converged: bool
    kernel_rows: int = 0


class _Solver:
    """State of one SMO run; the active set shrinks as in LIBSVM (``active is None``: all; else host indices)."""

    def __init__(self, X, y, kernel, C, tol, alpha, cache_bytes, shrinking):
        self.X, self.y, self.kernel, self.C, self.tol = X, y, kernel, C, tol
        self.shrinking = shrinking
        self.xp = xp = array_module(X)
        self.alpha = alpha
        support = xp.flatnonzero(alpha)
        self.F = y - kernel_product(kernel, X, X[support], (alpha * y)[support])
        self.diag = kernel.diagonal(X)
        self.cache = KernelRowCache(kernel, X, cache_bytes)
        self.gain, self.fused_update = fused_kernels(xp)
        self.active = None
        self._load()

    def _load(self):
        """Gather the working arrays of the active samples (views when all are active) and their host mirrors
        (the arrays themselves on the host)."""
        where = slice(None) if self.active is None else self.active
        self.a, self.f = self.alpha[where], self.F[where]
        self.ya, self.qd = self.y[where], self.diag[where]
        self.a_host, self.ya_host, self.qd_host = to_host(self.a), to_host(self.ya), to_host(self.qd)
        self.up, self.low = up_low(self.a, self.ya, self.C)
        self.work = self.xp.empty(len(self.a))

    def _store(self):
        if self.active is not None:
            self.alpha[self.active], self.F[self.active] = self.a, self.f

    def _global(self, index):
        return index if self.active is None else int(self.active[index])

    def _candidates(self):
        """Global indices of the active samples nearest to entering a working pair, nearest first.

        Called by the cache on a miss: their rows are computed in the same matrix
        product. A sample's distance is ``m - F`` in I_up and ``F - M`` in I_low
        (the smaller when in both); the 2 ``block_rows`` nearest are returned.
        """
        xp = self.xp
        up = xp.where(self.up, self.f, -np.inf)
        low = xp.where(self.low, self.f, np.inf)
        distance = xp.minimum(up.max() - up, low - low.min())
        count = min(len(distance), 2 * self.cache.block_rows)
        nearest = xp.argpartition(distance, count - 1)[:count]
        nearest = to_host(nearest[xp.argsort(distance[nearest], kind="stable")])
        return (nearest if self.active is None else self.active[nearest]).tolist()

    def select(self):
        """Return the pair ``(i, j)``, their values and the K row of i by the second-order rule, or None when ``m - M < tol``.

        ``i`` maximises F over I_up; ``j`` maximises ``b^2 / a`` over ``j`` in I_low
        with ``b = m - F_j > 0`` and ``a = K_ii + K_jj - 2 K_ij`` (at least TAU).
        Two host reads (`fetch`): ``i`` with ``m`` and ``M``; ``j`` with ``F_j`` and ``K_ij``
        (the other values from the host mirrors).
        """
        xp, f = self.xp, self.f
        f_up = xp.where(self.up, f, -np.inf)
        i = xp.argmax(f_up)
        i, m, M = fetch(xp, i, f_up[i], xp.where(self.low, f, np.inf).min())
        if m - M < self.tol:  # m = F_i, or -inf when I_up is empty
            return None
        i = int(i)
        row_i = self.cache.row(self._global(i), self._candidates)
        qd_i = float(self.qd_host[i])
        j = xp.argmax(self.gain(f, self.low, self.qd, row_i, m, qd_i))
        j, f_j, k_ij = fetch(xp, j, f[j], row_i[j])
        j = int(j)
        pair_j = (j, float(self.ya_host[j]), float(self.a_host[j]), f_j, float(self.qd_host[j]))
        return (i, float(self.ya_host[i]), float(self.a_host[i]), m, qd_i), pair_j, k_ij, row_i

    def update(self, pair_i, pair_j, k_ij, row_i):
        """Move ``alpha_i`` by ``y_i t`` and ``alpha_j`` by ``-y_j t`` with the clipped Newton step t.

        ``pair_i``, ``pair_j``: ``(index, y, alpha, F, K_kk)`` of each (host values, from `select`).
        One fused launch (`svm.solver.pair_update`) updates ``F``, both alphas and both masks.
        """
        (i, y_i, a_i, f_i, qd_i), (j, y_j, a_j, f_j, qd_j) = pair_i, pair_j
        row_j = self.cache.row(self._global(j), self._candidates)
        step, new_i, new_j = pair_step(self.C, y_i, y_j, a_i, a_j, f_i, f_j, qd_i + qd_j - 2.0 * k_ij)
        self.fused_update(row_i, row_j, self.ya, step, i, j, new_i, new_j, self.C, self.work, self.f, self.a,
                          self.up, self.low)
        if self.a_host is not self.a:
            self.a_host[i], self.a_host[j] = new_i, new_j

    def shrink(self, unshrunk):
        """Drop samples that cannot join a violating pair; unshrink once near the end.

        Returns the new ``unshrunk`` flag.
        """
        m, M = extremes(self.f, self.up, self.low)
        if not unshrunk and m - M <= 10 * self.tol:
            unshrunk = True
            self.unshrink()
        drop = ~self.low & (self.f < M) | ~self.up & (self.f > m)
        if bool(drop.any()) and not bool(drop.all()):  # all droppable: already optimal
            self._store()
            keep = ~drop
            kept = to_host(keep)
            self.active = np.flatnonzero(kept) if self.active is None else self.active[kept]
            self.cache.set_columns(self.active, keep)
            self._load()
        return unshrunk

    def unshrink(self):
        """Recompute ``F`` of the inactive samples and activate all.

        The kernel columns of the inactive samples are computed once, in blocked
        matrix products, for the support vectors (``F``) and for the cached rows
        (which then span all samples again: `KernelRowCache.widen`).
        """
        if self.active is None:
            return
        self._store()
        inactive = np.ones(len(self.y), dtype=bool)
        inactive[self.active] = False
        support = self.xp.flatnonzero(self.alpha)
        self.F[inactive] = self.y[inactive] - self.cache.widen(support, (self.alpha * self.y)[support])
        self.active = None
        self._load()

    def run(self, max_iter):
        """Iterate as LIBSVM's ``Solver::Solve``; return ``(n_iter, converged)``."""
        n = len(self.y)
        counter = min(n, 1000) + 1
        unshrunk = False
        for n_iter in range(max_iter):
            counter -= 1
            if counter == 0:
                counter = min(n, 1000)
                if self.shrinking:
                    unshrunk = self.shrink(unshrunk)
            pair = self.select()
            if pair is None:
                if self.active is None:
                    return n_iter, True
                self.unshrink()
                pair = self.select()
                if pair is None:
                    return n_iter, True
                counter = 1
            self.update(*pair)
        self.unshrink()
        return max_iter, self.select() is None

    def result(self, n_iter, converged):
        """Bias (LIBSVM's rho, negated), objective and gap of the final ``alpha``, as an `SMOResult`."""
        alpha, F, y = self.alpha, self.F, self.y
        parts = bias_parts(F, alpha, y, self.C)
        objective = 0.5 * float(alpha @ (-y * F - 1.0))
        return SMOResult(alpha, bias_from_parts(parts), n_iter, objective, parts[2] - parts[3], converged,
                         self.cache.misses)


def smo_solve(X, y, kernel, C=1.0, tol=1e-3, alpha0=None, cache_bytes=DEFAULT_CACHE_BYTES,
              shrinking=True, max_iter=None):
    """Solve the binary C-SVC dual by SMO with second-order working-set selection.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        NumPy or device (CuPy) array: the solve runs in its array module.
    y : ndarray of shape (n,)
        Labels in {-1, +1} (one class alone gives ``alpha = 0`` and ``bias = +-1``).
    kernel : svm.solver.gram.Kernel
    C : float
        Box constraint, ``C > 0``.
    tol : float
        Stop when the KKT gap ``m(alpha) - M(alpha) < tol`` (LIBSVM's ``eps``).
    alpha0 : ndarray of shape (n,), optional
        Feasible starting point (warm start): ``0 <= alpha0 <= C`` and ``y @ alpha0 = 0``
        up to rounding. Values within ``SNAP * C`` of a bound start on it (a sum
        of alphas one ulp below ``C`` is at the bound, not free: the bias is taken
        from the free alphas). Default: zeros.
    cache_bytes : int
        Memory bound for the LRU cache of kernel rows.
    shrinking : bool
        Use LIBSVM's shrinking heuristic (same solution, fewer kernel columns).
    max_iter : int, optional
        Iteration cap (default ``max(10_000_000, 100 n)``, as LIBSVM); hitting it
        warns with `ConvergenceWarning`.

    Returns
    -------
    SMOResult
        ``alpha`` in the array module of ``X``.

    Raises
    ------
    InputError
        Bad shapes, non-finite values, labels outside {-1, +1}, ``C <= 0``,
        ``tol <= 0`` or an infeasible ``alpha0``.
    """
    X = check_samples(X)
    check_solver_options(C, tol, max_iter)
    xp = array_module(X)
    y = check_signs(xp.asarray(y, dtype=xp.float64), len(X))
    n = len(X)
    if alpha0 is None:
        alpha = xp.zeros(n)
    else:
        alpha = xp.asarray(alpha0, dtype=xp.float64)
        slack = 1e-8 * C * n
        if alpha.shape != (n,) or not bool(xp.isfinite(alpha).all()):
            raise InputError(f"alpha0 must be {n} finite numbers, got shape {alpha.shape}")
        low, high, balance = fetch(xp, alpha.min(), alpha.max(), y @ alpha)
        if low < -slack or high > C + slack or abs(balance) > slack:
            raise InputError("alpha0 is infeasible: need 0 <= alpha0 <= C and y @ alpha0 = 0")
        alpha = snap(xp.clip(alpha, 0.0, C), C)
    if max_iter is None:
        max_iter = max(10_000_000, 100 * n)
    solver = _Solver(X, y, kernel, float(C), float(tol), alpha, cache_bytes, shrinking)
    n_iter, converged = solver.run(max_iter)
    if not converged:
        warnings.warn(f"SMO reached max_iter={max_iter} before the KKT gap fell below tol={tol}",
                      ConvergenceWarning, stacklevel=2)
    return solver.result(n_iter, converged)
