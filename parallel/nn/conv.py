"""Convolution and pooling layers for NCHW images: channels-last inside, patches in cache-sized chunks.

Same contract as `parallel.nn.layers` (``forward`` keeps what backward needs,
``backward`` writes the gradients in place and returns ``dx``). Images are NCHW
by shape, ``(batch, channels, height, width)``, but the layers keep their results
channels-last in memory (NHWC arrays returned as transposed views, as PyTorch's
``channels_last`` format): a convolution's GEMM then writes its output in place,
``(images * pixels, channels)``, with no transpose, and the next layer reads it
with no copy. Any NCHW-shaped array is accepted (a copy makes it channels-last).

The convolution works on chunks of images whose patch matrix has at most
`CHUNK_ELEMENTS` entries, built in one reused workspace, so that the patches, the
GEMM and the scatter of the input gradient stay in the core's cache; backward
builds each chunk's patches again from the kept input (a strided copy, cheaper
than keeping and re-reading the whole patch matrix from memory). With one input
channel (a network's first layer on grey images) the patches are the opposite
case: ``kh * kw`` values per pixel in ``kh * kw`` strided copies of whole image
rows, slower to rebuild than to re-read, so forward builds the whole batch's patch
matrix once (a new array per forward, so a pipeline's micro-batches each keep
their own) and backward reads it back.

Every function computes with the array module of its inputs
(`kernels.backend.array_module`), so images and weights on a device stay there
(``lib.stride_tricks.sliding_window_view``, ``matmul`` with ``out``, ``copyto``
with ``where``: NumPy and CuPy alike).
"""
import numpy as np

from kernels.backend import array_module
from kernels.errors import InputError
from parallel.nn.layers import Layer, he_normal

#: Entries of one chunk's patch matrix: 1 MiB in float32, within a core's L2 cache.
CHUNK_ELEMENTS = 1 << 18


def channels_last(x):
    """Return the NCHW-shaped ``x`` as a C-contiguous NHWC array (a view when its memory already is)."""
    return array_module(x).ascontiguousarray(x.transpose(0, 2, 3, 1))


def output_size(size, kernel, stride):
    """Outputs along an axis of ``size`` (padded) pixels: ``(size - kernel) // stride + 1``."""
    return (size - kernel) // stride + 1


def im2col(x, kernel, stride, out=None):
    """Write the patches of an NHWC array into the rows of a matrix (no padding); return it.

    ``x`` has shape ``(n, h, w, c)``, ``kernel = (kh, kw)``; the result ``cols`` has shape
    ``(n * ho * wo, kh * kw * c)``: row ``(i, p, q)`` is the window of image ``i`` at
    ``(p * stride, q * stride)`` in ``(kh, kw, c)`` order, ``ho = (h - kh) // stride + 1``.
    ``out`` (optional) is a matrix of that shape to fill, e.g. a view of a workspace, C-ordered
    or the transpose of a C-ordered one.
    One strided copy: its inner loop runs over ``kw * c`` contiguous elements.
    """
    xp = array_module(x)
    windows = xp.lib.stride_tricks.sliding_window_view(x, kernel, axis=(1, 2))[:, ::stride, ::stride]
    n, out_h, out_w, channels = windows.shape[:4]
    if out is None:
        out = xp.empty((n * out_h * out_w, kernel[0] * kernel[1] * channels), x.dtype)
    shape = (n, out_h, out_w, kernel[0], kernel[1], channels)
    target = (out.reshape(shape) if out.flags.c_contiguous
              else out.T.reshape(shape[3:] + shape[:3]).transpose(3, 4, 5, 0, 1, 2))
    target[...] = windows.transpose(0, 1, 2, 4, 5, 3)
    return out


