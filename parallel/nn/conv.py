"""The convolution layer for NCHW images: channels-last inside, patches in cache-sized chunks.

Same contract as `parallel.nn.layers` (``forward`` keeps what backward needs,
``backward`` writes the gradients in place and returns ``dx``). Images are NCHW
by shape, ``(batch, channels, height, width)``, but this layer and max pooling
(`parallel.nn.pooling`) keep their results
channels-last in memory (NHWC arrays returned as transposed views, as PyTorch's
``channels_last`` format): a convolution's GEMM then writes its output in place,
``(images * pixels, channels)``, with no transpose, and the next layer reads it
with no copy. Any NCHW-shaped array is accepted (a copy makes it channels-last).

The convolution works on chunks of images whose patch matrix has at most
`CHUNK_ELEMENTS` entries, built in one reused workspace, so that the patches, the
GEMM and the scatter of the input gradient stay in the core's cache; backward
builds each chunk's patches again from the kept input (a strided copy, cheaper
than keeping and re-reading the whole patch matrix from memory). With one input
channel (a network's first layer on grey images) the workspace holds the
transposed patch matrix, so the copy runs along image rows, and the thin GEMMs
(``n k`` = 250 or 288) are cut into row blocks that OpenBLAS's small-matrix
kernels take (`row_blocks`): 2-3x faster than one long product.

On the host a layer splits its batch over the rank's threads
(`parallel.nn.threads.host_threads`, `parallel.nn.threads.split_over_threads`): each
part runs its own chunks, with its own workspaces and one BLAS thread, and backward
adds the parts' sums of the weight and bias gradients; one thread (or too little
work), one part.

Every function computes with the array module of its inputs
(`kernels.backend.array_module`), so images and weights on a device stay there
(``lib.stride_tricks.sliding_window_view``, ``matmul`` with ``out``: NumPy and
CuPy alike).
"""
import math

import numpy as np

from kernels.backend import array_module
from kernels.errors import InputError
from parallel.nn.layers import Layer, he_normal
from parallel.nn.threads import GEMM_SPEEDUP, host_threads, split_over_threads

#: Entries of one chunk's patch matrix: 2 MiB in float32, a core's L2 cache here (measured best of 2**17-2**20 on both CNNs).
CHUNK_ELEMENTS = 1 << 19

#: Largest ``m n k`` of a GEMM that OpenBLAS runs on its small-matrix kernels (SkylakeX), with no packing:
#: 2-3x faster on a first layer's thin products (``n k`` = 250 or 288), so those are cut into row blocks.
SMALL_GEMM = 10 ** 6

#: Fewest rows of such a block: products wider than ``SMALL_GEMM / THIN_ROWS`` are left whole.
THIN_ROWS = 1024


def channels_last(x):
    """Return the NCHW-shaped ``x`` as a C-contiguous NHWC array (a view when its memory already is)."""
    return array_module(x).ascontiguousarray(x.transpose(0, 2, 3, 1))


def output_size(size, kernel, stride):
    """Outputs along an axis of ``size`` (padded) pixels: ``(size - kernel) // stride + 1``."""
    return (size - kernel) // stride + 1


def patch_windows(x, kernel, stride):
    """The patches of an NHWC array as a view ``(n, ho, wo, kh, kw, c)`` (no padding, no copy).

    Entry ``[i, p, q]`` is the window of image ``i`` at ``(p * stride, q * stride)``;
    ``ho = (h - kh) // stride + 1``. `copy_patches` writes chunks of it into a matrix.
    """
    windows = array_module(x).lib.stride_tricks.sliding_window_view(x, kernel, axis=(1, 2))
    return windows[:, ::stride, ::stride].transpose(0, 1, 2, 4, 5, 3)


def copy_patches(windows, out):
    """Copy the `patch_windows` view ``windows`` ``(n, ho, wo, kh, kw, c)`` into the matrix ``out``
    ``(n * ho * wo, kh * kw * c)``, C-ordered or the transpose of a C-ordered one (a view of a
    workspace); return ``out``. One strided copy: its inner loop runs over ``kw * c`` contiguous
    elements (C-ordered) or along image rows (transposed)."""
    shape = windows.shape
    target = (out.reshape(shape) if out.flags.c_contiguous
              else out.T.reshape(shape[3:] + shape[:3]).transpose(3, 4, 5, 0, 1, 2))
    target[...] = windows
    return out


