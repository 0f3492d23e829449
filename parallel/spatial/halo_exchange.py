"""The halo exchange of a convolution on tiles of a 2D process grid.

Each rank's buffer holds its tile and the input window its outputs read, as
planned by `parallel.spatial.tile_layout.plan_axis` (layout and ownership rules in
`parallel.spatial.tile_layout`). The exchange runs in two phases: along grid axis 0 (rows
of the own columns), then along axis 1 (columns of all the window's rows, halo
rows included, which carries the corners). Each phase posts ``Irecv`` and
``Isend`` to every rank along the axis whose tile meets the halo (the two
neighbours, or more when tiles are thinner than the halo). The reverse exchange
(backward pass) sends halo contributions back along axis 1, then axis 0, and the
owners add them.

Devices: on a grid made from `kernels.backend.Backend.comm` the buffer and the
packed halos are device arrays of the buffer's module; the `kernels.comm.device.DeviceComm`
synchronises (and stages) every message, and requests complete through
`kernels.comm.device.wait_all` / `poll_all`. Subarray datatypes need a
CUDA-aware MPI there: a staged receive would copy the whole buffer back.
"""
from mpi4py import MPI
from mpi4py.util.dtlib import from_numpy_dtype

from kernels.backend import array_module
from kernels.comm import backend_of
from kernels.comm.device import poll_all, wait_all
from kernels.errors import InputError
from parallel.spatial.tile_layout import plan_axis

#: Message packing: "packed" copies halos into contiguous buffers; "subarray" sends
#: straight from the tile buffer with MPI subarray datatypes (received sums still
#: land in a contiguous buffer, since MPI cannot add on receipt). Packed is the
#: default: measured faster with the MPICH wheel on 2 ranks, 16 channels, 3x3, for
#: 1024^2 tiles by 1.5x (row halos) to 3.5x (column halos, one element per row),
#: and as fast or faster for 128^2 tiles.
PACKING_METHODS = ("packed", "subarray")
DEFAULT_PACKING = "packed"
HALO_TAG = 11


class _Phase:
    """The messages of one axis of an exchange, for buffers of one shape and dtype.

    ``sends`` and ``recvs`` hold ``(peer, region)``, a region being the buffer's
    ``(rows, cols)`` slices. In reverse the roles swap and received data is added.
    """

    def __init__(self, comm, sends, recvs, shape, dtype, method, reverse, xp):
        if reverse:
            sends, recvs = recvs, sends
        self.comm, self.reverse = comm, reverse
        self.sends = [(peer, region, self._describe(region, shape, dtype, method, xp)) for peer, region in sends]
        receive_method = "packed" if reverse else method
        self.recvs = [(peer, region, self._describe(region, shape, dtype, receive_method, xp))
                      for peer, region in recvs]

    @staticmethod
    def _describe(region, shape, dtype, method, xp):
        """A contiguous ``xp`` array of the region's shape ("packed"), or a committed subarray datatype."""
        sub = shape[:2] + tuple(piece.stop - piece.start for piece in region)
        if method == "packed":
            return xp.empty(sub, dtype)
        starts = [0, 0] + [piece.start for piece in region]
        return from_numpy_dtype(dtype).Create_subarray(list(shape), list(sub), starts).Commit()

    def start(self, buffer):
        requests = [self.comm.Irecv(self._message(buffer, spec), peer, HALO_TAG) for peer, _, spec in self.recvs]
        for peer, region, spec in self.sends:
            if not isinstance(spec, MPI.Datatype):
                spec[...] = buffer[(Ellipsis,) + region]
            requests.append(self.comm.Isend(self._message(buffer, spec), peer, HALO_TAG))
        return requests

    def complete(self, buffer, requests):
        wait_all(requests)
        for _, region, spec in self.recvs:
            if self.reverse:
                buffer[(Ellipsis,) + region] += spec
            elif not isinstance(spec, MPI.Datatype):
                buffer[(Ellipsis,) + region] = spec

    @staticmethod
    def _message(buffer, spec):
        return [buffer, 1, spec] if isinstance(spec, MPI.Datatype) else spec

    def free(self):
        for _, _, spec in self.sends + self.recvs:
            if isinstance(spec, MPI.Datatype):
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
        self._arrived = poll_all(self._requests)

    def finish(self):
        """Complete every remaining phase."""
        while self.advance():
            pass


class HaloExchange:
    """The halo exchange of one convolution on one rank of a 2D grid.

    Global input ``(n, c, H, W)`` laid out by ``layout``; this rank's buffer is
    ``(n, c, rows.extent, cols.extent)`` and holds its tile and its window (see
    `parallel.spatial.tile_layout`). Cost of one exchange per rank, forward or reverse:
    2 phases of up to 2 messages each (more when tiles are thinner than the halo),
    ``T = 4 alpha + beta * halo_bytes(n, c, itemsize)`` with halo rows ``h_lo + h_hi``
    of the tile width, then halo columns ``w_lo + w_hi`` of the window height.

    Parameters
    ----------
    grid : kernels.distribution.ProcessGrid
        A 2D grid whose ``dims`` equal ``layout.dims``.
    layout : parallel.spatial.tile_layout.TileLayout
        Layout of the convolution's input.
    kernel : (int, int)
    stride, padding : int
        Stride and zero padding of both axes, ``2 * padding <= min(kernel) - 1``.
    method : str
        One of `PACKING_METHODS`; "subarray" on a staging `kernels.comm.device.DeviceComm`
        (device, MPI not CUDA-aware) is an `InputError`.

    Attributes
    ----------
    rows, cols : parallel.spatial.tile_layout.AxisPlan
    out_layout : parallel.spatial.tile_layout.TileLayout
    seconds : float
        Wall time spent inside the exchange (packing, posting, waiting, unpacking).
    """

    def __init__(self, grid, layout, kernel, stride, padding, method=DEFAULT_PACKING):
        if method not in PACKING_METHODS:
            raise InputError(f"unknown packing method {method!r}; choose from {', '.join(PACKING_METHODS)}")
        if tuple(grid.dims) != layout.dims:
            raise InputError(f"layout for a {layout.dims} grid used on a {grid.dims} grid")
        backend = backend_of(grid.cart)
        if method == "subarray" and backend is not None and not backend.device_buffers_to_mpi:
            raise InputError("halo packing 'subarray' on a device needs a CUDA-aware MPI (MLSCALE_CUDA_AWARE=1): "
                             "a staged receive would copy the whole tile back; use 'packed'")
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

        ``buffer`` has `buffer_shape` and is C-contiguous (NumPy, or a device array
        on a device grid); forward, its tile must be filled; reverse, its halo
        regions hold the contributions to send back.
        """
        if buffer.ndim != 4 or buffer.shape[2:] != (self.rows.extent, self.cols.extent) or \
                not buffer.flags.c_contiguous:
            raise InputError(f"halo exchange: need a C-contiguous buffer of shape {self.buffer_shape('n', 'c')}, "
                             f"got {buffer.shape}")
        xp = array_module(buffer)
        key = (buffer.shape, buffer.dtype.str, reverse, xp.__name__)
        if key not in self._phases:
            self._phases[key] = [_Phase(comm, sends, recvs, buffer.shape, buffer.dtype, self.method, reverse, xp)
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
