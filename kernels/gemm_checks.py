"""Operand checks shared by the distributed GEMMs (`kernels.gemm`, `kernels.gemm_summa`, `kernels.gemm_cannon`)."""
import math

from kernels.distmatrix import require_same_layout
from kernels.dtypes import check_dtype
from kernels.errors import InputError


def check_product(A, B, what):
    """``(m, n)`` of ``C = A B``; InputError unless A, B share a layout and dtype and ``k`` agrees.

    TypeError when the dtype is not one of `kernels.dtypes.SUPPORTED`. Raised before
    any communication, on every rank (layouts, shapes and dtypes agree across ranks).
    """
    require_same_layout(A, B, what)
    if A.shape[1] != B.shape[0]:
        raise InputError(f"{what}: A is {A.shape[0]}x{A.shape[1]} but B is {B.shape[0]}x{B.shape[1]}")
    check_dtype(A.dtype, what)
    return A.shape[0], B.shape[1]


def square_grid(A, B, what, layered):
    """Side ``q`` of the ``q x q`` grid (``q x q x c`` when ``layered``) the operands live on."""
    check_product(A, B, what)
    dims = A.grid.dims if A.grid is not None else None
    if dims is None or len(dims) != 2 + layered or dims[0] != dims[1]:
        shape = "q x q x c" if layered else "square q x q"
        square = math.isqrt(A.comm.size) ** 2 == A.comm.size
        raise InputError(f"{what} needs a {shape} ProcessGrid, got "
                         f"{'x'.join(map(str, dims)) if dims else A.layout} on {A.comm.size} ranks"
                         + ("" if square or layered else f" ({A.comm.size} is not a perfect square)"))
    return dims[0]
