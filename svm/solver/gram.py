"""Kernel functions, blocked kernel products and an LRU cache of kernel rows.

Every kernel value is computed in blocks from one matrix product ``A @ B.T``
(plus squared row norms for RBF), never one element at a time. Everything runs
on the array module of its inputs (`kernels.backend.array_module`): NumPy, or
CuPy with the samples, kernel rows and cache in device memory.
"""
from collections import OrderedDict
from dataclasses import dataclass
from numbers import Real

import numpy as np

from kernels.backend import array_module
from kernels.errors import InputError
from svm.solver.arrays import to_host

KERNEL_NAMES = ("linear", "poly", "rbf", "sigmoid")

#: Largest kernel block (bytes) built at once by `kernel_product` and `KernelRowCache.widen`.
BLOCK_BYTES = 32 * 2**20
#: Rows `KernelRowCache` computes by one matrix product on a miss (the row asked for and candidates).
BLOCK_ROWS = 128
#: Columns' bytes (``X[columns]``) from which `KernelRowCache` computes rows in blocks: below, a
#: matrix-vector product reads ``X`` from the CPU cache and blocks gain nothing (and small problems
#: keep the rounding of one row per product, which Dis-SMO's iterates reproduce exactly).
BATCH_BYTES = 4 * 2**20


def squared_norms(A):
    """Squared Euclidean norm of each row of ``A`` (shape ``(n,)``)."""
    return array_module(A).einsum("ij,ij->i", A, A)


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
        xp = array_module(A)
        K = A @ B.T
        if self.name == "linear":
            return K
        if self.name == "rbf":
            if B_sqnorms is None:
                B_sqnorms = squared_norms(B)
            K *= -2.0
            K += squared_norms(A)[:, None]
            K += B_sqnorms[None, :]
            xp.maximum(K, 0.0, out=K)
            K *= -self.gamma
            return xp.exp(K, out=K)
        K *= self.gamma
        K += self.coef0
        if self.name == "poly":
            return xp.power(K, self.degree, out=K)
        return xp.tanh(K, out=K)

    def diagonal(self, A):
        """Return ``K(a, a)`` for each row ``a`` of ``A`` (shape ``(len(A),)``)."""
        xp = array_module(A)
        if self.name == "rbf":
            return xp.ones(len(A))
        norms = squared_norms(A)
        if self.name == "linear":
            return norms
        inner = self.gamma * norms + self.coef0
        return inner**self.degree if self.name == "poly" else xp.tanh(inner)


