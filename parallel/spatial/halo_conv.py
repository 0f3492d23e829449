"""Domain-parallel convolution: every feature map split in tiles over a 2D grid, halos exchanged.

`HaloConv2d` runs a serial `parallel.nn.conv.Conv2d` (sharing its parameter arrays)
on the tile of each rank: it copies the tile into a local buffer, fills the halos
with `parallel.spatial.halo_exchange.HaloExchange`, and convolves the buffer by im2col and
GEMM in chunks of rows (memory stays bounded whatever the tile). Backward computes
``dW`` and the buffer's ``dX`` (halos included), sends the halo part of ``dX`` back
to its owners, who add it (the reverse exchange), and sums ``dW`` and ``db`` over
the grid with one ``Allreduce``. With ``overlap=True`` the interior outputs (those
whose window needs no halo) are computed while the halos are in flight, the
border after; backward does the border first so that the halo gradients can leave
early.

Devices: move the serial layer first (``conv.to(backend)``, or `HaloConv2d.to`)
and build the grid from `kernels.backend.Backend.comm`; buffers, patch matrices
and the gradient sum are then device arrays of the parameters' module.
"""
from mpi4py import MPI

from kernels.backend import array_module
from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.spatial.halo_exchange import DEFAULT_PACKING, HaloExchange
from parallel.nn.layers import Layer

#: Entries of one chunk's patch matrix: 2 MB in float64, so that it stays in cache.
CHUNK_ELEMENTS = 1 << 18
#: Interior pieces computed while the halos fly: one per exchange phase.
OVERLAP_PIECES = 2


def conv_padding(mode, kernel_size):
    """Zero padding of a ``mode`` convolution: 'same' ``k // 2`` (odd ``k`` only), 'valid' 0."""
    if mode == "valid":
        return 0
    if mode == "same" and kernel_size % 2:
        return kernel_size // 2
    raise InputError(f"padding {mode!r} with kernel {kernel_size}: choose 'valid', or 'same' with an odd kernel")


def window_view(x, kernel, stride):
    """The windows of ``x`` ``(n, c, h, w)`` as a strided view ``(n, c, ho, wo, kh, kw)`` (no copy)."""
    return array_module(x).lib.stride_tricks.sliding_window_view(x, kernel, axis=(2, 3))[:, :, ::stride, ::stride]


def patch_matrix(windows, workspace):
    """Copy ``windows`` ``(n, c, ho, wo, kh, kw)`` into the flat ``workspace`` as the *columns* of a
    ``(c * kh * kw, n * ho * wo)`` matrix; return that matrix (a view of the workspace).

    The transpose of `parallel.nn.conv.im2col`'s layout: each row is one kernel
    offset of one channel, copied with long contiguous inner loops (image rows), and
    ``W.reshape(c_out, -1) @ cols`` comes out channel-major, ready for NCHW.
    """
    batch, channels, out_h, out_w, kh, kw = windows.shape
    cols = workspace[:windows.size].reshape(channels, kh, kw, batch, out_h, out_w)
    cols[...] = windows.transpose(1, 4, 5, 0, 2, 3)
    return cols.reshape(channels * kh * kw, -1)


def add_patch_matrix(dx, cols, kernel, stride):
    """Adjoint of `patch_matrix`: add every column of ``cols`` back onto its window of ``dx`` (in place)."""
    batch, channels, height, width = dx.shape
    out_h, out_w = (height - kernel[0]) // stride + 1, (width - kernel[1]) // stride + 1
    blocks = cols.reshape(channels, kernel[0], kernel[1], batch, out_h, out_w)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            dx[:, :, i:i + stride * out_h:stride, j:j + stride * out_w:stride] += blocks[:, i, j].transpose(1, 0, 2, 3)


def _idle():
    """No exchange in flight: nothing to progress."""


def _nonempty(region):
    return all(lo < hi for lo, hi in region)


