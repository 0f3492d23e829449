"""`bench.models.flops` against a count of the GEMMs an odd-shaped model actually runs, and the per-rank rule."""
import math

import numpy as np

from bench.models import flops
from parallel.nn.conv import Conv2d
from parallel.nn.layers import Flatten, Linear, ReLU, Sequential
from parallel.nn.pooling import MaxPool2d


def _counted_step(model, x):
    """Flops of one forward and backward pass, summed over the GEMMs the layers run, their shapes read from the
    arrays of a real pass (2 m k n per product: forward one, backward the weight gradient and, where the layer
    returns one, the input gradient)."""
    total, shapes = 0, []
    for layer in model.layers:
        y = layer.forward(x)
        shapes.append((layer, x.shape, y.shape))
        x = y
    dy = np.ones_like(x)
    for layer, x_shape, y_shape in reversed(shapes):
        dx = layer.backward(dy)
        if isinstance(layer, Linear):
            m, k, n = x_shape[0], x_shape[1], y_shape[1]
        elif isinstance(layer, Conv2d):
            out_channels, in_channels, kh, kw = layer.params["weight"].shape
            m, k, n = y_shape[0] * y_shape[2] * y_shape[3], in_channels * kh * kw, out_channels
        else:
            m = k = n = 0
        total += 2 * m * k * n * (2 + (dx is not None))
        dy = dx
        if dy is None:  # a first layer that skips its input gradient
            break
    return total


def test_flops_of_an_odd_shaped_model_match_the_gemms_a_real_step_runs():
    rng = np.random.default_rng(0)
    model = Sequential([Conv2d(3, 5, 3, stride=2, padding=1, rng=rng, dtype=np.float64, input_gradient=False),
                        MaxPool2d(2), ReLU(), Conv2d(5, 7, (2, 3), rng=rng, dtype=np.float64), ReLU(), Flatten(),
                        Linear(7 * 2 * 2, 11, rng=rng, dtype=np.float64), ReLU(),
                        Linear(11, 3, rng=rng, dtype=np.float64)])
    x = rng.standard_normal((5, 3, 13, 17))
    assert flops.step(model, (3, 13, 17), 5) == _counted_step(model, x)
    forward, backward = flops.model_passes(model, (3, 13, 17), 5)
    assert backward < 2 * forward  # the first convolution skips its input gradient


def test_nested_blocks_and_layer_lists_count_as_their_layers():
    block = Sequential([Linear(9, 13), ReLU(), Linear(13, 9)])
    stack = Sequential([block, Sequential([Linear(9, 13), ReLU(), Linear(13, 9)])])
    assert flops.step(stack, (9,), 7) == 2 * flops.step(block.layers, (9,), 7) == 2 * 12 * 7 * 9 * 13
    assert flops.dense_stack(7, (9, 13, 9)) == flops.model_passes(block, (9,), 7)


def test_per_rank_divides_the_rate_by_the_computing_ranks():
    assert flops.per_rank(6e9, 2.0, 3) == (3.0, 1.0)
    assert flops.per_rank(6e9, 2.0, 0) == (3.0, 3.0)
    assert all(math.isnan(value) for value in flops.per_rank(6e9, 0.0, 2))
