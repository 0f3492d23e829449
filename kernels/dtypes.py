"""Element types the BLAS-level kernels accept, and the types they compute in.

Every kernel of ``blas1``, ``gemv`` and ``gemm`` accepts the native-byte-order
types of `SUPPORTED` and gives what its serial NumPy reference gives (dtype, and
value up to rounding; integers exactly, wrapping on overflow as NumPy does). Any
other type (bool, int8, unsigned, longdouble, object, byte-swapped ...) raises a
one-line TypeError before any communication, on every rank holding it.

Blocks travel in their own type; products and partial sums are formed in
`accumulator` (float16 in float32, so that neither a partial sum beyond
65504 nor the rounding of every partial spoils a float16 result) and rounded to
the input type once, at the end. Scalars reduced over ranks (dot, nrm2) travel
in `reduction`: float64, complex128 or int64.
"""
import numpy as np

SUPPORTED = tuple(np.dtype(name) for name in
                  ("float16", "float32", "float64", "complex64", "complex128", "int32", "int64"))


def check_dtype(dtype, what):
    """Return ``dtype`` as a NumPy dtype; TypeError (one line) unless it is in `SUPPORTED`."""
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED:
        raise TypeError(f"{what}: dtype {dtype} is not supported; "
                        f"use one of {', '.join(map(str, SUPPORTED))}")
    return dtype


def accumulator(dtype):
    """Type products and partial sums of ``dtype`` blocks are computed in: float32 for float16, else ``dtype``."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def reduction(dtype):
    """Type a partial scalar of ``dtype`` is reduced in over ranks: int64, complex128 or float64."""
    return np.dtype({"i": np.int64, "c": np.complex128}.get(np.dtype(dtype).kind, np.float64))


def norm_dtype(dtype):
    """Type of ``numpy.linalg.norm`` of a ``dtype`` vector: float64 for integers, the real part's type else."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float64) if dtype.kind == "i" else np.empty(0, dtype).real.dtype
