"""Shared groundwork of the training suites (pp, hybrid): a seeded batch (synthetic, or MNIST images), one
serial SGD step as the reference, and the count of weights outside the tolerance."""
import functools

import numpy as np

from bench.models.pp import CHECK_SAMPLES
from kernels.datasets import load_mnist_sample

from parallel.nn.layers import softmax_cross_entropy
from parallel.nn.models import flat_storage, flatten_arrays, forward_backward
from parallel.nn.optim import SGD

SEED = 2024
LEARNING_RATE = 0.01
TOLERANCES = {"float64": 1e-9, "float32": 1e-3}


def synthetic_batch(size, width, classes, dtype):
    """Standard normal inputs ``(size, width)`` and uniform labels in ``[0, classes)``, from `SEED`."""
    rng = np.random.default_rng(SEED)
    return rng.standard_normal((size, width)).astype(dtype), rng.integers(0, classes, size)


@functools.lru_cache(maxsize=2)
def _mnist(dtype):
    images, labels = load_mnist_sample(dtype=np.dtype(dtype))
    order = np.random.default_rng(SEED).permutation(len(images))  # the file is sorted by label
    return images[order], labels[order]


def mnist_batch(size, dtype):
    """``size`` images ``(size, 1, 28, 28)`` and labels of the 5,000-image MNIST sample, shuffled from
    `SEED` (repeated in order above 5,000)."""
    images, labels = _mnist(str(np.dtype(dtype)))
    rows = np.arange(size) % len(images)
    return images[rows], labels[rows]


def check_samples(size, unit):
    """Samples of the check step: ``size`` up to `CHECK_SAMPLES`, else the largest multiple of ``unit`` in it."""
    return size if size <= CHECK_SAMPLES else unit * max(1, CHECK_SAMPLES // unit)


def serial_step_parameters(comm, build, x, y, dtype):
    """The flat parameters of ``build()`` after one serial SGD step on ``x, y``, on every rank.

    Rank 0 builds and trains the model; one ``Bcast`` hands the vector to the others.
    """
    flat = None
    if comm.rank == 0:
        model = build()
        params, grads = flat_storage(model)
        forward_backward(model, softmax_cross_entropy, x, y)
        SGD([(params, grads)], LEARNING_RATE).step()
        flat = params
    count = comm.bcast(None if flat is None else flat.size, root=0)
    flat = np.empty(count, dtype) if flat is None else flat
    comm.Bcast(flat, root=0)
    return flat


def count_wrong(actual, expected, dtype):
    """Elements of the arrays ``actual`` outside the suite's tolerance of ``expected``."""
    actual, expected = flatten_arrays(actual), flatten_arrays(expected)
    rtol = TOLERANCES[dtype]
    atol = rtol * float(np.max(np.abs(expected))) if expected.size else 0.0
    return int(np.count_nonzero(~np.isclose(actual, expected, rtol=rtol, atol=atol)))


def restore(pairs, initial):
    """Copy the arrays ``initial`` back into the parameters of ``pairs``."""
    for (param, _), value in zip(pairs, initial):
        param[...] = value
