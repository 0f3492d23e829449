"""C-SVC by SMO with second-order working-set selection (LIBSVM's solver); `svm.solver.svc.SVC` wraps it.

The dual solved is ``min_a 1/2 a^T Q a - e^T a`` subject to ``y^T a = 0`` and
``0 <= a <= C``, with ``Q_ij = y_i y_j K(x_i, x_j)``. The solver keeps
``F = -y * grad`` (``F_i = y_i - sum_j a_j y_j K_ij``): the KKT gap is
``m - M`` with ``m = max F over I_up`` and ``M = min F over I_low``
(Fan, Chen & Lin, JMLR 2005), and each step updates ``F`` with two kernel rows.
"""
import warnings
from dataclasses import dataclass
from numbers import Real

import numpy as np

from kernels.errors import InputError
from svm.solver.gram import KernelRowCache, kernel_product

DEFAULT_CACHE_BYTES = 200 * 10**6
TAU = 1e-12  # stands in for a non-positive a_ij = K_ii + K_jj - 2 K_ij
SNAP = 1e-12  # an alpha within SNAP * C of a bound is put on it (rounding must not make it free)


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
    """

    alpha: np.ndarray
    bias: float
    n_iter: int
    objective: float
    gap: float
    converged: bool


def check_samples(X, name="X"):
    """Return ``X`` as a C-contiguous float64 matrix; InputError if not 2D, empty or not finite."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise InputError(f"{name} must be a non-empty 2D array (samples x features), got shape {X.shape}")
    if not np.isfinite(X).all():
        raise InputError(f"{name} contains NaN or infinite values")
    return X


def check_solver_options(C, tol, max_iter):
    """InputError unless ``C > 0``, ``tol > 0`` and ``max_iter`` is None or a positive integer."""
    if not isinstance(C, Real) or not 0 < C < np.inf:
        raise InputError(f"C must be a positive finite number, got {C!r}")
    if not isinstance(tol, Real) or not 0 < tol < np.inf:
        raise InputError(f"tol must be a positive number, got {tol!r}")
    if max_iter is not None and (not isinstance(max_iter, (int, np.integer)) or max_iter < 1):
        raise InputError(f"max_iter must be None or a positive integer, got {max_iter!r}")


def up_low(alpha, y, C):
    """Masks of I_up (alpha_i may move along y_i) and I_low (along -y_i)."""
    positive = y > 0
    return positive & (alpha < C) | ~positive & (alpha > 0), positive & (alpha > 0) | ~positive & (alpha < C)


def _extremes(F, up, low):
    """``m = max F over I_up`` (-inf if empty) and ``M = min F over I_low`` (inf if empty)."""
    m = np.max(F, where=up, initial=-np.inf)
    return float(m), float(np.min(F, where=low, initial=np.inf))


def snap(alpha, C):
    """``alpha`` (array or scalar) with values within ``SNAP * C`` of 0 or ``C`` put on that bound."""
    tolerance = SNAP * C
    return np.where(alpha < tolerance, 0.0, np.where(alpha > C - tolerance, C, alpha))


def pair_step(C, y_i, y_j, alpha_i, alpha_j, F_i, F_j, curvature):
    """Clipped Newton step ``t`` of the pair (i up by ``y_i t``, j down by ``y_j t``); return ``(t, new a_i, new a_j)``.

    A new alpha that lands within ``SNAP * C`` of a bound (``C - a_i + a_j`` rounds
    differently from the room it was clipped to) is put on the bound, so that it
    does not count as free. Shared by `smo_solve` and `svm.distributed.dis_smo` (same iterates).
    """
    step = (F_i - F_j) / (curvature if curvature > 0 else TAU)
    room_i = C - alpha_i if y_i > 0 else alpha_i
    room_j = alpha_j if y_j > 0 else C - alpha_j
    step = min(step, room_i, room_j)
    new_i = (C if y_i > 0 else 0.0) if step == room_i else float(snap(alpha_i + y_i * step, C))
    new_j = (0.0 if y_j > 0 else C) if step == room_j else float(snap(alpha_j - y_j * step, C))
    return step, new_i, new_j


def bias_parts(F, alpha, y, C):
    """Terms of the bias over some samples: ``[sum of F over free alphas, free count, m, M]``.

    Blocks that together hold every sample each give their parts; `bias_from_parts`
    combines them (sums add, ``m`` takes the max, ``M`` the min). Empty blocks give
    ``[0, 0, -inf, inf]``.
    """
    m, M = _extremes(F, *up_low(alpha, y, C))
    free = (alpha > 0) & (alpha < C)
    return np.array([F[free].sum(), np.count_nonzero(free), m, M])


def bias_from_parts(parts):
    """LIBSVM's bias (``-rho`` of ``calculate_rho``) from `bias_parts` of blocks, shape ``(blocks, 4)`` or ``(4,)``.

    The mean of ``F`` over the free alphas; without a free alpha, the midpoint
    ``(m + M) / 2`` of the interval of feasible biases, taken over *all* samples
    (the bounded ones decide it; one class alone: the finite end).
    """
    parts = np.atleast_2d(parts)
    free_sum, n_free = parts[:, 0].sum(), parts[:, 1].sum()
    if n_free > 0:
        return float(free_sum / n_free)
    m, M = float(parts[:, 2].max()), float(parts[:, 3].min())
    return (m + M) / 2 if np.isfinite(m) and np.isfinite(M) else (m if np.isfinite(m) else M)


