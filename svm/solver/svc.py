"""`SVC`: a scikit-learn-style C-SVC estimator on the SMO solver, binary and one-vs-one multiclass.

It runs in the array module of the training samples (`kernels.backend.array_module`):
given CuPy arrays, the model (support vectors, coefficients, classes) and the
predictions stay in device memory.
"""
import numpy as np

from kernels.backend import array_module
from kernels.errors import InputError
from svm.solver.gram import kernel_product, make_kernel
from svm.solver.checks import check_samples, check_solver_options
from svm.solver.smo import DEFAULT_CACHE_BYTES, smo_solve


class SVC:
    """C-support vector classifier (scikit-learn API); multiclass by one-vs-one voting.

    Parameters are those of ``sklearn.svm.SVC`` (``cache_bytes`` replaces
    ``cache_size`` in MB; ``max_iter=None`` is LIBSVM's cap). Each pair of
    classes ``(a, b)``, ``a < b``, is one `smo_solve` problem with ``+1`` for ``a``.

    Attributes
    ----------
    classes_ : ndarray of shape (k,)
    support_ : ndarray of shape (n_SV,)
        Indices of the support vectors, grouped by class.
    support_vectors_ : ndarray of shape (n_SV, d)
    n_support_ : ndarray of shape (k,)
    dual_coef_ : ndarray of shape (k - 1, n_SV)
        ``y_i alpha_i`` in LIBSVM's one-vs-one layout (binary: ``+1`` is ``classes_[1]``).
    intercept_, n_iter_, dual_objective_ : ndarray of shape (k (k - 1) / 2,)
        Per pair of classes: bias, SMO iterations and dual objective.
    kernel_ : svm.solver.gram.Kernel
        The kernel with ``gamma`` resolved.
    """

    _PARAMS = ("C", "kernel", "degree", "gamma", "coef0", "tol", "cache_bytes", "shrinking", "max_iter")

    def __init__(self, C=1.0, kernel="rbf", degree=3, gamma="scale", coef0=0.0, tol=1e-3,
                 cache_bytes=DEFAULT_CACHE_BYTES, shrinking=True, max_iter=None):
        self.C, self.kernel, self.degree, self.gamma, self.coef0 = C, kernel, degree, gamma, coef0
        self.tol, self.cache_bytes, self.shrinking, self.max_iter = tol, cache_bytes, shrinking, max_iter

    def get_params(self, deep=True):
        """Constructor parameters by name (as scikit-learn's ``get_params``)."""
        return {name: getattr(self, name) for name in self._PARAMS}

    def set_params(self, **params):
        """Set constructor parameters by name; return self."""
        for name, value in params.items():
            if name not in self._PARAMS:
                raise InputError(f"SVC has no parameter {name!r}")
            setattr(self, name, value)
        return self

    def fit(self, X, y):
        """Train one binary SVM per pair of classes; return self."""
        X = check_samples(X)
        xp = array_module(X)
        y = xp.asarray(y)
        if y.shape != (len(X),):
            raise InputError(f"y must hold one label per sample ({len(X)}), got shape {y.shape}")
        self.classes_, codes = xp.unique(y, return_inverse=True)
        codes = codes.reshape(-1)
        if len(self.classes_) < 2:
            raise InputError(f"need samples of at least 2 classes, got {len(self.classes_)}")
        check_solver_options(self.C, self.tol, self.max_iter)
        self.kernel_ = make_kernel(self.kernel, X, self.gamma, self.coef0, self.degree)
        self._pairs = [(a, b) for a in range(len(self.classes_)) for b in range(a + 1, len(self.classes_))]
        solved = []
        for a, b in self._pairs:
            members = xp.flatnonzero((codes == a) | (codes == b))
            labels = xp.where(codes[members] == a, 1.0, -1.0)
            result = smo_solve(X[members], labels, self.kernel_, self.C, self.tol,
                               cache_bytes=self.cache_bytes, shrinking=self.shrinking, max_iter=self.max_iter)
            solved.append((members, labels, result))
        self._collect(X, codes, solved)
        return self

    def _collect(self, X, codes, solved):
        """Set the learned attributes from the per-pair solutions (in the array module of ``X``)."""
        xp = array_module(X)
        is_support = xp.zeros(len(X), dtype=bool)
        for members, _, result in solved:
            is_support[members[result.alpha > 0]] = True
        support = xp.flatnonzero(is_support)
        self.support_ = support[xp.argsort(codes[support], kind="stable")]
        self.support_vectors_ = X[self.support_]
        support_codes = codes[self.support_]
        self.n_support_ = xp.bincount(support_codes, minlength=len(self.classes_))
        position = xp.full(len(X), -1)
        position[self.support_] = xp.arange(len(self.support_))
        self._pair_coef = xp.zeros((len(self.support_), len(solved)))
        self.dual_coef_ = xp.zeros((len(self.classes_) - 1, len(self.support_)))
        for p, ((a, b), (members, labels, result)) in enumerate(zip(self._pairs, solved)):
            nonzero = result.alpha > 0
            self._pair_coef[position[members[nonzero]], p] = (result.alpha * labels)[nonzero]
            for code, row in ((a, b - 1), (b, a)):
                in_class = support_codes == code
                self.dual_coef_[row, in_class] = self._pair_coef[in_class, p]
        self._pair_bias = xp.asarray(np.array([result.bias for _, _, result in solved]))
        self.n_iter_ = np.array([result.n_iter for _, _, result in solved])
        self.dual_objective_ = np.array([result.objective for _, _, result in solved])
        sign = -1.0 if len(self.classes_) == 2 else 1.0
        self.dual_coef_ *= sign
        self.intercept_ = sign * self._pair_bias

    def _pair_decisions(self, X):
        if not hasattr(self, "support_"):
            raise InputError("this SVC is not fitted yet; call fit first")
        X = check_samples(X)
        if X.shape[1] != self.support_vectors_.shape[1]:
            raise InputError(f"X has {X.shape[1]} features, the model was fitted with {self.support_vectors_.shape[1]}")
        return kernel_product(self.kernel_, X, self.support_vectors_, self._pair_coef) + self._pair_bias

    def decision_function(self, X):
        """Binary: shape (n,), positive for ``classes_[1]``; multiclass: one-vs-one values, shape
        (n, k (k - 1) / 2), positive for the first class of each pair (``decision_function_shape="ovo"``)."""
        values = self._pair_decisions(X)
        return -values[:, 0] if len(self.classes_) == 2 else values

    def predict(self, X):
        """Class of each sample by one-vs-one voting (ties go to the lower class, as LIBSVM)."""
        values = self._pair_decisions(X)
        votes = array_module(values).zeros((len(values), len(self.classes_)), dtype=np.int64)
        for p, (a, b) in enumerate(self._pairs):
            wins = values[:, p] > 0
            votes[:, a] += wins
            votes[:, b] += ~wins
        return self.classes_[votes.argmax(axis=1)]

    def score(self, X, y):
        """Mean accuracy of `predict` on ``X`` against ``y``."""
        predictions = self.predict(X)
        return float((predictions == array_module(predictions).asarray(y)).mean())
