"""SMO solver and SVC estimator against scikit-learn's LIBSVM (svm/solver/smo.py)."""
import numpy as np
import pytest

from kernels.errors import InputError
from svm.solver import gram
from svm.solver.gram import KernelRowCache, make_kernel
from svm.solver.smo import ConvergenceWarning, bias_from_parts, bias_parts, pair_step, smo_solve
from svm.solver.svc import SVC

sklearn_svm = pytest.importorskip("sklearn.svm")
datasets = pytest.importorskip("sklearn.datasets")


def standardised(X):
    return (X - X.mean(axis=0)) / X.std(axis=0)


def breast_cancer():
    X, y = datasets.load_breast_cancer(return_X_y=True)
    return standardised(X), y


def synthetic():
    X, y = datasets.make_classification(n_samples=240, n_features=6, n_informative=4, flip_y=0.05,
                                        random_state=3)
    return standardised(X), np.where(y == 1, "yes", "no")


def digits(n_classes):
    X, y = datasets.load_digits(return_X_y=True)
    keep = y < n_classes
    return X[keep] / 16.0, y[keep]


def dual_objective(model, kernel):
    """``1/2 c^T K c - sum |c|`` from a binary model's ``dual_coef_`` and support vectors."""
    coef, sv = model.dual_coef_[0], model.support_vectors_
    return 0.5 * coef @ kernel.block(sv, sv) @ coef - np.abs(coef).sum()


def fit_both(X, y, **options):
    return SVC(**options).fit(X, y), sklearn_svm.SVC(**options).fit(X, y)


def assert_models_agree(ours, reference, X, sample_of=lambda index: index):
    """Objectives, decision values, predictions and (up to ``sample_of``) support sets agree."""
    assert ours.dual_objective_[0] == pytest.approx(dual_objective(reference, ours.kernel_), rel=1e-3)
    assert ours.dual_objective_[0] == pytest.approx(dual_objective(ours, ours.kernel_), rel=1e-9)
    np.testing.assert_allclose(ours.decision_function(X), reference.decision_function(X), atol=1e-2)
    assert np.mean(ours.predict(X) == reference.predict(X)) >= 0.99
    mismatched = len(set(sample_of(ours.support_)) ^ set(sample_of(reference.support_)))
    assert mismatched <= max(2, 0.02 * len(reference.support_))


@pytest.mark.parametrize("data", [breast_cancer, synthetic])
@pytest.mark.parametrize("options", [
    {"kernel": "linear"},
    {"kernel": "poly", "degree": 3, "coef0": 1.0, "gamma": "scale"},
    {"kernel": "rbf", "gamma": "scale"},
    {"kernel": "rbf", "gamma": "auto", "C": 10.0},
    {"kernel": "sigmoid", "gamma": 0.01, "coef0": 0.0},
])
def test_binary_svc_matches_libsvm(data, options):
    X, y = data()
    ours, reference = fit_both(X, y, tol=1e-3, **options)
    assert_models_agree(ours, reference, X)
    np.testing.assert_array_equal(ours.classes_, reference.classes_)


def test_bias_without_free_support_vectors_is_the_midpoint_of_the_bounds():
    X, y = breast_cancer()
    ours, reference = fit_both(X, y, C=1e-3)
    alpha = np.abs(ours.dual_coef_[0])
    assert np.all(alpha == 1e-3)
    assert ours.intercept_[0] == pytest.approx(reference.intercept_[0], abs=1e-8)
    np.testing.assert_allclose(ours.decision_function(X), reference.decision_function(X), atol=1e-8)


def test_duplicated_samples_take_the_tau_step():
    X, y = synthetic()
    X, y = np.vstack([X[:60], X[:60]]), np.concatenate([y[:60], y[:60]])
    ours, reference = fit_both(X, y, kernel="linear", C=2.0)
    # Copies may share their alpha in any way: compare support sets of distinct samples.
    assert_models_agree(ours, reference, X, sample_of=lambda index: index % 60)


