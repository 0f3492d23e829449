"""Shared groundwork of the hand-written collectives: argument checks, block layout, tagged exchanges.

The collectives (`parallel.collectives.ring`, `parallel.collectives.power_of_two`,
`parallel.collectives.tree`) work on point-to-point messages for any rank count ``p``,
any length (also below ``p``, and zero), 1-D contiguous float32 / float64 arrays;
``op`` "sum" or "max", reduced by NumPy ufuncs in place; messages are contiguous
views, never copies. Costs are per rank, alpha per message, beta per byte sent,
gamma per byte reduced; ``n`` is the vector size in bytes, ``p' = 2**floor(log2 p)``.
"""
import numpy as np
from mpi4py import MPI

from kernels.distribution import block_offsets, block_range
from kernels.errors import InputError

REDUCE_OPS = {"sum": np.add, "max": np.maximum}
SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
# Tag of every message sent by the collectives, apart from the user's own traffic on ``comm``.
COLLECTIVE_TAG = 0x6D6C


def reduce_ufunc(op):
    """Return the NumPy ufunc of the reduction ``op`` ("sum" or "max")."""
    try:
        return REDUCE_OPS[op]
    except (KeyError, TypeError):
        raise InputError(f"unknown reduction op {op!r}; choose one of: {', '.join(REDUCE_OPS)}") from None


def operands(sendbuf, recvbuf):
    """Validate both buffers and return the input array (``recvbuf`` when in place)."""
    source = recvbuf if sendbuf is MPI.IN_PLACE else sendbuf
    for name, array in (("recvbuf", recvbuf), ("sendbuf", source)):
        if not isinstance(array, np.ndarray) or array.ndim != 1 or not array.flags.c_contiguous:
            raise InputError(f"{name} must be a 1-D contiguous NumPy array")
        if array.dtype not in SUPPORTED_DTYPES:
            raise InputError(f"{name} has dtype {array.dtype}; supported: float32, float64")
    if source.dtype != recvbuf.dtype:
        raise InputError(f"sendbuf is {source.dtype} but recvbuf is {recvbuf.dtype}")
    return source


def _check_size(name, array, size, meaning):
    if array.size != size:
        raise InputError(f"{name} has {array.size} items, expected {size} ({meaning})")


def check_block(name, array, n, comm):
    """``array`` must have the length of this rank's block of ``n`` items."""
    start, stop = block_range(n, comm.size, comm.rank)
    _check_size(name, array, stop - start, f"block {comm.rank} of {n} items over {comm.size} ranks")


def allreduce_operands(sendbuf, recvbuf, op, copy_input=True):
    """Validate allreduce arguments; return the input array and the ufunc.

    With ``copy_input`` an out-of-place input is first copied into ``recvbuf``.
    """
    ufunc = reduce_ufunc(op)
    source = operands(sendbuf, recvbuf)
    _check_size("sendbuf", source, recvbuf.size, "the length of recvbuf")
    if copy_input and source is not recvbuf:
        np.copyto(recvbuf, source)
    return source, ufunc


def block_slices(n, parts):
    """Slices of the ``parts`` blocks of ``n`` items (layout of `block_range`)."""
    bounds = block_offsets(n, parts) + [n]
    return [slice(start, stop) for start, stop in zip(bounds, bounds[1:])]


def exchange(comm, outgoing, dest, incoming, source):
    """Send ``outgoing`` to ``dest`` while receiving ``incoming`` from ``source``."""
    comm.Sendrecv(outgoing, dest, COLLECTIVE_TAG, recvbuf=incoming, source=source, recvtag=COLLECTIVE_TAG)


def exchange_and_reduce(comm, outgoing, dest, incoming, source, local, ufunc, out=None):
    """`exchange`, then ``out = local (op) incoming`` (``out`` defaults to ``local``); return ``out``."""
    exchange(comm, outgoing, dest, incoming, source)
    return ufunc(local, incoming, out=local if out is None else out)
