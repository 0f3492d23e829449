"""The framework reference of training: the suites' models trained by Keras on TensorFlow, in one process.

``dp``'s ``keras`` variant is to training what ``numpy`` is to ``gemm`` and ``sklearn`` to ``svm``: the
implicit-parallelism reference, one process using the node's threads (TensorFlow's intra-op pool, one
inter-op thread), the same model, initial weights, optimiser and global batches as the parallel
variants. TensorFlow is an optional extra (``pip install 'mlscale[keras]'``, ``tensorflow-cpu``) and is
imported only when a Keras model is built.

`keras_model` converts an mlscale `parallel.nn.layers.Sequential` of ``Linear``, ``ReLU``, ``Flatten``,
``Conv2d`` and ``MaxPool2d`` layers into a ``keras.Sequential`` computing the same function with the same
weights: images channels-last (NHWC, Keras' CPU layout; `to_channels_last` moves a batch), convolution
kernels ``(kh, kw, in, out)`` (mlscale: ``(out, in, kh, kw)``), ``Conv2d``'s padding as a
``ZeroPadding2D``, and the rows of the first dense layer after a flatten permuted from mlscale's ``(c, h,
w)`` order to Keras' ``(h, w, c)``. `mlscale_parameters` maps the Keras weights back, in mlscale's
``model.parameters()`` order, which is how the ``keras`` variant is checked against the serial
reference (and so mlscale's backward passes against TensorFlow's automatic differentiation).

`KerasTrainer` is one training step as a Keras user writes it (``tf.function``, ``GradientTape``,
``apply_gradients``; softmax cross-entropy on logits, mean over the batch): SGD with momentum as Keras'
``SGD`` (the same iterates as mlscale's PyTorch-convention `parallel.nn.optim.SGD` at a constant learning
rate) and Adam as mlscale's `parallel.nn.optim.Adam` (Keras' own ``Adam`` adds epsilon to the root of the
uncorrected second moment, which is another optimiser; `_MlscaleAdam` is Keras' ``Adam`` with mlscale's
update, in Keras ops).
"""
import importlib.util
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from kernels.errors import InputError

#: Why the ``keras`` variant cannot run where TensorFlow is missing (one line).
MISSING = "TensorFlow is not installed: pip install 'mlscale[keras]' (tensorflow-cpu)"


def unavailable_reason():
    """`MISSING` when TensorFlow cannot be imported here, else None (without importing it)."""
    return None if importlib.util.find_spec("tensorflow") is not None else MISSING