def resolve_gamma(gamma, X):
    """Return ``gamma`` as a positive float.

    ``"scale"`` is ``1 / (n_features * X.var())`` (1.0 when ``X`` is constant) and
    ``"auto"`` is ``1 / n_features``, as in scikit-learn.
    """
    if isinstance(gamma, str):
        if gamma == "scale":
            variance = float(X.var())
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
    out = array_module(A).zeros((len(A),) + coef.shape[1:])
    if len(B) == 0:
        return out
    B_sqnorms = squared_norms(B)
    rows = max(1, block_bytes // (8 * len(B)))
    for start in range(0, len(A), rows):
        out[start:start + rows] = kernel.block(A[start:start + rows], B, B_sqnorms) @ coef
    return out


class KernelRowCache:
    """Least-recently-used cache of kernel rows ``K(x_i, X[columns])``.

    A missing row is computed by BLAS from the cached squared norms: one
    matrix-vector product, or one matrix product for the missing row and up to
    ``block_rows - 1`` rows the caller expects to need soon (``candidates``), which
    reads ``X`` once for all of them. Rows are kept while their total size stays
    within ``max_bytes``; the least recently used rows are evicted first.
    ``columns`` may be narrowed (shrinking), which slices the cached rows; `widen`
    completes them to all samples again, `set_columns` to all samples empties the cache.

    Parameters
    ----------
    kernel : Kernel
    X : ndarray of shape (n, d)
        The training samples (C-contiguous float64; rows are kept in its array module).
    max_bytes : int
        Bound on the bytes held by cached rows; with less than one row's worth
        nothing is kept and every row is recomputed.
    block_rows : int
        Most rows computed by one matrix product (1: one row per product).
    """

    def __init__(self, kernel, X, max_bytes, block_rows=BLOCK_ROWS):
        self.kernel = kernel
        self.X = X
        self.max_bytes = int(max_bytes)
        self.block_rows = max(1, int(block_rows))
        self.nbytes = 0
        self.misses = 0
        self._rows = OrderedDict()
        self.set_columns(None)

    def set_columns(self, columns, keep=None):
        """Make rows span ``X[columns]`` (all samples when ``columns`` is None).

        ``columns`` is a host index array. ``keep`` is a boolean mask over the current columns that yields
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

    def _room(self, row_bytes):
        """How many rows of ``row_bytes`` fit within ``max_bytes``."""
        return self.max_bytes // row_bytes if row_bytes else len(self.X)

    def row(self, index, candidates=None):
        """Return ``K(x_index, X[columns])`` (do not modify it).

        ``candidates`` (called on a miss only) returns sample indices in order of
        likely use: when ``X[columns]`` holds at least `BATCH_BYTES`, the first
        uncached ones, up to ``block_rows - 1`` and a quarter
        of the rows the cache can hold, are computed in the same matrix product
        and cached (the row asked for as the most recently used).
        """
        row = self._rows.get(index)
        if row is not None:
            self._rows.move_to_end(index)
            return row
        self.misses += 1
        extra = min(self.block_rows, self._room(8 * len(self.X_columns)) // 4) - 1
        block = [index]
        if extra > 0 and candidates is not None and self.X_columns.nbytes >= BATCH_BYTES:
            block += [i for i in candidates() if i != index and i not in self._rows][:extra]
        rows = self.kernel.block(self.X[block[::-1]], self.X_columns, self.sqnorms)
        for i, computed in zip(block[::-1], rows):
            self._insert(i, computed.copy() if len(block) > 1 else computed)
        return rows[-1]

    def forget(self, index):
        """Drop the row of ``index`` if cached (its next `row` computes it again)."""
        row = self._rows.pop(index, None)
        self.nbytes -= 0 if row is None else row.nbytes

    def _insert(self, index, row):
        """Cache ``row`` as the most recently used (evicting the least recently used) if it fits."""
        if row.nbytes > self.max_bytes:
            return
        while self.nbytes + row.nbytes > self.max_bytes:
            self.nbytes -= self._rows.popitem(last=False)[1].nbytes
        self._rows[index] = row
        self.nbytes += row.nbytes

    def widen(self, rows, coef, block_bytes=BLOCK_BYTES):
        """Make rows span all samples again, completing cached rows; return ``K(X[new], X[rows]) @ coef``.

        The columns added (``new``: the samples outside ``columns``, in order) are
        computed for the cached rows (the most recently used ones that fit at full
        length; older ones are dropped) and for ``rows`` in blocked matrix products
        of at most ``block_bytes``, so a solver rebuilds its gradient on ``new`` from
        the same products that complete its cache. Cost: ``2 |rows + cached| |new| d`` flops.

        Parameters
        ----------
        rows : ndarray of shape (k,)
            Sample indices whose kernel columns ``coef`` weighs (host or device).
        coef : ndarray of shape (k,)

        Returns
        -------
        ndarray of shape (n_new,)
        """
        xp, n = array_module(self.X), len(self.X)
        if self.columns is None:
            return xp.zeros(0)
        new = np.ones(n, dtype=bool)
        new[self.columns] = False
        new = np.flatnonzero(new)
        weight = xp.zeros(n)
        weight[rows] = coef
        for _ in range(max(0, len(self._rows) - self._room(8 * n))):
            self.nbytes -= self._rows.popitem(last=False)[1].nbytes
        needed = np.union1d(np.fromiter(self._rows, dtype=np.int64, count=len(self._rows)), to_host(rows))
        product = xp.zeros(len(new))
        X_new = self.X[new]
        new_sqnorms = squared_norms(X_new)
        step = max(1, block_bytes // (8 * max(1, len(new))))
        for start in range(0, len(needed), step):
            chunk = needed[start:start + step]
            block = self.kernel.block(self.X[chunk], X_new, new_sqnorms)
            product += weight[chunk] @ block
            for i, part in zip(chunk.tolist(), block):
                cached = self._rows.get(i)
                if cached is not None:
                    full = xp.empty(n)
                    full[new] = part
                    full[self.columns] = cached
                    self._rows[i] = full
        self.columns, self.X_columns, self.sqnorms = None, self.X, squared_norms(self.X)
        self.nbytes = sum(row.nbytes for row in self._rows.values())
        return product
