"""Reference models, the serial training step, and flat parameter / gradient buffers.

The flat buffers are what data parallelism communicates: `flat_storage` moves every
parameter and gradient of a model into two contiguous vectors (the layers keep
views into them), so one ``Allreduce`` on the gradient vector reduces the whole
model and one optimiser update over ``[(flat_params, flat_grads)]`` updates it.
"""
import numpy as np

from kernels.errors import InputError
from parallel.nn.conv import Conv2d, MaxPool2d
from parallel.nn.layers import Flatten, Linear, ReLU, Sequential


def mlp(sizes, seed=0, dtype=np.float32):
    """Return a multilayer perceptron ``Linear, ReLU, ..., Linear`` (no ReLU after the last).

    Parameters
    ----------
    sizes : sequence of int
        Layer widths ``(inputs, hidden..., outputs)``, at least two.
    seed : int
        Seed of the one generator all layers draw their weights from, in order.
    dtype : numpy dtype
    """
    if len(sizes) < 2 or min(sizes) < 1:
        raise InputError(f"mlp: need at least two positive layer sizes, got {list(sizes)}")
    rng = np.random.default_rng(seed)
    layers = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        layers += [Linear(n_in, n_out, rng=rng, dtype=dtype), ReLU()]
    return Sequential(layers[:-1])


def mnist_mlp(seed=0, dtype=np.float32, inputs=784):
    """Return the MLP that the data-parallel and parameter-server suites train: ``inputs``-256-128-10.

    ``inputs`` is 784 for flat MNIST images (64 for the 8x8 digits).
    """
    return mlp((inputs, 256, 128, 10), seed, dtype)


def mnist_cnn(seed=0, dtype=np.float32):
    """Return the classic small MNIST CNN for ``(n, 1, 28, 28)`` inputs and 10 logits.

    conv 1->10 k5 (24x24), max-pool 2 (12x12), ReLU, conv 10->20 k5 (8x8), max-pool 2
    (4x4), ReLU, flatten (320), linear 320->50, ReLU, linear 50->10.
    """
    rng = np.random.default_rng(seed)
    return Sequential([
        Conv2d(1, 10, 5, rng=rng, dtype=dtype), MaxPool2d(2), ReLU(),
        Conv2d(10, 20, 5, rng=rng, dtype=dtype), MaxPool2d(2), ReLU(),
        Flatten(), Linear(320, 50, rng=rng, dtype=dtype), ReLU(), Linear(50, 10, rng=rng, dtype=dtype),
    ])


def forward_backward(model, loss, x, y):
    """Run forward, loss and backward on one batch; leave the gradients in ``model.grads``.

    Parameters
    ----------
    model : Layer
    loss : callable
        ``loss(logits, y) -> (value, dlogits)``, e.g. `parallel.nn.layers.softmax_cross_entropy`.
    x, y : ndarray
        Inputs and labels of the batch.

    Returns
    -------
    float
        The loss value.
    """
    value, dlogits = loss(model.forward(x), y)
    model.backward(dlogits)
    return value


def train_step(model, loss, optimizer, x, y):
    """Run `forward_backward` on one batch, then ``optimizer.step()``; return the loss value."""
    value = forward_backward(model, loss, x, y)
    optimizer.step()
    return value


def predict(model, x, batch_size=1000):
    """Return the predicted class (argmax of the logits) of every row of ``x``, in batches."""
    return np.concatenate([np.argmax(model.forward(x[start:start + batch_size]), axis=1)
                           for start in range(0, len(x), batch_size)])


def accuracy(model, x, y, batch_size=1000):
    """Return the fraction of ``x`` whose predicted class equals the label in ``y``."""
    if len(x) != len(y) or len(x) == 0:
        raise InputError(f"accuracy: need as many labels as (>= 1) inputs, got {len(x)} and {len(y)}")
    return float(np.mean(predict(model, x, batch_size) == np.asarray(y)))


def flatten_arrays(arrays):
    """Return a new contiguous 1-D vector holding the ravelled ``arrays`` one after another."""
    arrays = [np.ravel(array) for array in arrays]
    return np.concatenate(arrays) if arrays else np.zeros(0)


def unflatten_vector(vector, shapes):
    """Return views into the 1-D ``vector``, one per shape, in order (the inverse of `flatten_arrays`).

    Raises `InputError` when the shapes do not add up to the vector's length.
    """
    sizes = [int(np.prod(shape)) for shape in shapes]
    if vector.ndim != 1 or sum(sizes) != vector.size:
        raise InputError(f"unflatten_vector: shapes hold {sum(sizes)} items, vector has shape {vector.shape}")
    offsets = np.cumsum([0] + sizes)
    return [vector[start:stop].reshape(shape) for start, stop, shape in zip(offsets[:-1], offsets[1:], shapes)]


def _move_into_vector(leaves, kind):
    """Copy the ``kind`` ("params" or "grads") arrays of ``leaves`` into one vector; re-bind them to views."""
    owners = [(getattr(layer, kind), name) for layer in leaves for name in layer.params]
    arrays = [owner[name] for owner, name in owners]
    vector = flatten_arrays(arrays)
    for (owner, name), view in zip(owners, unflatten_vector(vector, [array.shape for array in arrays])):
        owner[name] = view
    return vector


def flat_storage(model):
    """Move all parameters and gradients of ``model`` into two contiguous vectors.

    Values are kept; afterwards each layer's ``params[name]`` and ``grads[name]`` is
    a view into the returned vectors, in ``model.parameters()`` order. Build the
    optimiser after calling this (it holds references to the arrays).

    Returns
    -------
    flat_params, flat_grads : ndarray, shape (number of parameters,)
    """
    leaves = model.leaves()
    return _move_into_vector(leaves, "params"), _move_into_vector(leaves, "grads")
