"""Distributed BLAS level 1: dot, nrm2 and axpy on block-distributed vectors.

A vector of global length ``n`` on ``p`` ranks is held as one local 1D array per
rank: rank ``r`` holds entries ``block_range(n, p, r)`` (any ``n``, blocks may be
empty). The serial references are ``np.dot``, ``np.linalg.norm`` and ``y + a x``
(computed on the host as BLAS computes it, `add_scaled`);
each routine returns the type its reference returns. The element types are those
of `kernels.dtypes.SUPPORTED` (float16/32/64, complex64/128, int32/64; the same
on every rank); others raise TypeError. Local work is done in
`kernels.dtypes.accumulator` (float16 in float32), partial scalars are reduced
in `kernels.dtypes.reduction` (float64, complex128, or int64 so that integer
dot products are exact, wrapping as NumPy's do).

Device blocks (CuPy) are computed on the device with the blocks' array module;
``comm`` is then the backend's wrapper (`kernels.backend.Backend.comm`), which
stages the few reduced words through the host. On a device, ``dot`` and
``nrm2`` return 0-d device arrays, as ``cupy.dot`` and ``cupy.linalg.norm`` do.
"""
import numbers

import numpy as np
from mpi4py import MPI
from scipy.linalg.blas import get_blas_funcs

from kernels.backend import array_module
from kernels.distmatrix import as_block, timed
from kernels.dtypes import accumulator, check_dtype, norm_dtype, reduction
from kernels.errors import InputError


def _local_vector(x, what):
    x = as_block(x)
    if x.ndim != 1:
        raise InputError(f"{what}: expected a 1D local vector block, got shape {x.shape}")
    check_dtype(x.dtype, what)
    return x


def _scalar_result(values, dtype, xp):
    """``values[0]`` as ``dtype``: a NumPy scalar on the host, a 0-d array on a device."""
    value = values[:1].astype(dtype).reshape(())
    return value[()] if xp is np else value


def dot(comm, x, y, timings=None):
    """Global dot product ``x . y`` (no conjugation, as ``np.dot``) of two vectors split the same way.

    Parameters
    ----------
    comm : MPI.Comm
    x, y : ndarray, local shape ``(n_r,)``
        This rank's blocks of two global vectors of length ``n``, of one supported dtype.
    timings : dict, optional
        ``"comm"`` and ``"compute"`` seconds are added to it.

    Returns
    -------
    scalar of the vectors' dtype, the same on every rank. float16 blocks are
    multiplied and summed in float32 (no partial sum overflows), integers summed
    in int64 (exact, wrapping like ``np.dot``); the result is rounded once.

    Notes
    -----
    One ``Allreduce`` of 2 words (the partial sum and a mismatch flag, so that a
    block of the wrong length or dtype on any rank raises InputError on every
    rank): ``log2(p) alpha + 2 log2(p) beta`` per rank; ``2 n / p`` flops.
    """
    x, y = _local_vector(x, "dot"), _local_vector(y, "dot")
    xp = array_module(x)
    mismatch = x.shape != y.shape or x.dtype != y.dtype
    wide = accumulator(x.dtype)
    with timed(timings, "compute", xp):
        partial = xp.zeros(2, dtype=reduction(x.dtype))
        if not mismatch:
            partial[0] = xp.dot(x.astype(wide, copy=False), y.astype(wide, copy=False))
        partial[1] = mismatch
    with timed(timings, "comm"):
        comm.Allreduce(MPI.IN_PLACE, partial, op=MPI.SUM)
    if partial[1]:
        raise InputError("dot: x and y blocks differ in length or dtype on some rank")
    return _scalar_result(partial, x.dtype, xp)


