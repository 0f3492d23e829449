"""Distributed BLAS level 1: dot, nrm2 and axpy on block-distributed vectors.

A vector of global length ``n`` on ``p`` ranks is held as one local 1D array per
rank: rank ``r`` holds entries ``block_range(n, p, r)`` (any ``n``, blocks may be
empty). The serial references are ``np.dot``, ``np.linalg.norm`` and ``y + a x``.
Partial results are reduced in float64 whatever the vector dtype; results come
back in the vectors' dtype.
"""
import numpy as np
from mpi4py import MPI

from kernels.distmatrix import timed
from kernels.errors import InputError


def _local_vector(x, what):
    x = np.asarray(x)
    if x.ndim != 1:
        raise InputError(f"{what}: expected a 1D local vector block, got shape {x.shape}")
    return x


def dot(x, y, comm, timings=None):
    """Global dot product ``x . y`` of two vectors split the same way over ``comm``.

    Parameters
    ----------
    x, y : ndarray, local shape ``(n_r,)``
        This rank's blocks of two global vectors of length ``n``.
    comm : MPI.Comm
    timings : dict, optional
        ``"comm"`` and ``"compute"`` seconds are added to it.

    Returns
    -------
    scalar of the vectors' dtype, the same on every rank.

    Notes
    -----
    One ``Allreduce`` of 2 words (the partial sum and a mismatch flag, so that a
    block of the wrong length or dtype on any rank raises InputError on every
    rank): ``log2(p) alpha + 2 log2(p) beta`` per rank; ``2 n / p`` flops.
    """
    x, y = _local_vector(x, "dot"), _local_vector(y, "dot")
    mismatch = x.shape != y.shape or x.dtype != y.dtype
    with timed(timings, "compute"):
        partial = np.array([0.0 if mismatch else np.dot(x, y), float(mismatch)])
    with timed(timings, "comm"):
        comm.Allreduce(MPI.IN_PLACE, partial, op=MPI.SUM)
    if partial[1]:
        raise InputError("dot: x and y blocks differ in length or dtype on some rank")
    return x.dtype.type(partial[0])


def nrm2(x, comm, timings=None):
    """Global Euclidean norm ``||x||_2`` without overflow or underflow.

    The entries are divided by the global largest magnitude (found with an
    ``Allreduce`` MAX) before squaring, so vectors with entries near 1e200 (or
    1e-200) give the right norm, as LAPACK's dnrm2 does with its scaling.

    Parameters
    ----------
    x : ndarray, local shape ``(n_r,)``
        This rank's block of a global vector of length ``n``.
    comm : MPI.Comm
    timings : dict, optional
        ``"comm"`` and ``"compute"`` seconds are added to it.

    Returns
    -------
    scalar of ``x``'s dtype, the same on every rank.

    Notes
    -----
    Two ``Allreduce``: MAX of 2 words (largest magnitude, NaN flag), then SUM of
    1 word: ``2 log2(p) alpha + 3 log2(p) beta`` per rank; about ``3 n / p``
    flops. NaN anywhere gives NaN on every rank, an infinite entry gives inf.
    """
    x = _local_vector(x, "nrm2")
    with timed(timings, "compute"):
        largest = np.max(np.abs(x), initial=0.0)
        scale = np.array([0.0 if np.isnan(largest) else largest, float(np.isnan(largest))])
    with timed(timings, "comm"):
        comm.Allreduce(MPI.IN_PLACE, scale, op=MPI.MAX)
    if scale[1]:
        return x.dtype.type(np.nan)
    if scale[0] == 0.0 or np.isinf(scale[0]):
        return x.dtype.type(scale[0])
    with timed(timings, "compute"):
        scaled = x / x.dtype.type(scale[0])
        sum_of_squares = np.array([np.dot(scaled, scaled)], dtype=np.float64)
    with timed(timings, "comm"):
        comm.Allreduce(MPI.IN_PLACE, sum_of_squares, op=MPI.SUM)
    return x.dtype.type(scale[0] * np.sqrt(sum_of_squares[0]))


def axpy(alpha, x, y, timings=None):
    """``y <- alpha x + y`` in place on this rank's blocks; returns ``y``.

    Parameters
    ----------
    alpha : float
    x, y : ndarray, local shape ``(n_r,)``
        Blocks of two global vectors split the same way; ``y`` is updated.
    timings : dict, optional
        ``"compute"`` seconds are added to it.

    Notes
    -----
    No communication (0 messages, 0 words): each rank updates its own block;
    ``2 n / p`` flops. A block of the wrong length raises InputError on the
    ranks that hold it.
    """
    x, y = _local_vector(x, "axpy"), _local_vector(y, "axpy")
    if x.shape != y.shape:
        raise InputError(f"axpy: x and y blocks differ in length ({x.shape[0]} and {y.shape[0]})")
    with timed(timings, "compute"):
        y += y.dtype.type(alpha) * x
    return y
