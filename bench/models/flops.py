"""Floating-point operations of a training or layer step, counted from a built model's layer shapes.

One convention for every compute and training suite: a row's ``gflops`` is the
whole point's rate (the flops of one run over all its ranks, divided by the run's
seconds, as the BLAS suites count theirs), and ``params["gflops_per_rank"]`` is
that rate over the ranks that compute (`per_rank`): every rank of the point
except ``ps``'s servers and the idle ranks of ``attention``'s ``full``.

Counted: the GEMMs of dense layers and convolutions, the work that dominates a
step. A dense layer ``(rows, inputs) -> (rows, outputs)`` costs ``2 rows inputs
outputs`` forward and twice that backward (the weight gradient and the input
gradient); a convolution of ``images`` inputs to ``ho x wo`` outputs, ``c -> o``
channels, a ``kh x kw`` kernel ``2 images ho wo c o kh kw`` forward and twice that
backward, less the input gradient where the layer skips it (``input_gradient``
off: backward returns None). Not counted: biases, activations, pooling, the loss
and the optimiser's update (each ``O(parameters)`` or ``O(activations)`` element-wise
passes, against ``O(rows x parameters)`` for the GEMMs: a few per cent of a step's
flops for the suites' models).
"""
import math

from parallel.nn.conv import Conv2d, output_size
from parallel.nn.layers import Flatten, Linear, Sequential
from parallel.nn.pooling import MaxPool2d


def dense(rows, inputs, outputs, input_gradient=True):
    """``(forward, backward)`` flops of one dense layer on ``rows`` rows."""
    forward = 2 * rows * inputs * outputs
    return forward, forward * (2 if input_gradient else 1)


def convolution(images, out_pixels, in_channels, out_channels, kernel_area, input_gradient=True):
    """``(forward, backward)`` flops of one convolution: ``images`` images of ``out_pixels`` outputs each."""
    return dense(images * out_pixels, in_channels * kernel_area, out_channels, input_gradient)


def dense_stack(rows, widths):
    """``(forward, backward)`` flops of dense layers ``widths[i] -> widths[i + 1]`` on ``rows`` rows."""
    passes = [dense(rows, inputs, outputs) for inputs, outputs in zip(widths, widths[1:])]
    return sum(f for f, _ in passes), sum(b for _, b in passes)


def _leaves(model):
    """The layers of ``model`` in order, nested `Sequential` containers opened."""
    if isinstance(model, Sequential):
        return [leaf for layer in model.layers for leaf in _leaves(layer)]
    return list(model) if isinstance(model, (list, tuple)) else [model]


def model_passes(model, sample_shape, rows):
    """``(forward, backward)`` flops of ``model`` (a layer, a `Sequential` or a list of layers) on ``rows``
    samples of ``sample_shape`` (one sample: ``(features,)`` or ``(channels, height, width)``), the shape
    carried from layer to layer (convolutions by their kernel, stride and padding, pooling by its window)."""
    shape, forward, backward = tuple(sample_shape), 0, 0
    for layer in _leaves(model):
        if isinstance(layer, Linear):
            inputs, outputs = layer.params["weight"].shape
            passes, shape = dense(rows, inputs, outputs), (outputs,)
        elif isinstance(layer, Conv2d):
            out_channels, in_channels, kh, kw = layer.params["weight"].shape
            sides = [output_size(side + 2 * layer.padding, k, layer.stride) for side, k in zip(shape[1:], (kh, kw))]
            passes = convolution(rows, sides[0] * sides[1], in_channels, out_channels, kh * kw, layer.input_gradient)
            shape = (out_channels, *sides)
        else:
            passes = (0, 0)
            if isinstance(layer, MaxPool2d):
                shape = (shape[0],) + tuple(side // layer.k for side in shape[1:])
            elif isinstance(layer, Flatten):
                shape = (math.prod(shape),)
        forward, backward = forward + passes[0], backward + passes[1]
    return forward, backward


def step(model, sample_shape, rows):
    """Flops of one forward and backward pass of ``model`` on ``rows`` samples (`model_passes`)."""
    return sum(model_passes(model, sample_shape, rows))


def per_rank(flops, seconds, computing_ranks):
    """``(gflops, gflops_per_rank)`` of ``flops`` done in ``seconds`` by ``computing_ranks`` ranks; NaN without
    a time."""
    if not seconds > 0:
        return float("nan"), float("nan")
    rate = flops / seconds / 1e9
    return rate, rate / max(computing_ranks, 1)