def nrm2(comm, x, timings=None):
    """Global Euclidean norm ``||x||_2`` without overflow or underflow.

    The global largest magnitude ``s`` is found first (an ``Allreduce`` MAX, with the
    longest block's length). Where no square can overflow or matter by underflowing
    (``sqrt(tiny) / eps <= s`` and ``s**2 * p * longest_block <= max / 2`` in the compute
    type, the same decision on every rank) the squares are summed as they are, one pass
    over ``x``; else the entries are divided by ``s`` first, so vectors with entries near
    1e200 (or 1e-200) give the right norm, as LAPACK's dnrm2 does with its scaling.

    Parameters
    ----------
    comm : MPI.Comm
    x : ndarray, local shape ``(n_r,)``
        This rank's block of a global vector of length ``n``, of one supported dtype.
    timings : dict, optional
        ``"comm"`` and ``"compute"`` seconds are added to it.

    Returns
    -------
    scalar of the type ``numpy.linalg.norm`` returns, the same on every rank:
    float64 for integer vectors, float32 for complex64, float64 for complex128,
    else ``x``'s dtype. Integers are computed in float64, float16 in float32
    (so ``nrm2(ones(70000, float16))`` is 264.5, where a float16 sum of squares
    would overflow), others in their own precision; the result is rounded once,
    and is inf only when the norm itself exceeds the type's range.

    Notes
    -----
    Two ``Allreduce``: MAX of 3 words (largest magnitude, NaN flag, block length), then
    SUM of 1 word: ``2 log2(p) alpha + 4 log2(p) beta`` per rank; about ``3 n / p`` flops,
    and three reads of the block when no scaling is needed (real types: max, min and the
    sum of squares; complex: ``abs`` makes one temporary). NaN anywhere gives NaN on every
    rank, an infinite entry gives inf.
    """
    x = _local_vector(x, "nrm2")
    xp, result = array_module(x), norm_dtype(x.dtype)
    with timed(timings, "compute", xp):
        work = x.astype(np.float64 if x.dtype.kind == "i" else accumulator(x.dtype), copy=False)
        scale = xp.zeros(3, dtype=np.float64)   # largest magnitude (NaN as 0), NaN flag, block length
        scale[2] = work.size
        if work.size:
            largest = xp.abs(work).max() if work.dtype.kind == "c" else xp.maximum(work.max(), -work.min())
            scale[0] = xp.fmax(largest, 0.0)
            scale[1] = xp.isnan(largest)
    with timed(timings, "comm"):
        comm.Allreduce(MPI.IN_PLACE, scale, op=MPI.MAX)
    largest, nan, longest = scale.tolist()
    if nan or largest == 0.0 or np.isinf(largest):
        return _scalar_result(xp.full(1, np.nan if nan else largest), result, xp)
    info = np.finfo(work.real.dtype)
    tiny, eps, most = float(info.tiny), float(info.eps), float(info.max)
    unscaled = tiny ** 0.5 / eps <= largest and largest * largest * comm.size * longest <= most / 2
    with timed(timings, "compute", xp):
        scaled = work if unscaled else work / work.real.dtype.type(largest)
        sum_of_squares = xp.zeros(1, dtype=np.float64)
        sum_of_squares[0] = xp.vdot(scaled, scaled).real
    with timed(timings, "comm"):
        comm.Allreduce(MPI.IN_PLACE, sum_of_squares, op=MPI.SUM)
    with np.errstate(over="ignore"):  # a norm beyond the type's range is inf, as numpy.linalg.norm gives
        return _scalar_result(xp.sqrt(sum_of_squares) if unscaled else largest * xp.sqrt(sum_of_squares),
                              result, xp)


