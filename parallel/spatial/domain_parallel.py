"""A domain-parallel CNN: the serial model's feature maps split in tiles over a 2D grid.

`domain_parallel_model` turns a serial CNN (e.g. `parallel.nn.models.mnist_cnn`) into
its domain-parallel twin: convolutions become `parallel.spatial.halo_conv.HaloConv2d`, max
pooling and ReLU run on the tiles as they are, and `GatherFlatten` gathers the last
feature map on every rank (``Allgatherv``) so that the fully connected part runs
redundantly on every rank on the whole batch; its input gradient is identical
everywhere and each rank keeps its own tile of it (the "scatter back" needs no
message). One domain-parallel training step is then `parallel.nn.models.train_step`
on the parallel model with this rank's tile of the batch
(``layout.tile(x, grid.coords)``) and all the labels: losses, gradients and updated
weights equal the serial step's up to rounding.

Devices: move the serial model first (``model.to(backend)``), build the grid from
`kernels.backend.Backend.comm`, and feed device tiles; every layer then computes
with its inputs' array module (gathers staged by the `kernels.comm.device.DeviceComm`).
"""
import math

import numpy as np

from kernels.backend import array_module
from kernels.errors import InputError
from parallel.spatial.halo_conv import HaloConv2d
from parallel.spatial.halo_exchange import DEFAULT_PACKING
from parallel.nn.conv import Conv2d
from parallel.nn.layers import Flatten, Layer, ReLU, Sequential
from parallel.nn.pooling import MaxPool2d
from parallel.spatial.tile_layout import TileLayout


class GatherFlatten(Layer):
    """`Flatten` of a tiled feature map, gathered whole on every rank.

    Forward: ``Allgatherv`` of the tiles over the grid, ``(n, c, h, w)`` local to
    ``(n, c * H * W)`` global on every rank: ``(p - 1) alpha + (p-1)/p * n c H W
    * itemsize * beta`` (ring). Backward: every rank holds the same global gradient
    and returns its own tile of it; no message.
    """

    def __init__(self, grid, layout):
        super().__init__()
        self.grid, self.layout = grid, layout
        self.rank_coords = [tuple(grid.cart.Get_coords(rank)) for rank in range(grid.cart.size)]

    def forward(self, x):
        batch, channels = x.shape[:2]
        if x.shape[2:] != self.layout.tile_shape(self.grid.coords):
            raise InputError(f"GatherFlatten: tile of shape {x.shape} does not match the layout")
        counts = [batch * channels * math.prod(self.layout.tile_shape(c)) for c in self.rank_coords]
        displacements = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
        xp = array_module(x)
        gathered = xp.empty(sum(counts), x.dtype)
        self.grid.cart.Allgatherv(xp.ascontiguousarray(x), [gathered, (counts, displacements)])
        whole = xp.empty((batch, channels, self.layout.height, self.layout.width), x.dtype)
        for coords, start, count in zip(self.rank_coords, displacements, counts):
            tile = self.layout.tile(whole, coords)
            tile[...] = gathered[start:start + count].reshape(tile.shape)
        return whole.reshape(batch, -1)

    def backward(self, dy):
        whole = dy.reshape(dy.shape[0], -1, self.layout.height, self.layout.width)
        return self.layout.tile(whole, self.grid.coords).copy()


def _spatial_layers(layers):
    """The leading layers that act on feature maps (convolution, max pooling, ReLU)."""
    count = 0
    while count < len(layers) and isinstance(layers[count], (Conv2d, MaxPool2d, ReLU)):
        count += 1
    return layers[:count]


def _reduction(layer):
    """How many input pixels one output pixel of ``layer`` advances by (stride or pool size)."""
    return layer.stride if isinstance(layer, Conv2d) else layer.k if isinstance(layer, MaxPool2d) else 1


def aligned_layout(layers, height, width, dims):
    """The input `TileLayout` under which every max pooling of the leading spatial layers is aligned.

    The last feature map is split in `kernels.distribution.block_range` blocks;
    going back layer by layer, an inner boundary ``b`` of a layer's output becomes
    ``b * stride`` (convolution) or ``b * k`` (pooling) of its input.
    """
    spatial = _spatial_layers(layers)
    sizes = [(height, width)]
    for layer in spatial:
        h, w = sizes[-1]
        if isinstance(layer, Conv2d):
            sizes.append(tuple((n + 2 * layer.padding - k) // layer.stride + 1 for n, k in zip((h, w), layer.kernel)))
        else:
            sizes.append((h // layer.k, w // layer.k) if isinstance(layer, MaxPool2d) else (h, w))
        if min(sizes[-1]) < 1:
            raise InputError(f"a {height}x{width} input shrinks to nothing in layer {len(sizes) - 1}")
    last = TileLayout.blocks(*sizes[-1], dims)
    bounds = (last.row_bounds, last.col_bounds)
    for layer, size in zip(reversed(spatial), reversed(sizes[:-1])):
        factor = _reduction(layer)
        bounds = tuple(tuple(factor * b for b in axis[:-1]) + (n,) for axis, n in zip(bounds, size))
    return TileLayout(height, width, *bounds)


def domain_parallel_model(model, grid, height, width, overlap=False, method=DEFAULT_PACKING):
    """The domain-parallel twin of the serial CNN ``model`` for ``(n, c, height, width)`` inputs.

    Convolutions become `HaloConv2d`, pooling and ReLU stay (on tiles), ``Flatten``
    becomes `GatherFlatten`, and the layers after it are ``model``'s own, run
    redundantly on every rank. Parameters and the later layers are *shared* with
    ``model`` (build a second serial model from the same seed to compare).

    Returns
    -------
    parallel_model : parallel.nn.layers.Sequential
        Takes this rank's input tile ``layout.tile(x, grid.coords)``.
    layout : TileLayout
        The input layout, from `aligned_layout`.
    """
    layout = input_layout = aligned_layout(model.layers, height, width, grid.dims)
    spatial = _spatial_layers(model.layers)
    layers = []
    for layer in spatial:
        if isinstance(layer, Conv2d):
            layer = HaloConv2d(layer, grid, layout, overlap, method)
            layout = layer.out_layout
        elif isinstance(layer, MaxPool2d):
            layout = layout.pooled(layer.k)
        layers.append(layer)
    rest = model.layers[len(spatial):]
    if rest and not isinstance(rest[0], Flatten):
        raise InputError(f"domain_parallel_model: expected Flatten after the spatial layers, got "
                         f"{type(rest[0]).__name__}")
    if rest:
        layers += [GatherFlatten(grid, layout)] + rest[1:]
    return Sequential(layers), input_layout
