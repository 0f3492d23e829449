"""Shared groundwork of the hand-written collectives: argument checks and block layout.

The collectives (`parallel.collectives.ring`, `parallel.collectives.power_of_two`,
`parallel.collectives.tree`, `parallel.collectives.auto`) work on point-to-point messages for any rank count ``p``,
any length (also below ``p``, and zero), 1-D contiguous buffers of integers or
floating-point numbers (NumPy arrays or any buffer-protocol object, as mpi4py
takes them; complex numbers for "sum" only), or 1-D device arrays (CuPy) for a
CUDA-aware MPI, which never reach host memory (no buffer protocol, no host
conversion: MPI takes them by ``__cuda_array_interface__``); ``op`` "sum" or "max"
(or ``MPI.SUM`` / ``MPI.MAX``), reduced in place by the ufunc of the buffers'
array module (``xp.add`` / ``xp.maximum``); messages are contiguous views, never
copies. Each algorithm lays out its steps as a `parallel.collectives.schedule.Schedule`; `parallel.collectives.plans` checks the
arguments and caches layouts and plans (persistent requests). A caller's misuse is a ``TypeError`` (not a
buffer, unsupported type, mismatched types) or a ``ValueError`` (unknown op,
shape, contiguity, length), as in mpi4py; these are library errors, not user
input. Costs are per rank, alpha per message, beta per byte sent,
gamma per byte reduced; ``n`` is the vector size in bytes, ``p' = 2**floor(log2 p)``.
"""
from itertools import accumulate

import numpy as np
from mpi4py import MPI

from kernels.backend import array_module
from kernels.distribution import block_offsets, block_range

#: The ufunc of each reduction, by name in the buffers' array module.
REDUCE_OPS = {"sum": "add", "max": "maximum"}
MPI_OPS = ((MPI.SUM, "sum"), (MPI.MAX, "max"))
#: NumPy dtype kinds the collectives reduce: signed and unsigned integers, floats, complex (sum only).
SUPPORTED_KINDS = "iufc"


def reduce_ufunc(op, dtype=None, xp=np):
    """Return the ufunc of array module ``xp`` for the reduction ``op`` ("sum", "max", ``MPI.SUM`` or ``MPI.MAX``)."""
    if isinstance(op, MPI.Op):
        name = next((text for mpi_op, text in MPI_OPS if op == mpi_op), None)
    else:
        name = op if isinstance(op, str) else None
    if name not in REDUCE_OPS:
        raise ValueError(f"unknown reduction op {op!r}; choose one of: {', '.join(REDUCE_OPS)}, MPI.SUM, MPI.MAX")
    if name == "max" and dtype is not None and dtype.kind == "c":
        raise TypeError(f"op 'max' is not defined for {dtype}")
    return getattr(xp, REDUCE_OPS[name])


def buffer_array(name, buffer):
    """``buffer`` as an ndarray sharing its memory (NumPy and device arrays as they are; any buffer-protocol
    object as a NumPy array)."""
    if isinstance(buffer, np.ndarray) or array_module(buffer) is not np:
        return buffer
    try:
        memoryview(buffer)
    except TypeError:
        raise TypeError(f"{name} must be a buffer (a NumPy array or another buffer-protocol object), "
                        f"not {type(buffer).__name__}") from None
    return np.asarray(buffer)


def operands(sendbuf, recvbuf):
    """Validate both arrays and return the input array (``recvbuf`` when in place)."""
    source = recvbuf if sendbuf is MPI.IN_PLACE else sendbuf
    for name, array in (("recvbuf", recvbuf), ("sendbuf", source)):
        if array.dtype.kind not in SUPPORTED_KINDS:
            raise TypeError(f"{name} has dtype {array.dtype}; supported: integers, floating-point and complex numbers")
        if array.ndim != 1 or not array.flags.c_contiguous:
            raise ValueError(f"{name} must be 1-D and contiguous, got shape {array.shape}"
                             + ("" if array.flags.c_contiguous else " (not contiguous)"))
    if source.dtype != recvbuf.dtype:
        raise TypeError(f"sendbuf is {source.dtype} but recvbuf is {recvbuf.dtype}")
    if array_module(source) is not array_module(recvbuf):
        raise TypeError(f"sendbuf is a {_type_name(source)} but recvbuf is a {_type_name(recvbuf)} "
                        f"(both in host memory or both on the device)")
    if not writeable(recvbuf):
        raise ValueError("recvbuf is read-only")
    return source


def _type_name(array):
    return f"{type(array).__module__.partition('.')[0]}.{type(array).__name__}"


def writeable(array):
    """Whether ``array`` may be written (device arrays always: CuPy's flags have no ``writeable``)."""
    return getattr(array.flags, "writeable", True)


def _check_size(name, array, size, meaning):
    if array.size != size:
        raise ValueError(f"{name} has {array.size} items, expected {size} ({meaning})")


def check_block(comm, name, array, n, counts=None):
    """``array`` must have the length of this rank's block of ``n`` items (of `block_range`, or
    ``counts[rank]`` when the blocks are given: `check_counts`)."""
    if counts is None:
        start, stop = block_range(n, comm.size, comm.rank)
        _check_size(name, array, stop - start, f"block {comm.rank} of {n} items over {comm.size} ranks")
    else:
        check_counts(comm, counts, n)
        _check_size(name, array, counts[comm.rank], f"block {comm.rank} of the blocks {list(counts)}")


def check_counts(comm, counts, n=None):
    """``counts`` must be a tuple of ``comm.size`` non-negative integers (adding up to ``n`` when given)."""
    if not isinstance(counts, tuple) or len(counts) != comm.size or \
            any(not isinstance(count, int) or count < 0 for count in counts):
        raise ValueError(f"counts must be a tuple of {comm.size} non-negative ints (one block per rank), "
                         f"got {counts!r}")
    if n is not None and sum(counts) != n:
        raise ValueError(f"the blocks {list(counts)} add up to {sum(counts)} items, not {n}")


def allreduce_length(comm, source, recvbuf):
    """Both vectors have the same length ``n``; return it."""
    _check_size("sendbuf", source, recvbuf.size, "the length of recvbuf")
    return recvbuf.size


def block_slices(n, parts, counts=None):
    """Slices of the ``parts`` blocks of ``n`` items: the layout of `block_range`, or blocks of
    ``counts[j]`` items one after another (the v-variants: ``MPI_Allgatherv``'s layout)."""
    bounds = (block_offsets(n, parts) if counts is None else [0, *accumulate(counts)][:-1]) + [n]
    return [slice(start, stop) for start, stop in zip(bounds, bounds[1:])]