def _scalar(alpha, dtype):
    """``alpha`` as a ``dtype`` scalar; TypeError where that would change its value.

    A complex ``alpha`` with an imaginary part needs a complex ``dtype``; an
    integer ``dtype`` needs an integral ``alpha`` within its range (as ``y + a x``
    cannot stay integer otherwise). Floats are rounded to ``dtype``.
    """
    if not isinstance(alpha, numbers.Number):
        raise TypeError(f"axpy: alpha must be a number, got {type(alpha).__name__}")
    if dtype.kind != "c" and not isinstance(alpha, numbers.Real):
        if alpha.imag:
            raise TypeError(f"axpy: complex alpha {alpha!r} for a {dtype} vector")
        alpha = alpha.real
    if dtype.kind == "i":
        limits = np.iinfo(dtype)
        if not (isinstance(alpha, numbers.Integral) or float(alpha).is_integer()) \
                or not limits.min <= int(alpha) <= limits.max:
            raise TypeError(f"axpy: alpha {alpha!r} is not an integer that {dtype} holds")
        alpha = int(alpha)
    return dtype.type(alpha)


def axpy(alpha, x, y, timings=None):
    """``y <- alpha x + y`` in place on this rank's blocks; returns ``y``.

    Parameters
    ----------
    alpha : number
        Rounded to ``y``'s type (float32 for float16 vectors); must be an integer
        within range for integer vectors and real for real vectors (TypeError).
    x, y : ndarray, local shape ``(n_r,)``
        Blocks of two global vectors split the same way, of one supported dtype;
        ``y`` is updated. float16 is computed in float32 and rounded once, so
        ``alpha x`` may exceed 65504 when ``alpha x + y`` does not.
    timings : dict, optional
        ``"compute"`` seconds are added to it.

    Notes
    -----
    No communication (0 messages, 0 words): each rank updates its own block;
    ``2 n / p`` flops. A block of the wrong length or dtype raises InputError
    on the ranks that hold it.
    """
    x, y = _local_vector(x, "axpy"), _local_vector(y, "axpy")
    if x.shape != y.shape:
        raise InputError(f"axpy: x and y blocks differ in length ({x.shape[0]} and {y.shape[0]})")
    if x.dtype != y.dtype:
        raise InputError(f"axpy: x and y blocks differ in dtype ({x.dtype} and {y.dtype})")
    wide = accumulator(y.dtype)
    scalar = _scalar(alpha, wide)
    with timed(timings, "compute", array_module(y)):
        if wide == y.dtype:
            add_scaled(scalar, x, y)
        else:
            y[...] = y + scalar * x.astype(wide)   # computed in wide, rounded once
    return y


#: Type codes with a BLAS ``?axpy``: float32, float64, complex64, complex128.
BLAS_AXPY_TYPES = "fdFD"
#: Most entries one call of `scipy.linalg.blas`'s ``?axpy`` takes (its BLAS counts in 32-bit integers).
BLAS_MAX_ENTRIES = 2**31 - 1


def add_scaled(scalar, x, y):
    """``y += scalar x`` in place (``x`` and ``y`` of one shape and dtype, ``scalar`` of that dtype); returns ``y``.

    On the host, for the dtypes BLAS has (`BLAS_AXPY_TYPES`) and a writeable contiguous ``y`` of 1 to
    `BLAS_MAX_ENTRIES` entries, one call of BLAS ``?axpy`` (`scipy.linalg.blas`, threaded as the harness pins
    it): one pass over x and y and no temporary. Otherwise (integers, device arrays, strided, empty or longer
    ``y``) NumPy's ``y += scalar * x``, which first
    writes ``scalar * x`` to a temporary: 19 ms against BLAS's 4.2 ms for 64 MiB blocks here, a fresh
    temporary that large faulting its pages in on every call; 337 against 90 us at 4 MiB.
    """
    if array_module(y) is np and y.dtype.char in BLAS_AXPY_TYPES and 0 < y.size <= BLAS_MAX_ENTRIES \
            and y.flags.c_contiguous and y.flags.writeable:
        updated = get_blas_funcs("axpy", (y,))(x, y, a=scalar)
        if updated is not y:  # f2py updates a contiguous y in place; copy back should it ever not
            y[...] = updated
    else:
        y += scalar * x
    return y
