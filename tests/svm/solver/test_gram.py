"""Kernels, blocked kernel products and the kernel-row cache (svm/solver/gram.py)."""
import numpy as np
import pytest

from kernels.errors import InputError
from svm.solver import gram
from svm.solver.gram import KernelRowCache, kernel_product, make_kernel, resolve_gamma

RNG = np.random.default_rng(7)
A = RNG.standard_normal((9, 4))
B = RNG.standard_normal((13, 4))


def elementwise(name, a, b, gamma=0.3, coef0=0.5, degree=3):
    """One kernel value from its definition."""
    if name == "linear":
        return a @ b
    if name == "poly":
        return (gamma * (a @ b) + coef0) ** degree
    if name == "rbf":
        return np.exp(-gamma * np.sum((a - b) ** 2))
    return np.tanh(gamma * (a @ b) + coef0)


@pytest.mark.parametrize("name", ["linear", "poly", "rbf", "sigmoid"])
def test_block_and_diagonal_match_the_definitions(name):
    kernel = make_kernel(name, A, gamma=0.3, coef0=0.5, degree=3)
    expected = np.array([[elementwise(name, a, b) for b in B] for a in A])
    np.testing.assert_allclose(kernel.block(A, B), expected, rtol=1e-12, atol=1e-12)
    diagonal = [elementwise(name, a, a) for a in A]
    np.testing.assert_allclose(kernel.diagonal(A), diagonal, rtol=1e-12, atol=1e-12)


def test_kernels_match_scikit_learn():
    pairwise = pytest.importorskip("sklearn.metrics.pairwise")
    expected = {
        "linear": pairwise.linear_kernel(A, B),
        "poly": pairwise.polynomial_kernel(A, B, degree=2, gamma=0.3, coef0=1.0),
        "rbf": pairwise.rbf_kernel(A, B, gamma=0.3),
        "sigmoid": pairwise.sigmoid_kernel(A, B, gamma=0.3, coef0=1.0),
    }
    for name, values in expected.items():
        kernel = make_kernel(name, A, gamma=0.3, coef0=1.0, degree=2)
        np.testing.assert_allclose(kernel.block(A, B), values, rtol=1e-12, atol=1e-12)


def test_gamma_scale_and_auto_follow_scikit_learn():
    X = 3.0 * A + 1.0
    assert resolve_gamma("scale", X) == pytest.approx(1.0 / (4 * X.var()))
    assert resolve_gamma("auto", X) == 0.25
    assert resolve_gamma("scale", np.ones((3, 2))) == 1.0
    assert resolve_gamma(2, X) == 2.0


@pytest.mark.parametrize("args", [
    ("gauss", {}), ("rbf", {"gamma": 0.0}), ("rbf", {"gamma": -1.0}), ("rbf", {"gamma": "wide"}),
    ("poly", {"degree": -1}), ("poly", {"degree": 2.5}), ("sigmoid", {"coef0": np.nan}),
])
def test_bad_kernel_parameters_raise(args):
    name, options = args
    with pytest.raises(InputError):
        make_kernel(name, A, **options)


@pytest.mark.parametrize("coef_shape", [(13,), (13, 3)])
def test_kernel_product_in_small_blocks_equals_the_full_product(coef_shape):
    kernel = make_kernel("rbf", A, gamma=0.2)
    coef = RNG.standard_normal(coef_shape)
    full = kernel.block(A, B) @ coef
    np.testing.assert_allclose(kernel_product(kernel, A, B, coef, block_bytes=3 * 13 * 8), full, rtol=1e-13)
    np.testing.assert_allclose(kernel_product(kernel, A, B, coef, block_bytes=1), full, rtol=1e-13)
    assert kernel_product(kernel, A, B[:0], coef[:0]).shape == (9,) + coef_shape[1:]


def test_cache_rows_are_kernel_rows_and_respect_the_byte_bound():
    kernel = make_kernel("rbf", B, gamma=0.2)
    full = kernel.block(B, B)
    cache = KernelRowCache(kernel, B, max_bytes=3 * 13 * 8 + 7)
    for index in RNG.integers(0, 13, size=60):
        np.testing.assert_allclose(cache.row(index), full[index], rtol=1e-13)
        assert cache.nbytes <= cache.max_bytes
    assert len(cache._rows) == 3


def test_cache_evicts_the_least_recently_used_row():
    kernel = make_kernel("linear", B)
    cache = KernelRowCache(kernel, B, max_bytes=2 * 13 * 8)
    cache.row(0), cache.row(1), cache.row(0), cache.row(2)
    assert cache.misses == 3
    cache.row(0)
    assert cache.misses == 3
    cache.row(1)
    assert cache.misses == 4


