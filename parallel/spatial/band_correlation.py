"""Convolution of a band of output rows by batched GEMMs on strided views: no patch matrix.

With 16 channels a patch matrix costs as much to copy as its GEMM. Instead a band's input
rows are copied once, rows outermost, then channels, then columns (`interleave`), so
that the ``kh * c`` inputs a kernel column multiplies for one output row form a
matrix with one leading dimension, a view (`column_windows`). Forward is then ``kw``
batched GEMMs ``(c_out, kh c) @ (kh c, wo)`` per band, one per kernel column and
output row, the first writing the NCHW output rows in place, the others' products
added (`correlate`); ``dW`` the same windows times ``dy``'s rows (a view); ``dX`` the
correlation of ``dy``, zero-padded and dilated by the stride, with the flipped
kernel: an interleaved band of ``dy``, the same GEMMs, no col2im. With OpenBLAS's
small-matrix kernels (SkylakeX: ``m n k <= 10**6``, 16 x 48 x 1024 here) these GEMMs
run without packing.

Every function computes with the array module of its arguments (``as_strided``,
``matmul`` with ``out``: NumPy and CuPy alike). Used by `parallel.spatial.halo_conv`.
"""
from kernels.backend import array_module


def kernel_columns(weight):
    """The kernel ``(c_out, c_in, kh, kw)`` as ``kw`` matrices ``(c_out, kh * c_in)``, one per kernel column:
    entry ``[o, i * c_in + c]`` of matrix ``j`` is ``weight[o, c, i, j]`` (a contiguous copy)."""
    c_out, c_in, kh, kw = weight.shape
    return array_module(weight).ascontiguousarray(weight.transpose(3, 0, 2, 1)).reshape(kw, c_out, kh * c_in)


def interleave(source, band, kernel_width, stride):
    """Copy ``source`` ``(n, c, rows, cols)`` into the first ``n`` images and ``rows`` rows of ``band``
    ``(n, rows, c, phases, width)``: image rows outermost, then a row's channels, its columns split by
    phase, ``band[:, t, c, r, u] = source[:, c, t, u * stride + r]`` (``min(stride, kw)`` phases of
    ``wo + (kw - 1) // stride`` columns)."""
    batch, _, rows = source.shape[:3]
    phases, width = band.shape[3:]
    out_width = width - (kernel_width - 1) // stride
    for phase in range(phases):
        count = out_width + (kernel_width - 1 - phase) // stride
        band[:batch, :rows, :, phase, :count] = source[:, :, :, phase::stride][:, :, :, :count].transpose(0, 2, 1, 3)


def column_windows(band, kernel, stride, out_shape):
    """Per kernel column ``j``, the inputs it multiplies as a view ``(n, ho, kh * c, wo)`` of ``band``: entry
    ``[n, p, i * c + ch, q]`` is ``source[n, ch, p * stride + i, q * stride + j]`` (the `interleave` source).
    Kernel row ``i`` lies ``i`` band rows, ``i * c`` channel rows, further on: each ``(kh * c, wo)``
    matrix has a single leading dimension and unit column stride, as BLAS needs."""
    strides, (kh, kw) = band.strides, kernel
    shape = (band.shape[0], out_shape[0], kh * band.shape[2], out_shape[1])
    return [array_module(band).lib.stride_tricks.as_strided(
        band[:, :, :, column % stride, column // stride:], shape=shape,
        strides=(strides[0], stride * strides[1], strides[2], strides[4])) for column in range(kw)]


def correlate(target, windows, weight_columns, product, add=False, bias=None):
    """Write the cross-correlation whose `column_windows` are ``windows`` into ``target`` ``(n, c_out, ho, wo)``
    (plus ``bias`` ``(c_out,)`` if given), or, with ``add``, add it to ``target``.

    ``weight_columns`` is the kernel as `kernel_columns` gives it, ``product`` a scratch array of
    ``target.size`` elements. One batched GEMM per kernel column, ``(c_out, kh c) @ (kh c, wo)`` for
    each output row: the first writes ``target`` itself unless ``add``, the others' products are added.
    """
    xp = array_module(target)
    rows = target.transpose(0, 2, 1, 3)
    product = product.reshape(rows.shape)
    for column, (matrix, window) in enumerate(zip(weight_columns, windows)):
        if column == 0 and not add and rows.strides[3] == rows.itemsize:    # BLAS writes the rows in place
            xp.matmul(matrix, window, out=rows)
            continue
        xp.matmul(matrix, window, out=product)
        if column == 0 and not add:
            rows[...] = product
        else:
            rows += product
    if bias is not None:
        rows += bias[:, None]