def test_multiclass_one_vs_one_matches_libsvm():
    X, y = digits(5)
    order = np.random.default_rng(0).permutation(len(X))
    train, test = order[:600], order[600:]
    ours = SVC(C=1.0).fit(X[train], y[train])
    reference = sklearn_svm.SVC(C=1.0, decision_function_shape="ovo").fit(X[train], y[train])
    assert abs(ours.score(X[test], y[test]) - reference.score(X[test], y[test])) <= 0.01
    assert ours.dual_coef_.shape == (4, len(ours.support_)) and ours.intercept_.shape == (10,)
    np.testing.assert_array_equal(ours.n_support_.sum(), len(ours.support_))
    np.testing.assert_allclose(ours.decision_function(X[test]), reference.decision_function(X[test]), atol=1e-2)
    np.testing.assert_allclose(ours.intercept_, reference.intercept_, atol=1e-2)
    common, in_ours, in_reference = np.intersect1d(ours.support_, reference.support_, return_indices=True)
    assert len(common) >= 0.98 * len(reference.support_)
    np.testing.assert_allclose(ours.dual_coef_[:, in_ours], reference.dual_coef_[:, in_reference], atol=5e-2)
    assert np.mean(ours.predict(X[test]) == reference.predict(X[test])) >= 0.99


def test_a_tiny_cache_gives_the_same_solution(monkeypatch):
    X, y = breast_cancer()
    largest = []
    row = KernelRowCache.row

    def watched_row(cache, index, candidates=None):
        largest.append(cache.nbytes)
        return row(cache, index, candidates)

    monkeypatch.setattr(KernelRowCache, "row", watched_row)
    tiny = SVC(cache_bytes=3 * len(X) * 8).fit(X, y)
    assert max(largest) <= 3 * len(X) * 8
    roomy = SVC().fit(X, y)
    assert len(largest) > 0
    np.testing.assert_allclose(tiny.decision_function(X), roomy.decision_function(X), atol=1e-10)
    np.testing.assert_array_equal(tiny.support_, roomy.support_)


def test_shrinking_gives_the_same_solution(monkeypatch):
    X, y = breast_cancer()
    narrowed = []
    set_columns = KernelRowCache.set_columns

    def watched_set_columns(cache, columns, keep=None):
        narrowed.append(columns is not None)
        set_columns(cache, columns, keep)

    monkeypatch.setattr(KernelRowCache, "set_columns", watched_set_columns)
    shrunk = SVC(kernel="linear", shrinking=True).fit(X, y)
    assert any(narrowed)
    narrowed.clear()
    plain = SVC(kernel="linear", shrinking=False).fit(X, y)
    assert not any(narrowed)
    assert shrunk.dual_objective_[0] == pytest.approx(plain.dual_objective_[0], rel=1e-6)
    np.testing.assert_allclose(shrunk.decision_function(X), plain.decision_function(X), atol=1e-3)


def binary_problem():
    X, y = breast_cancer()
    return X, np.where(y == 1, 1.0, -1.0), make_kernel("rbf", X)


def test_iteration_cap_warns_and_reports_no_convergence():
    X, y, kernel = binary_problem()
    with pytest.warns(ConvergenceWarning):
        result = smo_solve(X, y, kernel, max_iter=5)
    assert result.n_iter == 5 and not result.converged and result.gap >= 1e-3
    with pytest.warns(ConvergenceWarning):
        SVC(max_iter=3).fit(X, y)


def test_warm_start_from_the_optimum_converges_at_once():
    X, y, kernel = binary_problem()
    cold = smo_solve(X, y, kernel, C=1.0, tol=1e-3)
    assert cold.converged and cold.gap < 1e-3 and cold.n_iter > 50
    warm = smo_solve(X, y, kernel, C=1.0, tol=1e-3, alpha0=cold.alpha)
    assert warm.n_iter == 0 and warm.objective == pytest.approx(cold.objective, rel=1e-12)
    tighter_cold = smo_solve(X, y, kernel, C=1.0, tol=1e-6)
    tighter_warm = smo_solve(X, y, kernel, C=1.0, tol=1e-6, alpha0=cold.alpha)
    assert tighter_warm.n_iter < tighter_cold.n_iter / 2
    assert tighter_warm.objective == pytest.approx(tighter_cold.objective, rel=1e-8)


def test_warm_start_from_libsvm_alphas_takes_few_iterations():
    X, y, kernel = binary_problem()
    reference = sklearn_svm.SVC(C=1.0, gamma=kernel.gamma).fit(X, y)
    alpha0 = np.zeros(len(X))
    alpha0[reference.support_] = np.abs(reference.dual_coef_[0])
    assert smo_solve(X, y, kernel, alpha0=alpha0).n_iter <= 20


