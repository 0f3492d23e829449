"""Spatial decomposition of NCHW tensors over a 2D process grid, and the halo exchange of a convolution.

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

The exchange runs in two phases: along grid axis 0 (rows of the own columns),
then along axis 1 (columns of all the window's rows, halo rows included, which
carries the corners). Each phase posts ``Irecv`` and ``Isend`` to every rank along
the axis whose tile meets the halo (the two neighbours, or more when tiles are
thinner than the halo). The reverse exchange (backward pass) sends halo
contributions back along axis 1, then axis 0, and the owners add them.
"""
from dataclasses import dataclass
from typing import Tuple

import numpy as np
from mpi4py import MPI
from mpi4py.util.dtlib import from_numpy_dtype

from kernels.distribution import block_offsets
from kernels.errors import InputError

#: Message packing: "packed" copies halos into contiguous buffers; "subarray" sends
#: straight from the tile buffer with MPI subarray datatypes (received sums still
#: land in a contiguous buffer, since MPI cannot add on receipt). Packed is the
#: default: measured faster with the MPICH wheel on 2 ranks, 16 channels, 3x3, for
#: 1024^2 tiles by 1.5x (row halos) to 3.5x (column halos, one element per row),
#: and as fast or faster for 128^2 tiles.
PACKING_METHODS = ("packed", "subarray")
DEFAULT_PACKING = "packed"
HALO_TAG = 11


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


class _Phase:
    """The messages of one axis of an exchange, for buffers of one shape and dtype.

    ``sends`` and ``recvs`` hold ``(peer, region)``, a region being the buffer's
    ``(rows, cols)`` slices. In reverse the roles swap and received data is added.
    """

    def __init__(self, comm, sends, recvs, shape, dtype, method, reverse):
        if reverse:
            sends, recvs = recvs, sends
        self.comm, self.reverse = comm, reverse
        self.sends = [(peer, region, self._describe(region, shape, dtype, method)) for peer, region in sends]
        receive_method = "packed" if reverse else method
        self.recvs = [(peer, region, self._describe(region, shape, dtype, receive_method)) for peer, region in recvs]

    @staticmethod
    def _describe(region, shape, dtype, method):
        """A contiguous array of the region's shape ("packed"), or a committed subarray datatype."""
        sub = shape[:2] + tuple(piece.stop - piece.start for piece in region)
        if method == "packed":
            return np.empty(sub, dtype)
        starts = [0, 0] + [piece.start for piece in region]
        return from_numpy_dtype(dtype).Create_subarray(list(shape), list(sub), starts).Commit()

    def start(self, buffer):
        requests = [self.comm.Irecv(self._message(buffer, spec), peer, HALO_TAG) for peer, _, spec in self.recvs]
        for peer, region, spec in self.sends:
            if isinstance(spec, np.ndarray):
                np.copyto(spec, buffer[(Ellipsis,) + region])
            requests.append(self.comm.Isend(self._message(buffer, spec), peer, HALO_TAG))
        return requests

    def complete(self, buffer, requests):
        MPI.Request.Waitall(requests)
        for _, region, spec in self.recvs:
            if self.reverse:
                buffer[(Ellipsis,) + region] += spec
            elif isinstance(spec, np.ndarray):
                buffer[(Ellipsis,) + region] = spec

    @staticmethod
    def _message(buffer, spec):
        return spec if isinstance(spec, np.ndarray) else [buffer, 1, spec]

    def free(self):
        for _, _, spec in self.sends + self.recvs:
            if not isinstance(spec, np.ndarray):
                spec.Free()


class Exchange:
    """A halo exchange in flight: phases run one after the other, the caller computes in between."""

    def __init__(self, owner, buffer, phases):
        self._owner, self._buffer, self._phases = owner, buffer, list(phases)
        self._requests, self._arrived = None, False
        self._timed(self._start_next)

    def _timed(self, work):
        start = MPI.Wtime()
        work()
        self._owner.seconds += MPI.Wtime() - start

    def _start_next(self):
        self._requests = self._phases[0].start(self._buffer) if self._phases else None
        self._arrived = not self._requests

    def _complete_and_start_next(self):
        self._phases.pop(0).complete(self._buffer, self._requests)
        self._start_next()

    def advance(self):
        """Complete the phase in flight and start the next; return whether a phase is still in flight."""
        if self._requests is not None:
            self._timed(self._complete_and_start_next)
        return self._requests is not None

    def progress(self):
        """Let MPI move the phase in flight (large messages need calls on both sides to advance)."""
        if not self._arrived:
            self._timed(self._test)

    def _test(self):
        self._arrived = MPI.Request.Testall(self._requests)

    def finish(self):
        """Complete every remaining phase."""
        while self.advance():
            pass


