"""Domain-parallel convolution: every feature map split in tiles over a 2D grid, halos exchanged.

`HaloConv2d` runs a serial `parallel.nn.conv.Conv2d` (sharing its parameter arrays)
on the tile of each rank: it copies the tile into a local buffer, fills the halos
with `parallel.spatial.halo_exchange.HaloExchange`, and convolves the buffer in
bands of output rows (memory stays bounded whatever the tile). Backward computes
``dW`` and the buffer's ``dX`` (halos included), sends the halo part of ``dX`` back
to its owners, who add it (the reverse exchange), and sums ``dW`` and ``db`` over
the grid with one ``Allreduce``. With ``overlap=True`` the interior outputs (those
whose window needs no halo) are computed while the halos are in flight, the
border after; backward does the border first so that the halo gradients can leave
early.

No patch matrix: each band of output rows is computed by the batched GEMMs of
`parallel.spatial.band_correlation` (forward, ``dW``, and ``dX`` as the correlation of
the padded, stride-dilated ``dy`` with the flipped kernel: no col2im). Narrow strips
(a split column axis' border) run transposed.

Devices: move the serial layer first (``conv.to(backend)``, or `HaloConv2d.to`)
and build the grid from `kernels.backend.Backend.comm`; buffers, bands and the
gradient sum are then device arrays of the parameters' module (``as_strided``,
``matmul`` with ``out``: NumPy and CuPy alike).
"""
import math

from mpi4py import MPI

from kernels.backend import array_module
from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.spatial.band_correlation import column_windows, correlate, interleave, kernel_columns
from parallel.spatial.halo_exchange import DEFAULT_PACKING, HaloExchange
from parallel.nn.layers import Layer

#: Entries of one band (`interleave`): 512 KiB in float32, so that the band, a GEMM's product
#: and the output rows it adds to stay in a core's L2 cache (2 MiB here).
CHUNK_ELEMENTS = 1 << 17
#: Interior pieces computed while the halos fly: one per exchange phase.
OVERLAP_PIECES = 2
#: Regions with fewer output columns than this (and more rows), such as the border strips of a split
#: column axis, are computed transposed (`HaloConv2d._turned`): one GEMM per column, not per pixel row.
NARROW_COLUMNS = 32


def conv_padding(mode, kernel_size):
    """Zero padding of a ``mode`` convolution: 'same' ``k // 2`` (odd ``k`` only), 'valid' 0."""
    if mode == "valid":
        return 0
    if mode == "same" and kernel_size % 2:
        return kernel_size // 2
    raise InputError(f"padding {mode!r} with kernel {kernel_size}: choose 'valid', or 'same' with an odd kernel")


