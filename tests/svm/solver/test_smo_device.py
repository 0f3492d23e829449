"""The SMO solver, kernel cache and SVC on the simulated device: the NumPy path's results, in device arrays."""
import numpy as np
import pytest

from fake_device import fake_device_backend
from svm.solver import gram
from svm.solver.gram import KernelRowCache, kernel_product, make_kernel
from svm.solver.smo import smo_solve
from svm.solver.svc import SVC

datasets = pytest.importorskip("sklearn.datasets")


@pytest.fixture
def device():
    return fake_device_backend()


def problem(n=240, d=6, seed=3):
    X, y = datasets.make_classification(n_samples=n, n_features=d, n_informative=4, flip_y=0.05, random_state=seed)
    return (X - X.mean(axis=0)) / X.std(axis=0), np.where(y == 1, 1.0, -1.0)


@pytest.mark.parametrize("options", [
    dict(kernel="rbf", C=10.0), dict(kernel="rbf", C=10.0, shrinking=False), dict(kernel="linear", C=0.5),
    dict(kernel="poly", C=2.0, coef0=1.0, degree=2), dict(kernel="sigmoid", C=0.3, coef0=0.0),
    dict(kernel="rbf", C=10.0, cache_bytes=3 * 240 * 8), dict(kernel="rbf", C=10.0, warm=True)])
def test_smo_solve_on_the_device_gives_the_numpy_iterates(device, monkeypatch, options):
    monkeypatch.setattr(gram, "BATCH_BYTES", 0)  # batched misses (the candidates' rows) at this small size
    X, y = problem()
    options = dict(options)
    kernel = make_kernel(options.pop("kernel"), X, "scale", options.pop("coef0", 0.0), options.pop("degree", 3))
    if options.pop("warm", False):
        options["alpha0"] = smo_solve(X[:120], y[:120], kernel, options["C"]).alpha.tolist() + [0.0] * 120
    host = smo_solve(X, y, kernel, **options)
    if "alpha0" in options:
        options["alpha0"] = device.from_host(np.array(options["alpha0"]))
    on_device = smo_solve(device.from_host(X), device.from_host(y), kernel, **options)
    assert device.is_device_array(on_device.alpha)
    assert np.array_equal(device.to_host(on_device.alpha), host.alpha)
    assert (on_device.bias, on_device.n_iter, on_device.objective, on_device.converged) == \
        (host.bias, host.n_iter, host.objective, host.converged)
    assert host.n_iter > 240 or kernel.name != "rbf"  # past a shrinking round


def test_kernel_product_and_widened_cache_rows_on_the_device(device):
    X, _ = problem(n=50)
    kernel = make_kernel("rbf", X)
    coef = np.linspace(-1, 1, 20)
    product = kernel_product(kernel, device.from_host(X), device.from_host(X[:20]), device.from_host(coef),
                             block_bytes=8 * 20 * 7)
    assert device.is_device_array(product)
    np.testing.assert_allclose(device.to_host(product), kernel.block(X, X[:20]) @ coef, rtol=1e-12)
    caches = [KernelRowCache(kernel, data, 10**6) for data in (X, device.from_host(X))]
    columns, keep = np.arange(0, 50, 3), np.zeros(50, dtype=bool)
    keep[::3] = True
    for cache, mask in zip(caches, (keep, device.from_host(keep))):
        cache.row(4)
        cache.set_columns(np.arange(50))
        cache.row(7)
        cache.set_columns(columns, mask)  # shrinking: the cached rows are sliced on their device
    widened = [cache.widen(np.array([1, 4]), np.array([0.5, -2.0])) for cache in caches]
    assert device.is_device_array(widened[1]) and device.is_device_array(caches[1].row(7))
    assert np.array_equal(device.to_host(widened[1]), widened[0])
    assert np.array_equal(device.to_host(caches[1].row(7)), caches[0].row(7))


@pytest.mark.parametrize("n_classes", [2, 4])
def test_svc_on_the_device_keeps_its_model_there_and_predicts_as_on_the_host(device, n_classes):
    X, y = datasets.load_digits(n_class=n_classes, return_X_y=True)
    X, y = X[:301] / 16.0, y[:301]
    host = SVC(C=2.0).fit(X, y)
    fitted = SVC(C=2.0).fit(device.from_host(X), device.from_host(y))
    predictions = fitted.predict(device.from_host(X[::2]))
    for array in (fitted.support_vectors_, fitted.dual_coef_, fitted.intercept_, fitted.classes_, predictions):
        assert device.is_device_array(array)
    assert np.array_equal(device.to_host(predictions), host.predict(X[::2]))
    for name in ("support_", "dual_coef_", "intercept_", "n_support_"):
        assert np.array_equal(device.to_host(getattr(fitted, name)), getattr(host, name)), name
    assert fitted.score(device.from_host(X), device.from_host(y)) == host.score(X, y)


def test_an_smo_iteration_on_the_device_is_nine_launches_and_two_reads(device):
    """Counted on the simulated device (`fake_device.FakeCupy.counts`) over iterations whose kernel rows are
    cached: the selection's reductions, the fused gain and the fused update of the pair (25 launches before)."""
    from svm.solver.smo import _Solver

    X, y = problem(n=120)
    xp = device.xp
    solver = _Solver(xp.asarray(X), xp.asarray(y), make_kernel("rbf", X), 10.0, 1e-9, xp.zeros(120), 10**8, False)
    counts = []
    for _ in range(80):
        misses, before = solver.cache.misses, dict(xp.counts)
        solver.update(*solver.select())
        if solver.cache.misses == misses:
            counts.append((xp.counts["launches"] - before.get("launches", 0),
                           xp.counts["host_reads"] - before.get("host_reads", 0)))
    assert len(counts) > 20 and set(counts) == {(9, 2)}