class HaloConv2d(Layer):
    """A serial `Conv2d` run on the tiles of a 2D grid with halo exchange.

    Global input ``(n, c_in, H, W)`` split by ``layout``; local input: this rank's
    tile ``(n, c_in, h, w)``; local output: its tile of ``out_layout`` (outputs
    belong to the owner of their anchor input ``o * stride``, see
    `parallel.spatial.tile_layout`). Forward: one halo exchange (`HaloExchange`).
    Backward: one reverse exchange plus ``Allreduce`` of ``c_out * (c_in k^2 + 1)``
    words over the grid, ``2 log2(p) alpha + 2 (p-1)/p * bytes * beta``.

    Parameters
    ----------
    conv : parallel.nn.conv.Conv2d
        The serial layer: kernel, stride, padding (``2 * padding <= k - 1``) and the
        parameter and gradient arrays, which this layer shares.
    grid : kernels.distribution.ProcessGrid
        2D grid with ``dims == layout.dims``.
    layout : parallel.spatial.tile_layout.TileLayout
    overlap : bool
        Compute the interior while the halos are in flight.
    method : str
        Halo packing, one of `parallel.spatial.halo_exchange.PACKING_METHODS`.
    """

    def __init__(self, conv, grid, layout, overlap=False, method=DEFAULT_PACKING):
        super().__init__()
        self.conv, self.grid, self.overlap = conv, grid, overlap
        self.params, self.grads = conv.params, conv.grads
        self.exchange = HaloExchange(grid, layout, conv.kernel, conv.stride, conv.padding, method)
        self.in_layout, self.out_layout = layout, self.exchange.out_layout
        self.in_shape = layout.tile_shape(grid.coords)
        self.out_shape = self.out_layout.tile_shape(grid.coords)
        self._input = self._grad = self._patches = self._products = None

    def to(self, backend):
        """Move the serial layer's parameters and gradients (which this layer shares) to ``backend``."""
        self.conv.to(backend)
        self.params, self.grads = self.conv.params, self.conv.grads
        self._input = self._grad = self._patches = self._products = None
        return self

    def _check(self, array, channels, shape, what):
        array = array_module(self.conv.params["weight"]).asarray(array, dtype=self.conv.dtype)
        if array.ndim != 4 or array.shape[1] != channels or array.shape[2:] != shape:
            raise InputError(f"HaloConv2d: expected {what} tile (batch, {channels}, {shape[0]}, {shape[1]}), "
                             f"got {array.shape}")
        return array

    def _buffer(self, current, batch):
        shape = self.exchange.buffer_shape(batch, self.conv.params["weight"].shape[1])
        if current is not None and current.shape == shape:
            return current
        return array_module(self.conv.params["weight"]).zeros(shape, self.conv.dtype)

    def _regions(self):
        """``(interior pieces, border regions)``: global output ranges ``((r0, r1), (c0, c1))``."""
        rows, cols = self.exchange.rows, self.exchange.cols
        whole = (rows.outputs, cols.outputs)
        interior = (rows.interior, cols.interior)
        if not self.overlap or not _nonempty(interior):
            return [], [whole]
        (ia, ib), (ja, jb) = interior
        (oa, ob), (qa, qb) = whole
        pieces = [((ia + lo, ia + hi), (ja, jb)) for lo, hi in
                  (block_range(ib - ia, OVERLAP_PIECES, index) for index in range(OVERLAP_PIECES))]
        border = [((oa, ia), (qa, qb)), ((ib, ob), (qa, qb)), ((ia, ib), (qa, ja)), ((ia, ib), (jb, qb))]
        return [r for r in pieces if _nonempty(r)], [r for r in border if _nonempty(r)]

    def _slices(self, region):
        """Buffer slices of the input window of ``region`` and output-tile slices of ``region``."""
        stride, pad = self.conv.stride, self.conv.padding
        axes = (self.exchange.rows, self.exchange.cols)
        window = tuple(axis.local((lo * stride - pad, (hi - 1) * stride - pad + k))
                       for axis, (lo, hi), k in zip(axes, region, self.conv.kernel))
        output = tuple(slice(lo - axis.outputs[0], hi - axis.outputs[0]) for axis, (lo, hi) in zip(axes, region))
        return (Ellipsis,) + window, (Ellipsis,) + output

    def _run(self, buffer, reverse, work):
        """Exchange ``buffer``'s halos and call ``work(region, progress)`` on every region, overlapped when asked.

        ``progress`` is to be called between chunks: it lets the halos in flight move.
        """
        pieces, border = self._regions()
        for region in border if reverse else ():
            work(region, _idle)
        exchange = self.exchange.start(buffer, reverse)
        for piece in pieces:
            work(piece, exchange.progress)
            exchange.advance()
        exchange.finish()
        for region in () if reverse else border:
            work(region, _idle)

    def forward(self, x):
        weight = self.conv.params["weight"]
        x = self._check(x, weight.shape[1], self.in_shape, "input")
        self._input = self._buffer(self._input, x.shape[0])
        self._input[(Ellipsis,) + self.exchange.tile_region] = x
        y = array_module(weight).empty((x.shape[0], weight.shape[0]) + self.out_shape, self.conv.dtype)
        self._run(self._input, False, lambda region, progress: self._forward_region(y, region, progress))
        return y

    def _bands(self, region, batch):
        """``(row offset in the region, output rows)`` of the bands of output rows whose patch matrix has at
        most `CHUNK_ELEMENTS` entries; a workspace for the patches and one for a band's GEMM result."""
        (r0, r1), cols = region
        weight = self.conv.params["weight"]
        per_row = batch * (cols[1] - cols[0])
        step = max(1, CHUNK_ELEMENTS // (per_row * weight[0].size))
        rows = min(step, r1 - r0) * per_row
        for name, size in (("_patches", rows * weight[0].size), ("_products", rows * max(weight[0].size, len(weight)))):
            space = getattr(self, name)
            if space is None or space.size < size or space.dtype != weight.dtype:
                setattr(self, name, array_module(weight).empty(size, weight.dtype))
        return [(start - r0, min(start + step, r1) - start) for start in range(r0, r1, step)]

    def _forward_region(self, y, region, progress):
        weight = self.conv.params["weight"]
        matrix, bias = weight.reshape(weight.shape[0], -1), self.conv.params["bias"][:, None]
        window, output = self._slices(region)
        windows, out = window_view(self._input[window], self.conv.kernel, self.conv.stride), y[output]
        for start, height in self._bands(region, y.shape[0]):
            cols = patch_matrix(windows[:, :, start:start + height], self._patches)
            product = self._products[:weight.shape[0] * cols.shape[1]].reshape(weight.shape[0], -1)
            array_module(weight).matmul(matrix, cols, out=product)
            product += bias
            out[:, :, start:start + height] = product.reshape(weight.shape[0], y.shape[0], height, -1).transpose(
                1, 0, 2, 3)
            progress()

    def backward(self, dy):
        weight = self.conv.params["weight"]
        dy = self._check(dy, weight.shape[0], self.out_shape, "output gradient")
        self._grad = self._buffer(self._grad, dy.shape[0])
        self._grad.fill(0)
        xp = array_module(weight)
        local = xp.zeros(weight.size + weight.shape[0], self.conv.dtype)
        dweight = local[:weight.size].reshape(weight.shape[0], -1)
        self._run(self._grad, True, lambda region, progress: self._backward_region(dy, dweight, region, progress))
        dy.sum(axis=(0, 2, 3), out=local[weight.size:])
        total = xp.empty_like(local)
        self.grid.cart.Allreduce(local, total, op=MPI.SUM)
        self.grads["weight"][...] = total[:weight.size].reshape(weight.shape)
        self.grads["bias"][...] = total[weight.size:]
        return self._grad[(Ellipsis,) + self.exchange.tile_region].copy()

    def _backward_region(self, dy, dweight, region, progress):
        xp = array_module(dweight)
        matrix = self.conv.params["weight"].reshape(dweight.shape)
        kernel, stride = self.conv.kernel, self.conv.stride
        window, output = self._slices(region)
        windows, grad, dy = window_view(self._input[window], kernel, stride), self._grad[window], dy[output]
        part = xp.empty_like(dweight)
        for start, height in self._bands(region, dy.shape[0]):
            rows = xp.ascontiguousarray(dy[:, :, start:start + height].transpose(1, 0, 2, 3)).reshape(
                dweight.shape[0], -1)
            xp.matmul(rows, patch_matrix(windows[:, :, start:start + height], self._patches).T, out=part)
            dweight += part
            products = self._products[:matrix.shape[1] * rows.shape[1]].reshape(matrix.shape[1], -1)
            xp.matmul(matrix.T, rows, out=products)
            add_patch_matrix(grad[:, :, start * stride:(start + height - 1) * stride + kernel[0]], products, kernel,
                             stride)
            progress()
