"""Max pooling for NCHW images, channels-last inside as `parallel.nn.conv.Conv2d` (its batch split over the
rank's host threads, `parallel.nn.threads`; on a device with the array module of its input)."""
import numpy as np

from kernels.backend import array_module
from kernels.errors import InputError
from parallel.nn.conv import channels_last
from parallel.nn.layers import Layer
from parallel.nn.threads import host_threads, split_over_threads


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
        out = xp.empty((x.shape[0], out_h, out_w, x.shape[1]), x.dtype)
        self._argmax = xp.empty(out.shape, np.uint8)

        def pool(part, start, stop):
            views = [image[start:stop, i:out_h * k:k, j:out_w * k:k] for i in range(k) for j in range(k)]
            best, argmax = out[start:stop], self._argmax[start:stop]
            best[...] = views[0]
            argmax.fill(0)
            greater, candidate = xp.empty(best.shape, bool), xp.empty(best.shape, np.uint8)
            # The offsets grow, so the last one to beat the running maximum is the first maximum.
            for offset, view in enumerate(views[1:], 1):
                xp.greater(view, best, out=greater)
                xp.maximum(argmax, xp.multiply(greater.view(np.uint8), np.uint8(offset), out=candidate), out=argmax)
                xp.maximum(best, view, out=best)

        split_over_threads(x.shape[0], pool, host_threads(x), 3 * x.size)
        return out.transpose(0, 3, 1, 2)

    def backward(self, dy):
        xp = array_module(dy)
        n, channels, height, width = self._x_shape
        k, (out_h, out_w) = self.k, dy.shape[2:]
        dy = dy.transpose(0, 2, 3, 1)
        dx = xp.empty((n, height, width, channels), dy.dtype)

        def route(part, start, stop):
            grad, argmax, image = dy[start:stop], self._argmax[start:stop], dx[start:stop]
            image[:, out_h * k:], image[:, :, out_w * k:] = 0, 0    # rows and columns no window covers
            finite, mine = bool(xp.isfinite(grad).all()), xp.empty(grad.shape, bool)
            for offset in range(k * k):
                view = image[:, offset // k:out_h * k:k, offset % k:out_w * k:k]
                xp.equal(argmax, offset, out=mine)
                if finite:    # a product by the mask is several times faster than where
                    xp.multiply(grad, mine, out=view)
                else:         # 0 * nan is nan: route a non-finite gradient to its maximum only
                    view[...] = xp.where(mine, grad, xp.zeros((), grad.dtype))

        split_over_threads(n, route, host_threads(dy), 2 * dx.size)
        return dx.transpose(0, 3, 1, 2)
