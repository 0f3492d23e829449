"""Checks of the SVM solvers' inputs (samples, labels, options): one-line `InputError` for what they cannot take."""
from numbers import Real

import numpy as np

from kernels.backend import array_module
from kernels.errors import InputError


def check_samples(X, name="X"):
    """Return ``X`` as a C-contiguous float64 matrix (in its array module); InputError if not 2D, empty or not finite."""
    xp = array_module(X)
    X = xp.ascontiguousarray(X, dtype=xp.float64)
    if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise InputError(f"{name} must be a non-empty 2D array (samples x features), got shape {X.shape}")
    if not bool(xp.isfinite(X).all()):
        raise InputError(f"{name} contains NaN or infinite values")
    return X


def check_signs(y, n):
    """Return ``y`` (float64, any array module) if it holds ``n`` labels in {-1, +1}; else InputError."""
    if y.shape != (n,) or not bool(((y == 1.0) | (y == -1.0)).all()):
        raise InputError(f"y must hold {n} labels in {{-1, +1}}, got shape {y.shape}")
    return y


def check_solver_options(C, tol, max_iter):
    """InputError unless ``C > 0``, ``tol > 0`` and ``max_iter`` is None or a positive integer."""
    if not isinstance(C, Real) or not 0 < C < np.inf:
        raise InputError(f"C must be a positive finite number, got {C!r}")
    if not isinstance(tol, Real) or not 0 < tol < np.inf:
        raise InputError(f"tol must be a positive number, got {tol!r}")
    if max_iter is not None and (not isinstance(max_iter, (int, np.integer)) or max_iter < 1):
        raise InputError(f"max_iter must be None or a positive integer, got {max_iter!r}")