def col2im_slabs(slabs, dx, kernel, stride):
    """Add the kernel offsets' input gradients back onto their pixels of the NHWC ``dx`` (in place).

    ``slabs`` has shape ``(kh * kw, n * ho * wo, c)``: slab ``i * kw + j`` holds the
    gradient reaching pixel ``(p * stride + i, q * stride + j)`` from output ``(p, q)``.
    ``kh * kw`` strided adds of whole slabs, each over contiguous runs of ``wo * c``
    elements when ``stride`` is 1 (the adjoint of `im2col` with the GEMM split by offset).
    """
    n, _, _, channels = dx.shape
    out_h, out_w = (output_size(size, k, stride) for size, k in zip(dx.shape[1:3], kernel))
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            dx[:, i:i + stride * out_h:stride, j:j + stride * out_w:stride] += \
                slabs[i * kernel[1] + j].reshape(n, out_h, out_w, channels)


def image_chunks(images, per_image):
    """``(start, stop)`` ranges of images whose patch matrices of ``per_image`` entries each fill at most
    `CHUNK_ELEMENTS` (at least one image per chunk)."""
    step = max(1, CHUNK_ELEMENTS // max(per_image, 1))
    return [(start, min(start + step, images)) for start in range(0, images, step)]


class Conv2d(Layer):
    """2D cross-correlation on NCHW images by im2col and GEMM, channels-last inside.

    ``Y[n, o, p, q] = b[o] + sum_{c,i,j} W[o, c, i, j] * Xpad[n, c, p*s + i, q*s + j]``
    with ``Xpad`` the input zero-padded by ``padding`` pixels on each side. With
    ``cols = im2col(Xpad)`` (NHWC, ``(kh, kw, c)`` order) and ``Wm`` the weights as
    ``(out_channels, kh * kw * c)``, forward is ``cols Wm^T + b`` (NHWC rows), by chunks
    of images; backward is ``dWm = dY^T cols`` and ``db = sum dY``, and, unless
    ``input_gradient`` is off, ``dXpad`` from the ``kh * kw`` products ``dY W[:, :, i, j]``
    added back by `col2im_slabs`, cropped to the unpadded input.

    Parameters
    ----------
    in_channels, out_channels : int
    kernel_size : int or tuple of int
    stride : int
    padding : int
        Zero pixels added on each side of both spatial axes.
    rng : int or numpy.random.Generator
        Seed or generator for the He-normal weights (fan-in ``in_channels * kh * kw``).
    dtype : numpy dtype
    input_gradient : bool
        Compute ``dx`` in backward (default). Off for a network's first layer, whose
        input gradient nothing reads: backward then returns None.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, rng=0, dtype=np.float32,
                 input_gradient=True):
        super().__init__()
        self.kernel = (kernel_size, kernel_size) if np.isscalar(kernel_size) else tuple(kernel_size)
        if stride < 1 or padding < 0 or min(self.kernel) < 1:
            raise InputError(f"Conv2d: need kernel >= 1, stride >= 1, padding >= 0; got "
                             f"{self.kernel}, {stride}, {padding}")
        self.stride, self.padding, self.input_gradient = stride, padding, input_gradient
        self.dtype = np.dtype(dtype)
        rng = np.random.default_rng(rng)
        fan_in = in_channels * self.kernel[0] * self.kernel[1]
        self._set_params(weight=he_normal(rng, (out_channels, in_channels) + self.kernel, fan_in, dtype),
                         bias=np.zeros(out_channels, dtype=dtype))
        self._workspace = self._slab_space = self._cols = None

    def _padded_input(self, x):
        """The input as a zero-padded NHWC array (the input's own memory when no copy is needed)."""
        xp = array_module(x)
        pad = self.padding
        if not pad:
            return channels_last(x)
        padded = xp.zeros((x.shape[0], x.shape[2] + 2 * pad, x.shape[3] + 2 * pad, x.shape[1]), self.dtype)
        padded[:, pad:pad + x.shape[2], pad:pad + x.shape[3]] = x.transpose(0, 2, 3, 1)
        return padded

    def _chunks(self):
        """Image ranges of the chunks of the kept input, its output pixels per image and patch length
        (one chunk of the whole batch with one input channel: its patches are kept)."""
        n, height, width, channels = self._x.shape
        out_h, out_w = (output_size(size, k, self.stride) for size, k in zip((height, width), self.kernel))
        patch = self.kernel[0] * self.kernel[1] * channels
        if channels == 1:
            return [(0, n)], out_h * out_w, patch
        chunks = image_chunks(n, out_h * out_w * patch)
        self._reserve("_workspace", (chunks[0][1] - chunks[0][0]) * out_h * out_w * patch)
        return chunks, out_h * out_w, patch

    def _reserve(self, name, size):
        """Keep a flat workspace of at least ``size`` elements of the layer's dtype in attribute ``name``."""
        space = getattr(self, name)
        if space is None or space.size < size or space.dtype != self.dtype:
            setattr(self, name, array_module(self._x).empty(size, self.dtype))

    def _patches(self, start, stop, pixels, patch):
        """The patch matrix ``(rows, patch)`` of images ``[start, stop)`` of the kept input, in the workspace.

        With one input channel it is the whole batch's, built by forward and kept (``_cols``),
        as the transpose of a C-ordered array (each kernel offset's pixels contiguous: the
        copy runs along image rows, not ``kw``-long runs); the GEMMs read either through
        BLAS's transpose flag.
        """
        if self._x.shape[3] == 1:
            return self._cols
        space = self._workspace[:(stop - start) * pixels * patch]
        return im2col(self._x[start:stop], self.kernel, self.stride, out=space.reshape(-1, patch))

    def forward(self, x):
        weight = self.params["weight"]
        xp = array_module(weight)
        x = xp.asarray(x, dtype=self.dtype)
        pad = self.padding
        if x.ndim != 4 or x.shape[1] != weight.shape[1] or \
                min(x.shape[2] + 2 * pad - self.kernel[0], x.shape[3] + 2 * pad - self.kernel[1]) < 0:
            raise InputError(f"Conv2d: expected input (batch, {weight.shape[1]}, h, w) with padded h, w "
                             f">= kernel {self.kernel}, got {x.shape} and padding {pad}")
        self._x = self._padded_input(x)
        chunks, pixels, patch = self._chunks()
        if x.shape[1] == 1:
            self._cols = im2col(self._x, self.kernel, self.stride, out=xp.empty((patch, x.shape[0] * pixels),
                                                                                self.dtype).T)
        out_h, out_w = (output_size(size, k, self.stride) for size, k in zip(self._x.shape[1:3], self.kernel))
        y = xp.empty((x.shape[0], out_h, out_w, weight.shape[0]), self.dtype)
        rows = y.reshape(-1, weight.shape[0])
        matrix = weight.transpose(0, 2, 3, 1).reshape(weight.shape[0], patch).T
        bias = xp.tile(self.params["bias"], pixels)
        for start, stop in chunks:
            out = rows[start * pixels:stop * pixels]
            xp.matmul(self._patches(start, stop, pixels, patch), matrix, out=out)
            out.reshape(stop - start, -1)[...] += bias
        return y.transpose(0, 3, 1, 2)

    def backward(self, dy):
        weight = self.params["weight"]
        xp = array_module(dy)
        out_channels = weight.shape[0]
        dy_rows = channels_last(xp.asarray(dy, dtype=self.dtype)).reshape(-1, out_channels)
        chunks, pixels, patch = self._chunks()
        dweight = xp.empty((out_channels, patch), self.dtype)
        part = xp.empty_like(dweight)
        if self.input_gradient:
            offsets = xp.ascontiguousarray(weight.transpose(2, 3, 0, 1)).reshape(-1, out_channels, weight.shape[1])
            dx = xp.zeros_like(self._x)
            self._reserve("_slab_space", offsets.shape[0] * chunks[0][1] * pixels * weight.shape[1])
        for start, stop in chunks:
            rows = dy_rows[start * pixels:stop * pixels]
            cols = self._patches(start, stop, pixels, patch)
            if cols.flags.c_contiguous:
                xp.matmul(rows.T, cols, out=part if start else dweight)
            else:    # a transposed workspace: the GEMM is faster with it on the left, dW^T = cols^T dY
                xp.matmul(cols.T, rows, out=(part if start else dweight).T)
            if start:
                dweight += part
            if self.input_gradient:
                chunk_slabs = self._slab_space[:offsets.shape[0] * rows.size // out_channels * weight.shape[1]].reshape(
                    offsets.shape[0], rows.shape[0], weight.shape[1])
                if weight.shape[1] == 1:    # one channel: one GEMM writes every offset's row of pixels
                    xp.matmul(offsets[:, :, 0], rows.T, out=chunk_slabs[:, :, 0])
                else:
                    xp.matmul(rows, offsets, out=chunk_slabs)
                col2im_slabs(chunk_slabs, dx[start:stop], self.kernel, self.stride)
        self.grads["weight"][...] = dweight.reshape(out_channels, self.kernel[0], self.kernel[1], -1).transpose(
            0, 3, 1, 2)
        dy_rows.reshape(-1, pixels * out_channels).sum(axis=0).reshape(pixels, out_channels).sum(
            axis=0, out=self.grads["bias"])
        if not self.input_gradient:
            return None
        pad = self.padding
        return dx[:, pad:dx.shape[1] - pad, pad:dx.shape[2] - pad].transpose(0, 3, 1, 2)


class MaxPool2d(Layer):
    """Max pooling over non-overlapping ``k x k`` windows (kernel = stride) of NCHW images.

    Rows and columns that do not fill a whole window are dropped (output size
    ``h // k``). Computed channels-last, one elementwise pass per window offset
    (``k * k`` strided views of the input), keeping the offset of each window's
    maximum (the first one on ties). Backward routes each output gradient to that
    position; all other inputs get zero (also where ``dy`` is NaN elsewhere in the
    window). The result is NHWC memory viewed as NCHW, like `Conv2d`'s.
    """

    def __init__(self, kernel_size):
        super().__init__()
        if kernel_size < 1:
            raise InputError(f"MaxPool2d: kernel_size must be >= 1, got {kernel_size}")
        self.k = kernel_size

    def forward(self, x):
        if x.ndim != 4 or min(x.shape[2:]) < self.k:
            raise InputError(f"MaxPool2d: expected NCHW input with h, w >= {self.k}, got {x.shape}")
        xp = array_module(x)
        self._x_shape = x.shape
        k, image = self.k, channels_last(x)
        out_h, out_w = x.shape[2] // k, x.shape[3] // k
        views = [image[:, i:out_h * k:k, j:out_w * k:k] for i in range(k) for j in range(k)]
        out = xp.ascontiguousarray(views[0])
        # The offsets grow, so the last one to beat the running maximum is the first maximum.
        self._argmax = xp.zeros(out.shape, np.uint8)
        for offset, view in enumerate(views[1:], 1):
            xp.maximum(self._argmax, (view > out).view(np.uint8) * np.uint8(offset), out=self._argmax)
            xp.maximum(out, view, out=out)
        return out.transpose(0, 3, 1, 2)

    def backward(self, dy):
        xp = array_module(dy)
        n, channels, height, width = self._x_shape
        k, (out_h, out_w) = self.k, dy.shape[2:]
        dy = dy.transpose(0, 2, 3, 1)
        crop = (out_h * k, out_w * k) != (height, width)
        dx = (xp.zeros if crop else xp.empty)((n, height, width, channels), dy.dtype)
        finite = bool(xp.isfinite(dy).all())
        for offset in range(k * k):
            view, mine = dx[:, offset // k:out_h * k:k, offset % k:out_w * k:k], self._argmax == offset
            if finite:    # a product by the mask is several times faster than where
                xp.multiply(dy, mine, out=view)
            else:         # 0 * nan is nan: route a non-finite gradient to its maximum only
                view[...] = xp.where(mine, dy, xp.zeros((), dy.dtype))
        return dx.transpose(0, 3, 1, 2)
