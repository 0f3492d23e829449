"""Kernel functions, blocked kernel products and an LRU cache of kernel rows.

Every kernel value is computed in blocks from one matrix product ``A @ B.T``
(plus squared row norms for RBF), never one element at a time.
"""
from collections import OrderedDict
from dataclasses import dataclass
from numbers import Real

import numpy as np

from kernels.errors import InputError

KERNEL_NAMES = ("linear", "poly", "rbf", "sigmoid")

#: Largest kernel block (bytes) built at once by `kernel_product`.
BLOCK_BYTES = 32 * 2**20


def squared_norms(A):
    """Squared Euclidean norm of each row of ``A`` (shape ``(n,)``)."""
    return np.einsum("ij,ij->i", A, A)


@dataclass(frozen=True)
class Kernel:
    """A kernel with numeric parameters, as in LIBSVM and scikit-learn.

    ``linear``: ``<a, b>``; ``poly``: ``(gamma <a, b> + coef0) ** degree``;
    ``rbf``: ``exp(-gamma |a - b|^2)``; ``sigmoid``: ``tanh(gamma <a, b> + coef0)``.
    Build one with `make_kernel`, which checks the parameters and resolves
    ``gamma="scale"`` or ``"auto"`` from the data.
    """

    name: str
    gamma: float = 1.0
    coef0: float = 0.0
    degree: int = 3

    def block(self, A, B, B_sqnorms=None):
        """Return the kernel block ``K(A, B)`` of shape ``(len(A), len(B))``.

        Parameters
        ----------
        A, B : ndarray of shape (m, d) and (n, d)
        B_sqnorms : ndarray of shape (n,), optional
            ``squared_norms(B)``, to save recomputing it (used by RBF only).
        """
        K = A @ B.T
        if self.name == "linear":
            return K
        if self.name == "rbf":
            if B_sqnorms is None:
                B_sqnorms = squared_norms(B)
            K *= -2.0
            K += squared_norms(A)[:, None]
            K += B_sqnorms[None, :]
            np.maximum(K, 0.0, out=K)
            K *= -self.gamma
            return np.exp(K, out=K)
        K *= self.gamma
        K += self.coef0
        if self.name == "poly":
            return np.power(K, self.degree, out=K)
        return np.tanh(K, out=K)

    def diagonal(self, A):
        """Return ``K(a, a)`` for each row ``a`` of ``A`` (shape ``(len(A),)``)."""
        if self.name == "rbf":
            return np.ones(len(A))
        norms = squared_norms(A)
        if self.name == "linear":
            return norms
        inner = self.gamma * norms + self.coef0
        return inner**self.degree if self.name == "poly" else np.tanh(inner)


def resolve_gamma(gamma, X):
    """Return ``gamma`` as a positive float.

    ``"scale"`` is ``1 / (n_features * X.var())`` (1.0 when ``X`` is constant) and
    ``"auto"`` is ``1 / n_features``, as in scikit-learn.
    """
    if isinstance(gamma, str):
        if gamma == "scale":
            variance = float(np.var(X))
            return 1.0 / (X.shape[1] * variance) if variance > 0 else 1.0
        if gamma == "auto":
            return 1.0 / X.shape[1]
        raise InputError(f"gamma must be 'scale', 'auto' or a positive number, got {gamma!r}")
    if not isinstance(gamma, Real) or not gamma > 0:
        raise InputError(f"gamma must be 'scale', 'auto' or a positive number, got {gamma!r}")
    return float(gamma)


def make_kernel(name, X, gamma="scale", coef0=0.0, degree=3):
    """Check kernel parameters and return a `Kernel` (``gamma`` resolved from ``X``).

    Raises
    ------
    InputError
        Unknown kernel name, non-positive gamma, non-finite coef0, negative or
        non-integer degree.
    """
    if name not in KERNEL_NAMES:
        raise InputError(f"unknown kernel {name!r}; choose one of {', '.join(KERNEL_NAMES)}")
    if not isinstance(coef0, Real) or not np.isfinite(coef0):
        raise InputError(f"coef0 must be a finite number, got {coef0!r}")
    if isinstance(degree, bool) or not isinstance(degree, (int, np.integer)) or degree < 0:
        raise InputError(f"degree must be an integer >= 0, got {degree!r}")
    return Kernel(name, resolve_gamma(gamma, X), float(coef0), int(degree))


def kernel_product(kernel, A, B, coef, block_bytes=BLOCK_BYTES):
    """Return ``K(A, B) @ coef`` without holding more than ``block_bytes`` of ``K``.

    The rows of ``A`` are taken in blocks; each block is one matrix product.

    Parameters
    ----------
    kernel : Kernel
    A, B : ndarray of shape (m, d) and (n, d)
    coef : ndarray of shape (n,) or (n, k)
    block_bytes : int
        Memory bound for one kernel block (at least one row is always built).

    Returns
    -------
    ndarray of shape (m,) or (m, k)
    """
    out = np.zeros((len(A),) + coef.shape[1:])
    if len(B) == 0:
        return out
    B_sqnorms = squared_norms(B)
    rows = max(1, block_bytes // (8 * len(B)))
    for start in range(0, len(A), rows):
        out[start:start + rows] = kernel.block(A[start:start + rows], B, B_sqnorms) @ coef
    return out


class KernelRowCache:
    """Least-recently-used cache of kernel rows ``K(x_i, X[columns])``.

    Rows are computed on demand (one matrix-vector product each) and kept
    while their total size stays within ``max_bytes``; the least recently
    used rows are evicted first. ``columns`` may be narrowed (shrinking), which
    slices the cached rows, or reset to all samples, which empties the cache.

    Parameters
    ----------
    kernel : Kernel
    X : ndarray of shape (n, d)
        The training samples (C-contiguous float64).
    max_bytes : int
        Bound on the bytes held by cached rows; with less than one row's worth
        nothing is kept and every row is recomputed.
    """

    def __init__(self, kernel, X, max_bytes):
        self.kernel = kernel
        self.X = X
        self.max_bytes = int(max_bytes)
        self.nbytes = 0
        self.misses = 0
        self._rows = OrderedDict()
        self.set_columns(None)

    def set_columns(self, columns, keep=None):
        """Make rows span ``X[columns]`` (all samples when ``columns`` is None).

        ``keep`` is a boolean mask over the current columns that yields
        ``columns``: cached rows are sliced with it, and rows of samples no
        longer among the columns are dropped. Without ``keep`` the cache is emptied.
        """
        self.columns = columns
        self.X_columns = self.X if columns is None else self.X[columns]
        self.sqnorms = squared_norms(self.X_columns)
        if keep is None:
            self._rows.clear()
        else:
            kept = set(columns.tolist())
            self._rows = OrderedDict((i, row[keep]) for i, row in self._rows.items() if i in kept)
        self.nbytes = sum(row.nbytes for row in self._rows.values())

    def row(self, index):
        """Return ``K(x_index, X[columns])`` (do not modify it)."""
        row = self._rows.get(index)
        if row is not None:
            self._rows.move_to_end(index)
            return row
        self.misses += 1
        row = self.kernel.block(self.X[index:index + 1], self.X_columns, self.sqnorms)[0]
        if row.nbytes <= self.max_bytes:
            while self.nbytes + row.nbytes > self.max_bytes:
                self.nbytes -= self._rows.popitem(last=False)[1].nbytes
            self._rows[index] = row
            self.nbytes += row.nbytes
        return row