def test_shrinking_an_already_optimal_problem_keeps_it_solvable():
    # Converged without free alphas exactly when the first shrink is due: every sample may be dropped.
    X = np.array([[-1.180287168610006, -0.1824629586733057], [0.2284003802819511, 0.30502727017687825],
                  [0.7260538568577324, -0.18398931324383955], [0.7828660934309424, 1.0807990944695796],
                  [-1.426584420925927, -1.021914431192849], [0.4358584988910191, -1.204917391921295]])
    y = np.array([1.0, 1.0, -1.0, -1.0, -1.0, -1.0])
    kernel, C = make_kernel("linear", X), 0.03252918031281204
    plain = smo_solve(X, y, kernel, C=C, shrinking=False)
    shrunk = smo_solve(X, y, kernel, C=C, shrinking=True)
    assert plain.n_iter == len(X) and shrunk.converged
    np.testing.assert_array_equal(shrunk.alpha, plain.alpha)


def moons(n=100, noise=0.1, seed=0):
    X, y = datasets.make_moons(n, noise=noise, random_state=seed)
    return X, np.where(y == 1, 1.0, -1.0), make_kernel("rbf", X, gamma=2.0)


@pytest.mark.parametrize("below", [lambda C: np.nextafter(C, 0.0), lambda C: C * (1 - 1e-13)])
def test_warm_start_an_ulp_below_C_keeps_the_bias_of_the_optimum(below):
    X, y, kernel = moons()
    cold = smo_solve(X, y, kernel, C=0.01)
    assert (cold.alpha == 0.01).all()  # no free alpha: the bias is the midpoint of [M, m]
    reference = sklearn_svm.SVC(C=0.01, gamma=2.0).fit(X, y)
    assert cold.bias == pytest.approx(reference.intercept_[0], abs=1e-9)
    alpha0 = cold.alpha.copy()
    alpha0[7] = below(0.01)
    warm = smo_solve(X, y, kernel, C=0.01, alpha0=alpha0)
    assert warm.n_iter == 0 and (warm.alpha == 0.01).all()
    assert warm.bias == pytest.approx(cold.bias, abs=1e-12)


@pytest.mark.parametrize("signs", [(1.0, 1.0), (-1.0, -1.0), (1.0, -1.0), (-1.0, 1.0)])
def test_a_pair_step_that_rounds_next_to_a_bound_lands_on_it(signs):
    C, yi, yj = 0.01, *signs
    a_j = 0.003 if yj > 0 else C - 0.003  # room_j = 0.003: the step is clipped to it
    a_i = np.nextafter(C - 0.003, C) if yi > 0 else np.nextafter(0.003, 0.0)  # room_i one ulp above room_j
    step, new_i, new_j = pair_step(C, yi, yj, a_i, a_j, F_i=5.0, F_j=-5.0, curvature=1.0)
    assert step == pytest.approx(0.003)
    assert new_i == (C if yi > 0 else 0.0) and new_j == (0.0 if yj > 0 else C)
    _, free_i, _ = pair_step(C, yi, yj, 0.004, 0.005, F_i=0.0011, F_j=0.001, curvature=1.0)
    assert free_i == pytest.approx(0.004 + yi * 1e-4)  # small steps stay free


def test_bias_parts_of_blocks_combine_to_the_bias_of_the_whole():
    X, y, kernel = moons(n=97, noise=0.3, seed=4)
    for C in (0.01, 1.0):
        result = smo_solve(X, y, kernel, C=C)
        F = y - kernel.block(X, X) @ (result.alpha * y)
        blocks = [slice(0, 0), slice(0, 40), slice(40, 41), slice(41, 97)]
        parts = np.array([bias_parts(F[b], result.alpha[b], y[b], C) for b in blocks])
        assert bias_from_parts(parts) == pytest.approx(result.bias, abs=1e-9)
        np.testing.assert_array_equal(parts[0], [0.0, 0.0, -np.inf, np.inf])


def test_one_class_gives_zero_alphas_and_that_class_as_bias():
    X, _, kernel = binary_problem()
    result = smo_solve(X[:50], -np.ones(50), kernel)
    assert result.converged and not result.alpha.any() and result.bias == -1.0