def im2col(x, kernel, stride, out=None):
    """Write the patches of an NHWC array into the rows of a matrix (no padding); return it.

    ``x`` has shape ``(n, h, w, c)``, ``kernel = (kh, kw)``; the result ``cols`` has shape
    ``(n * ho * wo, kh * kw * c)``: row ``(i, p, q)`` is the window of image ``i`` at
    ``(p * stride, q * stride)`` in ``(kh, kw, c)`` order, ``ho = (h - kh) // stride + 1``.
    ``out`` (optional) is a matrix of that shape to fill, e.g. a view of a workspace, C-ordered
    or the transpose of a C-ordered one (`copy_patches`).
    """
    windows = patch_windows(x, kernel, stride)
    if out is None:
        out = array_module(x).empty((math.prod(windows.shape[:3]), math.prod(windows.shape[3:])), x.dtype)
    return copy_patches(windows, out)


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


def row_blocks(xp, rows, width):
    """``(start, stop)`` blocks of ``rows`` rows for GEMMs whose other two sizes multiply to ``width``: blocks
    of at most `SMALL_GEMM` ``m n k`` on the host when that leaves at least `THIN_ROWS` rows, else one."""
    step = SMALL_GEMM // max(width, 1)
    if xp is not np or step < THIN_ROWS:
        return [(0, rows)]
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def image_chunks(start, stop, per_image):
    """``(start, stop)`` ranges of the images ``[start, stop)`` whose patch matrices of ``per_image`` entries
    each fill at most `CHUNK_ELEMENTS` (at least one image per chunk)."""
    step = max(1, CHUNK_ELEMENTS // max(per_image, 1))
    return [(first, min(first + step, stop)) for first in range(start, stop, step)]


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
        self._workspaces, self._slab_spaces = [], []

    def _padded_input(self, x):
        """The input as a zero-padded NHWC array (the input's own memory when no copy is needed)."""
        xp = array_module(x)
        pad = self.padding
        if not pad:
            return channels_last(x)
        padded = xp.zeros((x.shape[0], x.shape[2] + 2 * pad, x.shape[3] + 2 * pad, x.shape[1]), self.dtype)
        padded[:, pad:pad + x.shape[2], pad:pad + x.shape[3]] = x.transpose(0, 2, 3, 1)
        return padded

    def _geometry(self):
        """Output pixels per image of the kept input and its patch length."""
        out_h, out_w = (output_size(size, k, self.stride) for size, k in zip(self._x.shape[1:3], self.kernel))
        return out_h * out_w, self.kernel[0] * self.kernel[1] * self._x.shape[3]

    def _reserve(self, spaces, part, size):
        """Flat workspace ``part`` of the list ``spaces`` (one per thread's part), at least ``size`` elements."""
        space = spaces[part]
        if space is None or space.size < size or space.dtype != self.dtype:
            spaces[part] = space = array_module(self._x).empty(size, self.dtype)
        return space

    def _patches(self, part, windows, start, stop, pixels, patch):
        """The patch matrix ``(rows, patch)`` of images ``[start, stop)`` of the kept input, built from its
        `patch_windows` in part ``part``'s workspace.

        With one input channel (a network's first layer on grey images) the workspace holds its
        transpose, C-ordered (each kernel offset's pixels contiguous: the copy runs along image
        rows, not ``kw``-long runs); the GEMMs read either through BLAS's transpose flag.
        """
        size = (stop - start) * pixels * patch
        space = self._reserve(self._workspaces, part, size)[:size]
        matrix = space.reshape(patch, -1).T if self._x.shape[3] == 1 else space.reshape(-1, patch)
        return copy_patches(windows[start:stop], matrix)

    def _work(self, products):
        """The work of ``products`` GEMMs over the kept input's patch matrix and as many builds of it
        (`parallel.nn.threads.split_over_threads`' unit)."""
        pixels, patch = self._geometry()
        entries = len(self._x) * pixels * patch
        return products * (entries + entries * self.params["weight"].shape[0] // GEMM_SPEEDUP)

    def _parts(self, threads):
        """Make room for one workspace per part of ``threads``; return ``threads``."""
        for spaces in (self._workspaces, self._slab_spaces):
            spaces += [None] * (threads - len(spaces))
        return threads

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
        pixels, patch = self._geometry()
        out_h, out_w = (output_size(size, k, self.stride) for size, k in zip(self._x.shape[1:3], self.kernel))
        y = xp.empty((x.shape[0], out_h, out_w, weight.shape[0]), self.dtype)
        rows = y.reshape(-1, weight.shape[0])
        matrix = weight.transpose(0, 2, 3, 1).reshape(weight.shape[0], patch).T
        bias = xp.tile(self.params["bias"], pixels)
        windows = patch_windows(self._x, self.kernel, self.stride)

        def correlate(part, start, stop):
            for first, last in image_chunks(start, stop, pixels * patch):
                out, cols = rows[first * pixels:last * pixels], self._patches(part, windows, first, last, pixels, patch)
                for low, high in row_blocks(xp, len(out), matrix.size):
                    xp.matmul(cols[low:high], matrix, out=out[low:high])
                out.reshape(last - first, -1)[...] += bias

        split_over_threads(x.shape[0], correlate, self._parts(host_threads(x)), self._work(1), blas=True)
        return y.transpose(0, 3, 1, 2)

    def backward(self, dy):
        weight = self.params["weight"]
        xp = array_module(dy)
        out_channels, in_channels = weight.shape[:2]
        dy_rows = channels_last(xp.asarray(dy, dtype=self.dtype)).reshape(-1, out_channels)
        pixels, patch = self._geometry()
        windows = patch_windows(self._x, self.kernel, self.stride)
        if self.input_gradient:
            offsets = xp.ascontiguousarray(weight.transpose(2, 3, 0, 1)).reshape(-1, out_channels, in_channels)
            dx = xp.empty_like(self._x)

        def gradients(part, start, stop):
            """This part's sums of ``dWm`` and of ``db`` by pixel; its images' ``dXpad``."""
            dweight, product = xp.zeros((out_channels, patch), self.dtype), xp.empty((out_channels, patch), self.dtype)
            if self.input_gradient:
                dx[start:stop] = 0
            for first, last in image_chunks(start, stop, pixels * patch):
                rows = dy_rows[first * pixels:last * pixels]
                cols = self._patches(part, windows, first, last, pixels, patch)
                for low, high in row_blocks(xp, len(rows), product.size):
                    xp.matmul(rows[low:high].T, cols[low:high], out=product)
                    dweight += product
                if self.input_gradient:
                    size = offsets.shape[0] * len(rows) * in_channels
                    slabs = self._reserve(self._slab_spaces, part, size)[:size].reshape(offsets.shape[0], len(rows),
                                                                                       in_channels)
                    if in_channels == 1:    # one channel: one GEMM writes every offset's row of pixels
                        xp.matmul(offsets[:, :, 0], rows.T, out=slabs[:, :, 0])
                    else:
                        xp.matmul(rows, offsets, out=slabs)
                    col2im_slabs(slabs, dx[first:last], self.kernel, self.stride)
            return dweight, dy_rows[start * pixels:stop * pixels].reshape(-1, pixels * out_channels).sum(axis=0)

        parts = split_over_threads(len(self._x), gradients, self._parts(host_threads(dy)),
                                   self._work(2 + self.input_gradient), blas=True)
        dweight, dbias = (sum(values[1:], values[0]) for values in zip(*parts))
        self.grads["weight"][...] = dweight.reshape(out_channels, self.kernel[0], self.kernel[1], -1).transpose(
            0, 3, 1, 2)
        dbias.reshape(pixels, out_channels).sum(axis=0, out=self.grads["bias"])
        if not self.input_gradient:
            return None
        pad = self.padding
        return dx[:, pad:dx.shape[1] - pad, pad:dx.shape[2] - pad].transpose(0, 3, 1, 2)