def _turn(array, turned):
    """The NCHW ``array`` with its two spatial axes swapped when ``turned``."""
    return array.transpose(0, 1, 3, 2) if turned else array


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
        self._input, self._spaces = None, {}

    def to(self, backend):
        """Move the serial layer's parameters and gradients (which this layer shares) to ``backend``."""
        self.conv.to(backend)
        self.params, self.grads = self.conv.params, self.conv.grads
        self._input, self._spaces = None, {}
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

    def _turned(self, region):
        """Whether ``region`` is a narrow strip (fewer than `NARROW_COLUMNS` columns, more rows), computed on
        transposed views so that its GEMMs run along its length; and the kernel in that orientation."""
        (r0, r1), (c0, c1) = region
        turned = c1 - c0 < min(r1 - r0, NARROW_COLUMNS)
        return turned, self.conv.kernel[::-1] if turned else self.conv.kernel

    def _bands(self, shape, batch, kernel_width):
        """``(bands, images, rows)``: the bands ``(images, first row, rows)`` of outputs ``shape`` ``(rows, cols)``,
        whole images (a slice of the batch) or rows of one image, as many as keep a band within
        `CHUNK_ELEMENTS` entries; and the most images and rows in one band."""
        stride = self.conv.stride
        per_row = stride * max(self.conv.params["weight"].shape[:2]) * ((shape[1] - 1) * stride + 2 * kernel_width)
        step, height = max(1, CHUNK_ELEMENTS // per_row), shape[0]
        if step >= height:
            images = min(batch, step // height)
            return [(slice(first, first + images), 0, height) for first in range(0, batch, images)], images, height
        return [(slice(image, image + 1), start, min(step, height - start))
                for image in range(batch) for start in range(0, height, step)], 1, step

    def _space(self, name, size):
        """At least ``size`` elements of scratch space ``name`` (reused from call to call), a flat array."""
        space, weight = self._spaces.get(name), self.conv.params["weight"]
        if space is None or space.size < size or space.dtype != weight.dtype:
            space = self._spaces[name] = array_module(weight).empty(size, weight.dtype)
        return space[:size]

    def _band(self, name, images, rows, channels, out_shape, kernel, stride):
        """A scratch `interleave` band for ``images`` and ``rows`` rows and its `column_windows`."""
        shape = (images, rows, channels, min(stride, kernel[1]), out_shape[1] + (kernel[1] - 1) // stride)
        band = self._space(name, math.prod(shape)).reshape(shape)
        return band, column_windows(band, kernel, stride, out_shape)

    def _interleaved(self, band, windows, source, images, start, rows, kernel):
        """`interleave` the input rows of output rows ``start...start + rows`` of ``images`` (a slice) into
        ``band``; return the ``windows`` of those outputs."""
        stride = self.conv.stride
        part = source[images, :, start * stride:(start + rows - 1) * stride + kernel[0]]
        interleave(part, band, kernel[1], stride)
        return [view[:part.shape[0], :rows] for view in windows]

    def forward(self, x):
        weight = self.conv.params["weight"]
        x = self._check(x, weight.shape[1], self.in_shape, "input")
        self._input = self._buffer(self._input, x.shape[0])
        self._input[(Ellipsis,) + self.exchange.tile_region] = x
        y = array_module(weight).empty((x.shape[0], weight.shape[0]) + self.out_shape, self.conv.dtype)
        columns = [kernel_columns(weight), kernel_columns(weight.transpose(0, 1, 3, 2))]
        self._run(self._input, False, lambda region, progress: self._forward_region(y, columns, region, progress))
        return y

    def _forward_region(self, y, weight_columns, region, progress):
        (turned, kernel), stride = self._turned(region), self.conv.stride
        window, output = self._slices(region)
        source, target = _turn(self._input[window], turned), _turn(y[output], turned)
        bands, images, height = self._bands(target.shape[2:], y.shape[0], kernel[1])
        band, windows = self._band("band", images, (height - 1) * stride + kernel[0], source.shape[1],
                                   (height, target.shape[3]), kernel, stride)
        for batch, start, rows in bands:
            part = target[batch, :, start:start + rows]
            correlate(part, self._interleaved(band, windows, source, batch, start, rows, kernel),
                      weight_columns[turned], self._space("product", part.size), bias=self.conv.params["bias"])
            progress()

    def backward(self, dy):
        """The input gradient is a view of a new buffer (the tile of its ``dX``), not a copy; None when the
        serial layer's ``input_gradient`` is off (then no reverse exchange either)."""
        weight = self.conv.params["weight"]
        c_out, c_in, kh, kw = weight.shape
        dy = self._check(dy, c_out, self.out_shape, "output gradient")
        xp = array_module(weight)
        grad = xp.zeros(self.exchange.buffer_shape(dy.shape[0], c_in), self.conv.dtype) \
            if self.conv.input_gradient else None
        local = xp.zeros(weight.size + c_out, self.conv.dtype)
        sums = local[:weight.size].reshape(kw, kh, c_in, c_out)     # dW[o, c, i, j] at [j, i, c, o]
        dweight = [list(sums), [sums[:, i] for i in range(kh)]]     # by kernel column; by kernel row (turned)
        flipped = weight[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
        flipped = [kernel_columns(flipped), kernel_columns(flipped.transpose(0, 1, 3, 2))]
        add = sum(map(len, self._regions())) > 1    # regions' windows overlap: add their input gradients
        if self.conv.input_gradient:
            self._run(grad, True, lambda region, progress: self._backward_region(
                dy, grad, dweight, flipped, add, region, progress))
        else:    # no input gradient (a first layer): the weight gradient alone, no reverse exchange
            for region in sum(self._regions(), []):
                self._backward_region(dy, None, dweight, flipped, add, region, _idle)
        dy.sum(axis=(0, 2, 3), out=local[weight.size:])
        total = xp.empty_like(local)
        self.grid.cart.Allreduce(local, total, op=MPI.SUM)
        self.grads["weight"][...] = total[:weight.size].reshape(kw, kh, c_in, c_out).transpose(3, 2, 1, 0)
        self.grads["bias"][...] = total[weight.size:]
        return None if grad is None else grad[(Ellipsis,) + self.exchange.tile_region]

    def _backward_region(self, dy, grad, dweight, flipped, add, region, progress):
        """Per band of ``region``'s outputs: ``dW += windows dy^T`` (`_add_weight_gradient`), and the rows of the
        window's input gradient that the band starts, from every output they need (`_padded_gradient`,
        then `correlate` with the flipped kernel); ``grad`` None: the weight gradient only."""
        (turned, kernel), stride = self._turned(region), self.conv.stride
        kh, (window, output) = kernel[0], self._slices(region)
        source, dy = _turn(self._input[window], turned), _turn(dy[output], turned)
        bands, images, height = self._bands(dy.shape[2:], dy.shape[0], kernel[1])
        band, windows = self._band("band", images, (height - 1) * stride + kh, source.shape[1],
                                   (height, dy.shape[3]), kernel, stride)
        if grad is not None:
            grad = _turn(grad[window], turned)
            grad_rows = max(height * stride, (height - 1) * stride + kh)
            padded, padded_windows = self._band("padded", images, grad_rows + kh - 1, dy.shape[1],
                                                (grad_rows, grad.shape[3]), kernel, 1)
        for batch, start, rows in bands:
            self._add_weight_gradient(dweight[turned], self._interleaved(band, windows, source, batch, start, rows,
                                                                         kernel), dy[batch, :, start:start + rows])
            if grad is None:
                continue
            first = start * stride
            stop = grad.shape[2] if start + rows == dy.shape[2] else (start + rows) * stride
            self._padded_gradient(padded, dy[batch], kernel, first, stop)
            part = grad[batch, :, first:stop]
            correlate(part, [view[:part.shape[0], :stop - first] for view in padded_windows], flipped[turned],
                      self._space("product", part.size), add=add)
            progress()

    def _add_weight_gradient(self, sums, windows, dy):
        """``sums[j] += windows[j] dy^T`` summed over ``dy``'s images and rows (``sums[j]`` ``(kh, c_in, c_out)``):
        ``kw`` batched GEMMs ``(kh c_in, wo) @ (wo, c_out)``, one per output row, ``dy``'s rows
        transposed (a view; a copy in a turned strip, whose columns are not contiguous)."""
        xp = array_module(dy)
        rows = dy.transpose(0, 2, 3, 1)
        if rows.strides[2] != rows.itemsize:
            rows = xp.ascontiguousarray(rows)
        part = self._space("part", rows.shape[0] * rows.shape[1] * sums[0].size).reshape(
            rows.shape[:2] + (-1, rows.shape[3]))
        for total, window in zip(sums, windows):
            xp.matmul(window, rows, out=part)
            total += part.sum(axis=(0, 1)).reshape(total.shape)

    def _padded_gradient(self, padded, dy, kernel, first, stop):
        """Fill ``padded`` (a stride-1 band) with the outputs ``dy`` that window rows ``first...stop`` receive
        gradient from, zero-padded by ``k - 1`` and dilated by the stride: its correlation with the
        flipped kernel is those rows' input gradient."""
        (kh, kw), stride = kernel, self.conv.stride
        batch, _, out_h, out_w = dy.shape
        lo, hi = max(0, -(-(first - kh + 1) // stride)), min(out_h, -(-stop // stride))
        rows = padded[:batch, :stop - first + kh - 1]
        rows.fill(0)
        row = kh - 1 + lo * stride - first
        rows[:, row:row + (hi - lo - 1) * stride + 1:stride, :, 0, kw - 1:kw + (out_w - 1) * stride:stride] = \
            dy[:, :, lo:hi].transpose(0, 2, 1, 3)