def test_string_labels_and_parameters_round_trip():
    X, y = synthetic()
    model = SVC(kernel="poly", degree=2).set_params(C=3.0)
    assert model.get_params()["C"] == 3.0 and model.get_params()["degree"] == 2
    assert set(model.fit(X, y).predict(X)) == {"yes", "no"}
    reference = sklearn_svm.SVC(kernel="poly", degree=2, C=3.0).fit(X, y)
    assert model.score(X, y) == pytest.approx(reference.score(X, y), abs=0.01)
    with pytest.raises(InputError):
        model.set_params(nu=0.5)


@pytest.mark.parametrize("change", ["nan", "inf", "one_class", "kernel", "C_zero", "C_negative", "C_text",
                                    "tol", "max_iter", "gamma", "labels_length", "empty"])
def test_bad_svc_input_raises(change):
    X, y = synthetic()
    options = {}
    if change in ("nan", "inf"):
        X = X.copy()
        X[3, 1] = np.nan if change == "nan" else np.inf
    y = {"one_class": np.full(len(y), "no"), "labels_length": y[:-1]}.get(change, y)
    X = X[:0] if change == "empty" else X
    options = {"kernel": {"kernel": "gaussian"}, "C_zero": {"C": 0.0}, "C_negative": {"C": -1.0},
               "C_text": {"C": "1"}, "tol": {"tol": 0.0}, "max_iter": {"max_iter": 0},
               "gamma": {"gamma": -0.1}}.get(change, options)
    with pytest.raises(InputError):
        SVC(**options).fit(X, y)


def test_bad_solver_and_prediction_input_raises():
    X, y, kernel = binary_problem()
    with pytest.raises(InputError):
        smo_solve(X, (y > 0).astype(float), kernel)
    with pytest.raises(InputError):
        smo_solve(X, y, kernel, alpha0=np.full(len(X), 0.5) * (y > 0))
    with pytest.raises(InputError):
        smo_solve(X, y, kernel, alpha0=np.full(len(X), 2.0))
    with pytest.raises(InputError):
        SVC().predict(X)
    model = SVC().fit(X, y)
    with pytest.raises(InputError):
        model.predict(X[:, :5])
    with pytest.raises(InputError):
        model.decision_function(np.full_like(X, np.nan))


def test_rows_in_blocks_give_the_solution_of_one_row_per_product_and_of_libsvm(monkeypatch):
    # Data no other test uses; one row per product is the solver before rows were blocked.
    X, y = datasets.make_classification(n_samples=700, n_features=20, n_informative=8, flip_y=0.08,
                                        class_sep=0.7, random_state=11)
    X = standardised(X)
    monkeypatch.setattr(gram, "BATCH_BYTES", 0)
    blocked, reference = fit_both(X, y, C=2.0, gamma="scale")
    assert_models_agree(blocked, reference, X)
    monkeypatch.setattr(KernelRowCache.__init__, "__defaults__", (1,))
    single = SVC(C=2.0, gamma="scale").fit(X, y)
    assert single.n_iter_[0] == blocked.n_iter_[0]
    np.testing.assert_array_equal(single.support_, blocked.support_)
    np.testing.assert_allclose(single.dual_coef_, blocked.dual_coef_, rtol=0, atol=1e-10)
    assert single.dual_objective_[0] == pytest.approx(blocked.dual_objective_[0], rel=1e-12)


def test_unshrinking_keeps_the_cached_rows(monkeypatch):
    X, y = datasets.make_classification(n_samples=1500, n_features=10, flip_y=0.2, random_state=5)
    X, y = standardised(X), np.where(y == 1, 1.0, -1.0)
    kernel = make_kernel("rbf", X)
    inserted, widened = [], []
    insert, widen = KernelRowCache._insert, KernelRowCache.widen

    def watched_insert(cache, index, row):
        inserted.append(index)
        insert(cache, index, row)

    def watched_widen(cache, rows, coef):
        widened.append(len(cache._rows))
        return widen(cache, rows, coef)

    monkeypatch.setattr(KernelRowCache, "_insert", watched_insert)
    monkeypatch.setattr(KernelRowCache, "widen", watched_widen)
    result = smo_solve(X, y, kernel, C=1.0, tol=1e-3)
    assert widened and max(widened) > 0  # unshrunk with rows cached, which are kept ...
    assert len(inserted) == len(set(inserted))  # ... so no row is computed twice
    plain = smo_solve(X, y, kernel, C=1.0, tol=1e-3, shrinking=False)
    assert result.objective == pytest.approx(plain.objective, rel=1e-6)
