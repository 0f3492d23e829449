"""Convolution layers for NCHW images, in matrix form: patches as matrix rows (im2col), then GEMM.

Same contract as `parallel.nn.layers` (``forward`` keeps what backward needs,
``backward`` writes the gradients in place and returns ``dx``). Images are NCHW:
``(batch, channels, height, width)``. Every function computes with the array
module of its inputs (`kernels.backend.array_module`), so images and weights on
a device stay there: im2col is a strided view (``lib.stride_tricks.sliding_window_view``,
in NumPy and CuPy alike) copied once into the patch matrix.
"""
import numpy as np

from kernels.backend import array_module
from kernels.errors import InputError
from parallel.nn.layers import Layer, he_normal


def im2col(x, kernel, stride):
    """Return the patches of an NCHW array as the rows of one matrix (no padding).

    Returns ``cols`` of shape ``(n * ho * wo, c * kh * kw)`` for ``x`` of shape
    ``(n, c, h, w)`` and ``kernel = (kh, kw)``: row ``(i, p, q)`` is the window of image
    ``i`` at ``(p * stride, q * stride)`` in ``(c, kh, kw)`` order; ``ho = (h - kh) // stride + 1``.
    """
    n, channels = x.shape[:2]
    windows = array_module(x).lib.stride_tricks.sliding_window_view(x, kernel, axis=(2, 3))[:, :, ::stride, ::stride]
    out_h, out_w = windows.shape[2:4]
    return windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * out_h * out_w, channels * kernel[0] * kernel[1])


def col2im(cols, x_shape, kernel, stride):
    """Adjoint of `im2col`: sum each row of ``cols`` back onto the pixels of its window.

    ``x_shape`` is the ``(n, c, h, w)`` shape `im2col` was applied to; returns an
    array of that shape. Loops over the ``kh * kw`` kernel offsets only (each a
    strided, vectorised add), never over pixels.
    """
    n, channels, height, width = x_shape
    out_h, out_w = (height - kernel[0]) // stride + 1, (width - kernel[1]) // stride + 1
    patches = cols.reshape(n, out_h, out_w, channels, kernel[0], kernel[1]).transpose(0, 3, 4, 5, 1, 2)
    dx = array_module(cols).zeros(x_shape, dtype=cols.dtype)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            dx[:, :, i:i + stride * out_h:stride, j:j + stride * out_w:stride] += patches[:, :, i, j]
    return dx


class Conv2d(Layer):
    """2D cross-correlation on NCHW images by im2col and one GEMM.

    ``Y[n, o, p, q] = b[o] + sum_{c,i,j} W[o, c, i, j] * Xpad[n, c, p*s + i, q*s + j]``
    with ``Xpad`` the input zero-padded by ``padding`` pixels on each side. With
    ``cols = im2col(Xpad)`` and ``Wm = W.reshape(out_channels, -1)``, forward is
    ``cols Wm^T + b``; backward is ``dWm = dY^T cols``, ``db = sum dY`` and
    ``dXpad = col2im(dY Wm)``, cropped to the unpadded input.

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
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, rng=0, dtype=np.float32):
        super().__init__()
        self.kernel = (kernel_size, kernel_size) if np.isscalar(kernel_size) else tuple(kernel_size)
        if stride < 1 or padding < 0 or min(self.kernel) < 1:
            raise InputError(f"Conv2d: need kernel >= 1, stride >= 1, padding >= 0; got "
                             f"{self.kernel}, {stride}, {padding}")
        self.stride, self.padding = stride, padding
        self.dtype = np.dtype(dtype)
        rng = np.random.default_rng(rng)
        fan_in = in_channels * self.kernel[0] * self.kernel[1]
        self._set_params(weight=he_normal(rng, (out_channels, in_channels) + self.kernel, fan_in, dtype),
                         bias=np.zeros(out_channels, dtype=dtype))

    def forward(self, x):
        weight = self.params["weight"]
        xp = array_module(weight)
        x = xp.asarray(x, dtype=self.dtype)
        pad = self.padding
        if x.ndim != 4 or x.shape[1] != weight.shape[1] or \
                min(x.shape[2] + 2 * pad - self.kernel[0], x.shape[3] + 2 * pad - self.kernel[1]) < 0:
            raise InputError(f"Conv2d: expected input (batch, {weight.shape[1]}, h, w) with padded h, w "
                             f">= kernel {self.kernel}, got {x.shape} and padding {pad}")
        padded = xp.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))) if pad else x
        self._padded_shape = padded.shape
        self._cols = im2col(padded, self.kernel, self.stride)
        n = x.shape[0]
        out_h = (padded.shape[2] - self.kernel[0]) // self.stride + 1
        out_w = (padded.shape[3] - self.kernel[1]) // self.stride + 1
        y = self._cols @ weight.reshape(weight.shape[0], -1).T + self.params["bias"]
        return y.reshape(n, out_h, out_w, -1).transpose(0, 3, 1, 2)

    def backward(self, dy):
        weight = self.params["weight"]
        dy_rows = dy.transpose(0, 2, 3, 1).reshape(-1, weight.shape[0])
        array_module(dy).matmul(dy_rows.T, self._cols, out=self.grads["weight"].reshape(weight.shape[0], -1))
        dy_rows.sum(axis=0, out=self.grads["bias"])
        dx = col2im(dy_rows @ weight.reshape(weight.shape[0], -1), self._padded_shape, self.kernel, self.stride)
        pad = self.padding
        return dx[:, :, pad:dx.shape[2] - pad, pad:dx.shape[3] - pad] if pad else dx


class MaxPool2d(Layer):
    """Max pooling over non-overlapping ``k x k`` windows (kernel = stride) of NCHW images.

    Rows and columns that do not fill a whole window are dropped (output size
    ``h // k``). Backward routes each output gradient to the position of its
    window's maximum (the first one on ties); all other inputs get zero (also
    where ``dy`` is NaN elsewhere in the window).
    """

    def __init__(self, kernel_size):
        super().__init__()
        if kernel_size < 1:
            raise InputError(f"MaxPool2d: kernel_size must be >= 1, got {kernel_size}")
        self.k = kernel_size

    def _windows(self, x):
        """Return ``x`` cropped to whole windows as ``(n, c, ho, wo, k * k)``."""
        n, channels, height, width = x.shape
        out_h, out_w, k = height // self.k, width // self.k, self.k
        cropped = x[:, :, :out_h * k, :out_w * k]
        return cropped.reshape(n, channels, out_h, k, out_w, k).transpose(0, 1, 2, 4, 3, 5).reshape(
            n, channels, out_h, out_w, k * k)

    def forward(self, x):
        if x.ndim != 4 or min(x.shape[2:]) < self.k:
            raise InputError(f"MaxPool2d: expected NCHW input with h, w >= {self.k}, got {x.shape}")
        self._x_shape = x.shape
        windows = self._windows(x)
        self._argmax = windows.argmax(axis=-1)[..., None]
        return array_module(x).take_along_axis(windows, self._argmax, axis=-1)[..., 0]

    def backward(self, dy):
        n, channels, out_h, out_w = dy.shape
        k = self.k
        xp = array_module(dy)
        routed = xp.where(xp.arange(k * k) == self._argmax, dy[..., None], 0)
        dx = xp.zeros(self._x_shape, dtype=dy.dtype)
        dx[:, :, :out_h * k, :out_w * k] = routed.reshape(n, channels, out_h, out_w, k, k).transpose(
            0, 1, 2, 4, 3, 5).reshape(n, channels, out_h * k, out_w * k)
        return dx
