"""Spatial decomposition of NCHW tensors over a 2D process grid, and the halos of a convolution.

A `TileLayout` splits the height of an ``(n, c, h, w)`` tensor over the rows of a
``px x py`` `kernels.distribution.ProcessGrid` and the width over its columns;
the rank at grid coordinates ``(i, j)`` owns rows ``row_bounds[i]:row_bounds[i+1]``
and columns ``col_bounds[j]:col_bounds[j+1]`` (all images, all channels).

Ownership of a convolution's outputs (kernel ``k``, stride ``s``, zero padding
``p`` with ``2p <= k - 1``): output ``o`` reads input ``o*s - p ... o*s - p + k - 1``
and belongs to the rank owning its *anchor*, input ``o*s``. A rank owning inputs
``[a, b)`` thus owns outputs ``[ceil(a/s), ceil(b/s))`` (capped at the output size)
and needs the input *window* ``[oa*s - p, (ob-1)*s - p + k)``. The halo below the
tile is ``a - (oa*s - p)`` wide, ``p`` for stride 1 ('same': ``k // 2``; 'valid':
0) but less when ``a`` is not a multiple of ``s``; the halo above is
``k - 1 - p`` for stride 1 ('valid': ``k - 1``). With ``s = 1`` and 'same' padding the
output layout equals the input layout.

`plan_axis` works this out along one axis for one tile (an `AxisPlan`): outputs,
window, interior, local buffer, and which ranks along the axis it sends to and
receives from; `parallel.spatial.halo_exchange.HaloExchange` moves the halos. Pure
bookkeeping: no communication.
"""
from dataclasses import dataclass
from typing import Tuple

from kernels.distribution import block_offsets
from kernels.errors import InputError


def _intersect(first, second):
    start, stop = max(first[0], second[0]), min(first[1], second[1])
    return (start, stop) if start < stop else None


@dataclass(frozen=True)
class TileLayout:
    """Tile boundaries of an ``(n, c, height, width)`` tensor on a 2D process grid.

    ``row_bounds`` has ``px + 1`` entries from 0 to ``height`` (strictly increasing:
    every tile has at least one row); ``col_bounds`` likewise over ``width``.
    """

    height: int
    width: int
    row_bounds: Tuple[int, ...]
    col_bounds: Tuple[int, ...]

    def __post_init__(self):
        for name, size, bounds in (("height", self.height, self.row_bounds), ("width", self.width, self.col_bounds)):
            if bounds[0] != 0 or bounds[-1] != size or any(lo >= hi for lo, hi in zip(bounds[:-1], bounds[1:])):
                raise InputError(f"a {name} of {size} cannot be split into {len(bounds) - 1} non-empty tiles "
                                 f"{list(bounds)}: use fewer ranks along that grid axis or a larger image")

    @classmethod
    def blocks(cls, height, width, dims):
        """The layout of `kernels.distribution.block_range` blocks over a ``dims = (px, py)`` grid."""
        return cls(height, width, tuple(block_offsets(height, dims[0])) + (height,),
                   tuple(block_offsets(width, dims[1])) + (width,))

    @property
    def dims(self):
        return len(self.row_bounds) - 1, len(self.col_bounds) - 1

    def ranges(self, coords):
        """``((row_start, row_stop), (col_start, col_stop))`` owned by the rank at ``coords``."""
        i, j = coords
        return (self.row_bounds[i], self.row_bounds[i + 1]), (self.col_bounds[j], self.col_bounds[j + 1])

    def tile(self, array, coords):
        """The view of the global NCHW ``array`` owned by the rank at ``coords``."""
        (r0, r1), (c0, c1) = self.ranges(coords)
        return array[:, :, r0:r1, c0:c1]

    def tile_shape(self, coords):
        (r0, r1), (c0, c1) = self.ranges(coords)
        return r1 - r0, c1 - c0

    def conv_output(self, kernel, stride, padding):
        """The layout of a convolution's output (outputs belong to the owner of their anchor ``o*s``)."""
        sizes = [(size + 2 * padding - k) // stride + 1 for size, k in zip((self.height, self.width), kernel)]
        if min(sizes) < 1 or 2 * padding > min(kernel) - 1:
            raise InputError(f"convolution with kernel {tuple(kernel)}, padding {padding} needs 2*padding <= "
                             f"kernel - 1 and an image of at least the kernel, got {self.height}x{self.width}")
        rows, cols = ([min(-(-b // stride), size) for b in bounds]
                      for bounds, size in zip((self.row_bounds, self.col_bounds), sizes))
        try:
            return TileLayout(sizes[0], sizes[1], tuple(rows), tuple(cols))
        except InputError as error:
            raise InputError(f"convolution output (tiles own the outputs anchored in them): {error}") from None

    def pooled(self, k):
        """The layout after ``k x k`` max pooling; tile boundaries must be multiples of ``k``."""
        inner = self.row_bounds[1:-1] + self.col_bounds[1:-1]
        if any(b % k for b in inner):
            raise InputError(f"max pooling by {k} needs tile boundaries that are multiples of {k}, got rows "
                             f"{list(self.row_bounds)} and columns {list(self.col_bounds)}")
        return TileLayout(self.height // k, self.width // k, tuple(b // k for b in self.row_bounds[:-1])
                          + (self.height // k,), tuple(b // k for b in self.col_bounds[:-1]) + (self.width // k,))


@dataclass
class AxisPlan:
    """One axis of one rank's convolution: global index ranges, half-open.

    ``owned``: the tile; ``outputs``: the outputs it computes; ``window``: the input
    they read (may stick out of the image: zero padding), ``image_window`` the part
    inside the image; ``interior``: outputs whose window needs no halo; ``origin``
    and ``extent``: the local buffer, which covers tile and window; ``sends`` and
    ``recvs``: ``(peer, range)`` pairs along the axis (peer = coordinate).
    """

    owned: tuple
    outputs: tuple
    window: tuple
    image_window: tuple
    interior: tuple
    origin: int
    extent: int
    sends: list
    recvs: list

    def local(self, span):
        """The buffer slice of the global range ``span``."""
        return slice(span[0] - self.origin, span[1] - self.origin)


def _window(outputs, kernel, stride, padding):
    return outputs[0] * stride - padding, (outputs[1] - 1) * stride - padding + kernel


def plan_axis(bounds, out_bounds, index, kernel, stride, padding):
    """The `AxisPlan` of tile ``index`` along an axis split at ``bounds`` (outputs split at ``out_bounds``)."""
    size = bounds[-1]
    owned, outputs = (bounds[index], bounds[index + 1]), (out_bounds[index], out_bounds[index + 1])
    window = _window(outputs, kernel, stride, padding)
    image_window = (max(window[0], 0), min(window[1], size))
    low = outputs[0] if owned[0] == 0 else max(outputs[0], -(-(owned[0] + padding) // stride))
    high = outputs[1] if owned[1] == size else min(outputs[1], (owned[1] + padding - kernel) // stride + 1)
    sends, recvs = [], []
    for peer in range(len(bounds) - 1):
        if peer == index:
            continue
        peer_window = _window((out_bounds[peer], out_bounds[peer + 1]), kernel, stride, padding)
        send = _intersect(owned, (max(peer_window[0], 0), min(peer_window[1], size)))
        recv = _intersect(image_window, (bounds[peer], bounds[peer + 1]))
        sends += [(peer, send)] if send else []
        recvs += [(peer, recv)] if recv else []
    origin = min(owned[0], window[0])
    extent = max(owned[1], window[1]) - origin
    return AxisPlan(owned, outputs, window, image_window, (low, max(low, high)), origin, extent, sends, recvs)