class HaloExchange:
    """The halo exchange of one convolution on one rank of a 2D grid.

    Global input ``(n, c, H, W)`` laid out by ``layout``; this rank's buffer is
    ``(n, c, rows.extent, cols.extent)`` and holds its tile and its window (see
    the module docstring). Cost of one exchange per rank, forward or reverse:
    2 phases of up to 2 messages each (more when tiles are thinner than the halo),
    ``T = 4 alpha + beta * halo_bytes(n, c, itemsize)`` with halo rows ``h_lo + h_hi``
    of the tile width, then halo columns ``w_lo + w_hi`` of the window height.

    Parameters
    ----------
    grid : kernels.distribution.ProcessGrid
        A 2D grid whose ``dims`` equal ``layout.dims``.
    layout : TileLayout
        Layout of the convolution's input.
    kernel : (int, int)
    stride, padding : int
        Stride and zero padding of both axes, ``2 * padding <= min(kernel) - 1``.
    method : str
        One of `PACKING_METHODS`.

    Attributes
    ----------
    rows, cols : AxisPlan
    out_layout : TileLayout
    seconds : float
        Wall time spent inside the exchange (packing, posting, waiting, unpacking).
    """

    def __init__(self, grid, layout, kernel, stride, padding, method=DEFAULT_PACKING):
        if method not in PACKING_METHODS:
            raise InputError(f"unknown packing method {method!r}; choose from {', '.join(PACKING_METHODS)}")
        if tuple(grid.dims) != layout.dims:
            raise InputError(f"layout for a {layout.dims} grid used on a {grid.dims} grid")
        self.grid, self.method, self.seconds = grid, method, 0.0
        self.out_layout = out = layout.conv_output(kernel, stride, padding)
        self.rows, self.cols = (plan_axis(bounds, out_bounds, index, k, stride, padding)
                                for bounds, out_bounds, index, k in zip((layout.row_bounds, layout.col_bounds),
                                                                        (out.row_bounds, out.col_bounds),
                                                                        grid.coords, kernel))
        self.tile_region = (self.rows.local(self.rows.owned), self.cols.local(self.cols.owned))
        self._phases = {}

    def buffer_shape(self, batch, channels):
        return batch, channels, self.rows.extent, self.cols.extent

    def _phase_regions(self):
        """Per phase: the axis communicator and ``(peer, region)`` sends and receives."""
        rows, cols = self.rows, self.cols
        own_cols, window_rows = cols.local(cols.owned), rows.local(rows.image_window)
        along_rows = [[(peer, (rows.local(span), own_cols)) for peer, span in spans]
                      for spans in (rows.sends, rows.recvs)]
        along_cols = [[(peer, (window_rows, cols.local(span))) for peer, span in spans]
                      for spans in (cols.sends, cols.recvs)]
        return [(self.grid.axis_comms[0], along_rows), (self.grid.axis_comms[1], along_cols)]

    def start(self, buffer, reverse=False):
        """Start filling ``buffer``'s halos from the owners (or, ``reverse``, adding them back); return the `Exchange`.

        ``buffer`` has `buffer_shape` and is C-contiguous; forward, its tile must be
        filled; reverse, its halo regions hold the contributions to send back.
        """
        if buffer.ndim != 4 or buffer.shape[2:] != (self.rows.extent, self.cols.extent) or \
                not buffer.flags.c_contiguous:
            raise InputError(f"halo exchange: need a C-contiguous buffer of shape {self.buffer_shape('n', 'c')}, "
                             f"got {buffer.shape}")
        key = (buffer.shape, buffer.dtype.str, reverse)
        if key not in self._phases:
            self._phases[key] = [_Phase(comm, sends, recvs, buffer.shape, buffer.dtype, self.method, reverse)
                                 for comm, (sends, recvs) in self._phase_regions()]
        phases = self._phases[key]
        return Exchange(self, buffer, reversed(phases) if reverse else phases)

    def halo_bytes(self, batch, channels, itemsize):
        """Bytes this rank receives in one forward exchange (the reverse sends as many back)."""
        regions = [region for _, (_, recvs) in self._phase_regions() for _, region in recvs]
        return batch * channels * itemsize * sum((r.stop - r.start) * (c.stop - c.start) for r, c in regions)

    def free(self):
        """Free the MPI datatypes (the exchange can still be used: they are rebuilt on demand)."""
        for phases in self._phases.values():
            for phase in phases:
                phase.free()
        self._phases = {}