def harness_threads():
    """The BLAS threads the harness gave this rank (`threadpoolctl`; 1 without a BLAS pool): TensorFlow's."""
    from threadpoolctl import threadpool_info

    return max((pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"), default=1)


def _tensorflow(threads):
    """TensorFlow, its intra-op pool set to ``threads`` (and one inter-op thread) if it has not started yet."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with _stderr_silenced():  # TensorFlow's C++ libraries log twice before its logging reads the variable
        import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:  # the runtime has started: its pool stays (`KerasTrainer.threads` says which)
        pass
    return tf


@contextmanager
def _stderr_silenced():
    """File descriptor 2 on ``/dev/null`` (what C libraries print there is lost; Python's errors are raised)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def to_channels_last(images):
    """A batch of NCHW images as NHWC (a new C-contiguous array); flat rows unchanged."""
    return np.ascontiguousarray(images.transpose(0, 2, 3, 1)) if images.ndim == 4 else images


@dataclass
class KerasModel:
    """A ``keras.Sequential`` (``keras``) converted from an mlscale model, and for each of its weighted layers
    the mlscale layer it came from with, for a dense layer after a flatten, the ``(c, h, w)`` it flattened."""

    keras: object
    sources: list


def keras_model(model, input_shape, dtype, threads=1):
    """The `KerasModel` of mlscale's ``model`` (see the module) for inputs of ``input_shape`` (one sample,
    mlscale's layout: ``(features,)`` or ``(c, h, w)``), its weights copied, in ``dtype``.

    Raises `InputError` for a layer it cannot convert.
    """
    from parallel.nn.conv import Conv2d
    from parallel.nn.layers import Flatten, Linear, ReLU
    from parallel.nn.pooling import MaxPool2d

    keras = _tensorflow(threads).keras
    shape = tuple(input_shape)
    layers = [keras.Input(shape=shape[1:] + shape[:1] if len(shape) == 3 else shape, dtype=dtype)]
    sources, flattened = [], None
    for layer in model.layers:
        if isinstance(layer, Conv2d):
            if layer.padding:
                layers.append(keras.layers.ZeroPadding2D(layer.padding, dtype=dtype))
            channels = layer.params["weight"].shape[0]
            layers.append(keras.layers.Conv2D(channels, layer.kernel, strides=layer.stride, dtype=dtype))
            sources.append((layer, None))
            shape = (channels,) + tuple((size + 2 * layer.padding - k) // layer.stride + 1
                                        for size, k in zip(shape[1:], layer.kernel))
        elif isinstance(layer, MaxPool2d):
            layers.append(keras.layers.MaxPooling2D(layer.k, dtype=dtype))
            shape = (shape[0],) + tuple(size // layer.k for size in shape[1:])
        elif isinstance(layer, ReLU):
            layers.append(keras.layers.ReLU(dtype=dtype))
        elif isinstance(layer, Flatten):
            layers.append(keras.layers.Flatten(dtype=dtype))
            flattened, shape = (shape if len(shape) == 3 else None), (int(np.prod(shape)),)
        elif isinstance(layer, Linear):
            outputs = layer.params["weight"].shape[1]
            layers.append(keras.layers.Dense(outputs, dtype=dtype))
            sources.append((layer, flattened))
            flattened, shape = None, (outputs,)
        else:
            raise InputError(f"the keras reference cannot convert a {type(layer).__name__} layer")
    converted = KerasModel(keras.Sequential(layers), sources)
    for target, (layer, flattened) in zip(_weighted(converted), sources):
        weight = layer.params["weight"]
        if isinstance(layer, Conv2d):
            weight = weight.transpose(2, 3, 1, 0)
        elif flattened is not None:  # rows in (c, h, w) order -> (h, w, c)
            weight = weight.reshape(flattened + weight.shape[1:]).transpose(1, 2, 0, 3).reshape(weight.shape)
        target.set_weights([weight, layer.params["bias"]])
    return converted


def mlscale_parameters(converted):
    """The weights of a `KerasModel` as one flat vector in the order and layouts of the mlscale model's
    ``parameters()``."""
    pieces = []
    for target, (layer, flattened) in zip(_weighted(converted), converted.sources):
        kernel, bias = target.get_weights()
        if kernel.ndim == 4:
            kernel = kernel.transpose(3, 2, 0, 1)
        elif flattened is not None:  # (h, w, c) rows back to (c, h, w)
            channels, height, width = flattened
            kernel = kernel.reshape(height, width, channels, -1).transpose(2, 0, 1, 3).reshape(kernel.shape)
        pieces += [kernel.ravel(), bias.ravel()]
    return np.concatenate(pieces)


def _weighted(converted):
    return [layer for layer in converted.keras.layers if layer.weights]


class KerasTrainer:
    """Keras training steps of a `keras_model` of ``model``, with the optimiser of the mlscale ``optimizer``
    (an `parallel.nn.optim.SGD` or `parallel.nn.optim.Adam` built for the same model: its hyper-parameters),
    on batches in Keras' layout (`to_channels_last`); the trainer protocol ``dp``'s case drives
    (`parallel.data.data_parallel.DataParallelTrainer`'s ``train_step``, ``flat_params``, ``model``...) for
    one process, which exchanges nothing.

    Attributes
    ----------
    converted : KerasModel
    model
        What `parallel.nn.models.accuracy` evaluates: ``forward(x)`` of a batch in Keras' layout (logits).
    threads : int
        TensorFlow's intra-op threads (the first trainer of a process sets them).
    """

    step_skipped, comm_seconds, loss_scaler, buckets = False, 0.0, None, ()

    def __init__(self, model, input_shape, optimizer, dtype, threads):
        tf = _tensorflow(threads)
        tf.keras.config.set_floatx(str(np.dtype(dtype)))  # the loss and the optimiser's learning rate too
        self.converted = keras_model(model, input_shape, dtype, threads)
        self.threads = tf.config.threading.get_intra_op_parallelism_threads() or threads
        self._optimizer = _keras_optimizer(tf, optimizer)
        network = self.converted.keras
        self.model = _Logits(network)
        loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                value = loss(y, network(x, training=True))
            self._optimizer.apply_gradients(zip(tape.gradient(value, network.trainable_variables),
                                                network.trainable_variables))
            return value

        self._step = step

    def train_step(self, optimizer, x, y, batch_size=None):
        """One step on the batch ``(x, y)`` (``optimizer``, ``batch_size``: the protocol's, unused: Keras'
        optimiser updates the weights and the batch is the whole batch); returns the loss, the step finished."""
        return float(self._step(x, y).numpy())

    def parameters(self):
        """No ``(param, grad)`` pairs for an mlscale optimiser: Keras' own updates the weights."""
        return []

    @property
    def flat_params(self):
        return mlscale_parameters(self.converted)

    def state_arrays(self):
        """Copies of what the process holds between steps: the weights and the optimiser's variables."""
        return [variable.numpy() for variable in self.converted.keras.weights + self._optimizer.variables]

    def replica_mismatches(self):
        return 0

    def sync_model(self):
        """One replica: nothing to gather."""


class _Logits:
    def __init__(self, network):
        self.forward = lambda x: network(x, training=False).numpy()


def _keras_optimizer(tf, optimizer):
    """Keras' optimiser with the hyper-parameters of the mlscale ``optimizer``; `InputError` for weight decay."""
    from parallel.nn.optim import SGD

    if optimizer.weight_decay:
        raise InputError("the keras reference has no L2 weight decay in mlscale's convention")
    exact = _exact_optimizers(tf)
    if isinstance(optimizer, SGD):
        return exact["sgd"](optimizer.lr, momentum=optimizer.momentum)
    return exact["adam"](optimizer.lr, beta_1=optimizer.beta1, beta_2=optimizer.beta2, epsilon=optimizer.eps)


def _exact_optimizers(tf):
    """Keras' ``SGD`` and ``Adam`` with their constants converted straight to the variable's dtype (Keras
    casts them through float32: 0.9 becomes 0.89999998 in a float64 step) and Adam with mlscale's update
    (see the module): ``p -= (lr / c1) m / (sqrt(v / c2) + eps)``, written as Keras writes its own,
    ``alpha m / (sqrt(v) + eps sqrt(c2))`` with ``alpha = lr sqrt(c2) / c1``."""
    ops = tf.keras.ops

    def constant(value, dtype):
        return ops.convert_to_tensor(value, dtype=dtype)

    class ExactSGD(tf.keras.optimizers.SGD):
        def update_step(self, gradient, variable, learning_rate):
            dtype = variable.dtype
            gradient, learning_rate = ops.cast(gradient, dtype), ops.cast(learning_rate, dtype)
            velocity = self.momentums[self._get_variable_index(variable)] if self.momentum else None
            if velocity is None:
                self.assign_sub(variable, ops.multiply(gradient, learning_rate))
                return
            self.assign(velocity, ops.subtract(ops.multiply(velocity, constant(self.momentum, dtype)),
                                               ops.multiply(gradient, learning_rate)))
            self.assign_add(variable, velocity)

    class MlscaleAdam(tf.keras.optimizers.Adam):
        def update_step(self, gradient, variable, learning_rate):
            dtype = variable.dtype
            gradient = ops.cast(gradient, dtype)
            step = ops.cast(self.iterations + 1, dtype)
            first_correction = 1 - ops.power(constant(self.beta_1, dtype), step)
            root_second_correction = ops.sqrt(1 - ops.power(constant(self.beta_2, dtype), step))
            first = self._momentums[self._get_variable_index(variable)]
            second = self._velocities[self._get_variable_index(variable)]
            self.assign_add(first, ops.multiply(ops.subtract(gradient, first), constant(1 - self.beta_1, dtype)))
            self.assign_add(second, ops.multiply(ops.subtract(ops.square(gradient), second),
                                                 constant(1 - self.beta_2, dtype)))
            alpha = ops.cast(learning_rate, dtype) * root_second_correction / first_correction
            self.assign_sub(variable, ops.divide(ops.multiply(first, alpha), ops.add(
                ops.sqrt(second), constant(self.epsilon, dtype) * root_second_correction)))

    return {"sgd": ExactSGD, "adam": MlscaleAdam}