class _Solver:
    """State of one SMO run; the active set shrinks as in LIBSVM (``active is None``: all)."""

    def __init__(self, X, y, kernel, C, tol, alpha, cache_bytes, shrinking):
        self.X, self.y, self.kernel, self.C, self.tol = X, y, kernel, C, tol
        self.shrinking = shrinking
        self.alpha = alpha
        support = np.flatnonzero(alpha)
        self.F = y - kernel_product(kernel, X, X[support], (alpha * y)[support])
        self.diag = kernel.diagonal(X)
        self.cache = KernelRowCache(kernel, X, cache_bytes)
        self.active = None
        self._load()

    def _load(self):
        """Gather the working arrays of the active samples (views when all are active)."""
        where = slice(None) if self.active is None else self.active
        self.a, self.f = self.alpha[where], self.F[where]
        self.ya, self.qd = self.y[where], self.diag[where]
        self.up, self.low = up_low(self.a, self.ya, self.C)

    def _store(self):
        if self.active is not None:
            self.alpha[self.active], self.F[self.active] = self.a, self.f

    def _global(self, index):
        return index if self.active is None else int(self.active[index])

    def select(self):
        """Return ``(i, j, K row of i)`` by the second-order rule, or None when ``m - M < tol``.

        ``i`` maximises F over I_up; ``j`` maximises ``b^2 / a`` over ``j`` in I_low
        with ``b = m - F_j > 0`` and ``a = K_ii + K_jj - 2 K_ij`` (at least TAU).
        """
        f = self.f
        i = int(np.argmax(np.where(self.up, f, -np.inf)))
        f_low = np.where(self.low, f, np.inf)
        m = f[i] if self.up[i] else -np.inf
        if m - f_low.min() < self.tol:
            return None
        row_i = self.cache.row(self._global(i))
        b = m - f_low
        a = self.qd[i] + self.qd - 2.0 * row_i
        np.maximum(a, TAU, out=a)
        gain = np.where(b > 0, b * b / a, -np.inf)
        return i, int(np.argmax(gain)), row_i

    def update(self, i, j, row_i):
        """Move ``alpha_i`` by ``y_i t`` and ``alpha_j`` by ``-y_j t`` with the clipped Newton step t."""
        row_j = self.cache.row(self._global(j))
        a, C = self.a, self.C
        curvature = self.qd[i] + self.qd[j] - 2.0 * row_i[j]
        step, a[i], a[j] = pair_step(C, self.ya[i], self.ya[j], a[i], a[j], self.f[i], self.f[j], curvature)
        change = row_i - row_j
        change *= step
        self.f -= change
        for k in (i, j):
            self.up[k], self.low[k] = up_low(a[k], self.ya[k], C)

    def shrink(self, unshrunk):
        """Drop samples that cannot join a violating pair; unshrink once near the end.

        Returns the new ``unshrunk`` flag.
        """
        m, M = _extremes(self.f, self.up, self.low)
        if not unshrunk and m - M <= 10 * self.tol:
            unshrunk = True
            self.unshrink()
        drop = ~self.low & (self.f < M) | ~self.up & (self.f > m)
        if drop.any() and not drop.all():  # all droppable: already optimal
            self._store()
            keep = ~drop
            self.active = np.flatnonzero(keep) if self.active is None else self.active[keep]
            self.cache.set_columns(self.active, keep)
            self._load()
        return unshrunk

    def unshrink(self):
        """Recompute ``F`` of the inactive samples (one blocked kernel product) and activate all."""
        if self.active is None:
            return
        self._store()
        inactive = np.ones(len(self.y), dtype=bool)
        inactive[self.active] = False
        support = np.flatnonzero(self.alpha)
        coef = (self.alpha * self.y)[support]
        self.F[inactive] = self.y[inactive] - kernel_product(self.kernel, self.X[inactive], self.X[support], coef)
        self.active = None
        self.cache.set_columns(None)
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
        return SMOResult(alpha, bias_from_parts(parts), n_iter, objective, parts[2] - parts[3], converged)


def smo_solve(X, y, kernel, C=1.0, tol=1e-3, alpha0=None, cache_bytes=DEFAULT_CACHE_BYTES,
              shrinking=True, max_iter=None):
    """Solve the binary C-SVC dual by SMO with second-order working-set selection.

    Parameters
    ----------
    X : ndarray of shape (n, d)
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

    Raises
    ------
    InputError
        Bad shapes, non-finite values, labels outside {-1, +1}, ``C <= 0``,
        ``tol <= 0`` or an infeasible ``alpha0``.
    """
    X = check_samples(X)
    check_solver_options(C, tol, max_iter)
    y = np.asarray(y, dtype=np.float64)
    n = len(X)
    if y.shape != (n,) or not np.isin(y, (-1.0, 1.0)).all():
        raise InputError(f"y must hold {n} labels in {{-1, +1}}, got shape {y.shape}")
    if alpha0 is None:
        alpha = np.zeros(n)
    else:
        alpha = np.array(alpha0, dtype=np.float64)
        slack = 1e-8 * C * n
        if alpha.shape != (n,) or not np.isfinite(alpha).all():
            raise InputError(f"alpha0 must be {n} finite numbers, got shape {alpha.shape}")
        if alpha.min() < -slack or alpha.max() > C + slack or abs(y @ alpha) > slack:
            raise InputError("alpha0 is infeasible: need 0 <= alpha0 <= C and y @ alpha0 = 0")
        alpha = snap(np.clip(alpha, 0.0, C), C)
    if max_iter is None:
        max_iter = max(10_000_000, 100 * n)
    solver = _Solver(X, y, kernel, float(C), float(tol), alpha, cache_bytes, shrinking)
    n_iter, converged = solver.run(max_iter)
    if not converged:
        warnings.warn(f"SMO reached max_iter={max_iter} before the KKT gap fell below tol={tol}",
                      ConvergenceWarning, stacklevel=2)
    return solver.result(n_iter, converged)
