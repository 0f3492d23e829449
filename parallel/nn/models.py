"""Reference models, the serial training step, and flat parameter / gradient buffers.

The flat buffers are what data parallelism communicates: `flat_storage` moves every
parameter and gradient of a model into two contiguous vectors (the layers keep
views into them), so one ``Allreduce`` on the gradient vector reduces the whole
model and one optimiser update over ``[(flat_params, flat_grads)]`` updates it.

On a device: build a model here (on the host, from its seed), move it once with
``model.to(backend)`` (`parallel.nn.layers.Layer.to`), then call `flat_storage`;
the flat vectors are then device arrays, as are `predict`'s results.
"""
import numpy as np

from kernels.backend import array_module
from kernels.errors import InputError
from parallel.nn.conv import Conv2d
from parallel.nn.layers import Flatten, Linear, ReLU, Sequential
from parallel.nn.pooling import MaxPool2d


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
    (4x4), ReLU, flatten (320), linear 320->50, ReLU, linear 50->10. The first convolution
    computes no input gradient (``backward`` returns None): nothing reads the images' gradient.
    """
    rng = np.random.default_rng(seed)
    return Sequential([
        Conv2d(1, 10, 5, rng=rng, dtype=dtype, input_gradient=False), MaxPool2d(2), ReLU(),
        Conv2d(10, 20, 5, rng=rng, dtype=dtype), MaxPool2d(2), ReLU(),
        Flatten(), Linear(320, 50, rng=rng, dtype=dtype, host_split=True), ReLU(),
        Linear(50, 10, rng=rng, dtype=dtype, host_split=True),
    ])


def keras_cnn(seed=0, dtype=np.float32):
    """Return the Keras-style MNIST CNN of the TensorFlow example, for ``(n, 1, 28, 28)`` inputs.

    conv 1->32 3x3 (26x26), max-pool 2 (13x13), conv 32->64 3x3 (11x11), max-pool 2
    (5x5), conv 64->64 3x3 (3x3), flatten (576), dense 576->64, dense 64->10; ReLU
    after every convolution and after dense 64 (93,322 parameters). ReLU is applied
    after the pooling, which gives the same values as Keras's ReLU-then-pool
    (max-pooling and ReLU commute) on 4x fewer elements. As in `mnist_cnn`, the first
    convolution computes no input gradient.
    """
    rng = np.random.default_rng(seed)
    return Sequential([
        Conv2d(1, 32, 3, rng=rng, dtype=dtype, input_gradient=False), MaxPool2d(2), ReLU(),
        Conv2d(32, 64, 3, rng=rng, dtype=dtype), MaxPool2d(2), ReLU(),
        Conv2d(64, 64, 3, rng=rng, dtype=dtype), ReLU(),
        Flatten(), Linear(576, 64, rng=rng, dtype=dtype, host_split=True), ReLU(),
        Linear(64, 10, rng=rng, dtype=dtype, host_split=True),
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
    """Return the predicted class (argmax of the logits) of every row of ``x``, in batches (in ``x``'s memory)."""
    return array_module(x).concatenate([model.forward(x[start:start + batch_size]).argmax(axis=1)
                                        for start in range(0, len(x), batch_size)])


def accuracy(model, x, y, batch_size=1000):
    """Return the fraction of ``x`` whose predicted class equals the label in ``y``."""
    if len(x) != len(y) or len(x) == 0:
        raise InputError(f"accuracy: need as many labels as (>= 1) inputs, got {len(x)} and {len(y)}")
    return float((predict(model, x, batch_size) == array_module(x).asarray(y)).mean())


def flatten_arrays(arrays):
    """Return a new contiguous 1-D vector holding the ravelled ``arrays`` one after another."""
    arrays = [array.ravel() for array in arrays]
    return array_module(*arrays).concatenate(arrays) if arrays else np.zeros(0)


def unflatten_vector(vector, shapes):
    """Return views into the 1-D ``vector``, one per shape, in order (the inverse of `flatten_arrays`).

    Raises `InputError` when the shapes do not add up to the vector's length.
    """
    sizes = [int(np.prod(shape)) for shape in shapes]
    if vector.ndim != 1 or sum(sizes) != vector.size:
        raise InputError(f"unflatten_vector: shapes hold {sum(sizes)} items, vector has shape {vector.shape}")
    offsets = np.cumsum([0] + sizes)
    return [vector[start:stop].reshape(shape) for start, stop, shape in zip(offsets[:-1], offsets[1:], shapes)]


def _move_into_vector(leaves, kind, dtype):
    """Copy the ``kind`` ("params" or "grads") arrays of ``leaves`` into one vector of ``dtype`` (None:
    theirs); re-bind them to views."""
    owners = [(getattr(layer, kind), name) for layer in leaves for name in layer.params]
    arrays = [owner[name] for owner, name in owners]
    vector = flatten_arrays(arrays)
    if dtype is not None:
        vector = vector.astype(dtype, copy=False)
    for (owner, name), view in zip(owners, unflatten_vector(vector, [array.shape for array in arrays])):
        owner[name] = view
    return vector


def flat_storage(model, dtype=None):
    """Move all parameters and gradients of ``model`` into two contiguous vectors.

    Values are kept (rounded to ``dtype`` when one is given); afterwards each
    layer's ``params[name]`` and ``grads[name]`` is a view into the returned
    vectors, in ``model.parameters()`` order. Build the optimiser after calling
    this (it holds references to the arrays).

    Parameters
    ----------
    model : Layer
    dtype : numpy dtype, optional
        Element type of the new vectors (default: the parameters' own). Layers
        that cast their input (``dtype`` attribute: `Linear`, `Conv2d`) then
        compute in it too: mixed precision keeps the float32 vectors it had as
        master weights and re-binds the model to 16-bit copies this way.

    Returns
    -------
    flat_params, flat_grads : ndarray, shape (number of parameters,)
    """
    leaves = model.leaves()
    vectors = _move_into_vector(leaves, "params", dtype), _move_into_vector(leaves, "grads", dtype)
    if dtype is not None:
        for layer in leaves:
            if hasattr(layer, "dtype"):
                layer.dtype = np.dtype(dtype)
    return vectors