def test_a_forgotten_row_is_computed_again_and_frees_its_bytes():
    kernel = make_kernel("linear", B)
    cache = KernelRowCache(kernel, B, max_bytes=3 * 13 * 8)
    cache.row(0), cache.row(1)
    cache.forget(0), cache.forget(5)  # 5 was never cached: nothing to drop
    assert cache.nbytes == 13 * 8 and cache.misses == 2
    np.testing.assert_allclose(cache.row(0), kernel.block(B, B)[0])
    assert cache.misses == 3 and cache.row(1) is not None and cache.misses == 3


def test_cache_smaller_than_a_row_keeps_nothing_but_still_answers():
    kernel = make_kernel("linear", B)
    cache = KernelRowCache(kernel, B, max_bytes=8)
    np.testing.assert_allclose(cache.row(4), kernel.block(B, B)[4])
    assert cache.nbytes == 0


def test_cache_columns_narrow_by_slicing_and_reset_to_all():
    kernel = make_kernel("poly", B, gamma=0.5, coef0=1.0)
    full = kernel.block(B, B)
    cache = KernelRowCache(kernel, B, max_bytes=10**6)
    cache.row(2), cache.row(5)
    keep = np.ones(13, dtype=bool)
    keep[[1, 2, 8]] = False
    columns = np.flatnonzero(keep)
    cache.set_columns(columns, keep)
    assert set(cache._rows) == {5} and cache.nbytes == 10 * 8
    np.testing.assert_allclose(cache.row(5), full[5, columns])
    np.testing.assert_allclose(cache.row(7), full[7, columns])
    cache.set_columns(None)
    assert cache.nbytes == 0
    np.testing.assert_allclose(cache.row(7), full[7])


def test_a_miss_computes_the_candidates_rows_in_the_same_product(monkeypatch):
    monkeypatch.setattr(gram, "BATCH_BYTES", 0)
    kernel = make_kernel("rbf", B, gamma=0.2)
    full = kernel.block(B, B)
    cache = KernelRowCache(kernel, B, max_bytes=12 * 13 * 8, block_rows=3)  # room 12: a quarter is 3 rows
    asked = []
    row = cache.row(4, lambda: asked.append(1) or [4, 9, 2, 7])
    np.testing.assert_allclose(row, full[4], rtol=1e-13)
    assert asked == [1] and cache.misses == 1 and list(cache._rows) == [2, 9, 4]  # asked-for row most recent
    for index in (9, 2, 4):
        np.testing.assert_allclose(cache.row(index, lambda: asked.append(2) or [0]), full[index], rtol=1e-13)
    assert asked == [1] and cache.misses == 1  # hits do not ask for candidates
    cache.row(7, lambda: [9, 0, 1])  # cached candidates are skipped
    assert set(cache._rows) == {0, 1, 2, 4, 7, 9} and cache.nbytes == 6 * 13 * 8


@pytest.mark.parametrize("room, batch_bytes", [(7, 0), (100, 13 * 4 * 8 + 1)])
def test_candidates_are_ignored_for_a_small_cache_or_small_columns(monkeypatch, room, batch_bytes):
    monkeypatch.setattr(gram, "BATCH_BYTES", batch_bytes)
    cache = KernelRowCache(make_kernel("linear", B), B, max_bytes=room * 13 * 8)
    cache.row(3, lambda: [5, 6])
    assert list(cache._rows) == [3] and cache.misses == 1


@pytest.mark.parametrize("room", [13, 2])
def test_widen_completes_cached_rows_and_returns_the_product_on_the_new_columns(room):
    kernel = make_kernel("rbf", B, gamma=0.3)
    full = kernel.block(B, B)
    cache = KernelRowCache(kernel, B, max_bytes=room * 13 * 8, block_rows=1)
    cache.row(2), cache.row(5), cache.row(6)
    keep = np.ones(13, dtype=bool)
    keep[[1, 3, 8, 12]] = False
    cache.set_columns(np.flatnonzero(keep), keep)
    rows, coef = np.array([0, 5, 11]), np.array([0.5, -1.0, 2.0])
    product = cache.widen(rows, coef, block_bytes=8)
    np.testing.assert_allclose(product, full[[1, 3, 8, 12]][:, rows] @ coef, rtol=1e-13)
    assert cache.columns is None and list(cache._rows) == [2, 5, 6][-room:]  # the most recent that fit
    assert cache.nbytes == len(cache._rows) * 13 * 8
    for index in list(cache._rows):
        np.testing.assert_allclose(cache.row(index), full[index], rtol=1e-13)
    assert cache.misses == 3
    assert cache.widen(rows, coef).shape == (0,)  # already spanning all samples
