"""Binary data sets of svm/datasets.py: splits, labels, scaling, svmlight files, synthetic data, errors."""
import numpy as np
import pytest

from kernels.errors import InputError
from svm.datasets import load_dataset, make_synthetic

pytest.importorskip("sklearn")


def assert_split(parts, n_train, n_test, n_features):
    X_train, X_test, y_train, y_test = parts
    assert X_train.shape == (n_train, n_features) and X_test.shape == (n_test, n_features)
    assert y_train.shape == (n_train,) and y_test.shape == (n_test,)
    assert X_train.dtype == X_test.dtype == np.float64
    assert np.isfinite(X_train).all() and np.isfinite(X_test).all()


@pytest.mark.parametrize("name, n_train, n_test, n_features", [
    ("digits", 1438, 359, 64), ("mnist", 4000, 1000, 784)])
def test_images_are_odd_against_even_in_unit_range(name, n_train, n_test, n_features):
    parts = load_dataset(name)
    assert_split(parts, n_train, n_test, n_features)
    X_train, X_test, y_train, y_test = parts
    assert set(np.unique(y_train)) == set(np.unique(y_test)) == {0, 1}
    assert 0.4 < y_train.mean() < 0.6
    assert X_train.min() == 0.0 and X_train.max() == 1.0 and 0 <= X_test.min() <= X_test.max() <= 1


def test_breast_cancer_is_standardised_on_the_training_part():
    X_train, X_test, y_train, _ = load_dataset("breast_cancer", n=300, seed=4)
    assert X_train.shape == (300, 30) and len(X_test) == 114
    np.testing.assert_allclose(X_train.mean(axis=0), 0, atol=1e-12)
    np.testing.assert_allclose(X_train.std(axis=0), 1, rtol=1e-12)
    assert abs(X_test.mean()) > 1e-6  # scaled with the training statistics, not its own
    assert set(np.unique(y_train)) == {0, 1}


def test_n_takes_a_prefix_of_the_training_part_and_keeps_the_test_part():
    full = load_dataset("digits", seed=2)
    part = load_dataset("digits", n=101, seed=2)
    np.testing.assert_array_equal(part[0], full[0][:101])
    np.testing.assert_array_equal(part[2], full[2][:101])
    np.testing.assert_array_equal(part[1], full[1])
    other_seed = load_dataset("digits", n=101, seed=3)
    assert not np.array_equal(other_seed[0], part[0])


def test_synthetic_is_seeded_standardised_and_sized_by_n():
    parts = load_dataset("synthetic", n=401, seed=7, n_features=9)
    assert_split(parts, 401, 100, 9)
    again = load_dataset("synthetic", n=401, seed=7, n_features=9)
    for first, second in zip(parts, again):
        np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(parts[0].mean(axis=0), 0, atol=1e-12)
    assert set(np.unique(parts[2])) == {0, 1}
    X, y = make_synthetic(50, 4, seed=1)
    assert X.shape == (50, 4) and y.dtype == np.int64
    assert not np.array_equal(make_synthetic(50, 4, seed=2)[0], X)


def test_moons_are_seeded_standardised_two_dimensional_and_not_linearly_separable():
    X_train, X_test, y_train, y_test = parts = load_dataset("moons", n=301, seed=4)
    assert_split(parts, 301, 75, 2)
    for first, second in zip(parts, load_dataset("moons", n=301, seed=4)):
        np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(X_train.mean(axis=0), 0, atol=1e-12)
    assert set(np.unique(y_train)) == {0, 1} and y_train.dtype == np.int64
    from sklearn.svm import SVC as SklearnSVC

    linear = SklearnSVC(kernel="linear").fit(X_train, y_train).score(X_test, y_test)
    rbf = SklearnSVC(kernel="rbf").fit(X_train, y_train).score(X_test, y_test)
    assert rbf >= linear + 0.03
    with pytest.raises(InputError, match="moons data set needs n"):
        load_dataset("moons")


def test_svmlight_file_is_read_densely_with_its_labels(tmp_path):
    rng = np.random.default_rng(0)
    X = np.round(rng.normal(size=(30, 5)), 3)
    X[X < 0] = 0.0  # sparse rows, as LIBSVM files are
    y = np.where(np.arange(30) % 3 == 0, 1, -1)
    path = tmp_path / "small.svm"
    path.write_text("".join(
        f"{label} " + " ".join(f"{j + 1}:{value}" for j, value in enumerate(row) if value) + "\n"
        for label, row in zip(y, X)))
    X_train, X_test, y_train, y_test = load_dataset(str(path), seed=1)
    assert len(X_train) == 24 and len(X_test) == 6
    loaded = np.vstack((X_train, X_test))
    labels = np.concatenate((y_train, y_test))
    order = np.lexsort(loaded.T[::-1])
    expected = np.lexsort(X.T[::-1])
    np.testing.assert_array_equal(loaded[order], X[expected])  # used as given: no scaling
    np.testing.assert_array_equal(labels[order], y[expected])


@pytest.mark.parametrize("args, message", [
    (("nosuch",), "unknown data set 'nosuch'"),
    (("synthetic",), "needs n"),
    (("breast_cancer", 456), "has 455 training samples"),
    (("digits", 0), "positive number"),
])
def test_bad_requests_are_input_errors(args, message):
    with pytest.raises(InputError, match=message):
        load_dataset(*args)


def test_malformed_svmlight_file_is_an_input_error(tmp_path):
    path = tmp_path / "broken.svm"
    path.write_text("1 1:0.5 2:oops\n")
    with pytest.raises(InputError, match="cannot read svmlight file"):
        load_dataset(str(path))


@pytest.mark.parametrize("text, message", [
    ("1 1:nan 2:1\n-1 1:2\n1 1:3\n-1 2:1\n", r"feature value nan in sample 1"),
    ("1 1:1\n-1 1:2 2:inf\n1 1:3\n-1 2:1\n", r"feature value inf in sample 2"),
    ("1 1:1\nnan 1:2\n1 1:3\n-1 2:1\n", r"label value nan in sample 2"),
    ("1 1:1\n", r"holds 1 sample\(s\)"),
    ("", r"holds 0 sample\(s\)"),
])
def test_bad_values_in_an_svmlight_file_are_input_errors_naming_it(tmp_path, text, message):
    path = tmp_path / "bad.svm"
    path.write_text(text)
    with pytest.raises(InputError, match=f"svmlight file {path}.*{message}"):
        load_dataset(str(path))


def test_a_binary_svmlight_file_is_an_input_error(tmp_path):
    path = tmp_path / "binary.svm"
    path.write_bytes(b"\xff\xfe\x00\x01garbage\n")
    with pytest.raises(InputError, match="cannot read svmlight file"):
        load_dataset(str(path))
