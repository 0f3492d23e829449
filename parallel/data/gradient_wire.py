"""How gradients travel in data-parallel training: buckets of the flat vector and 16-bit wire formats.

Buckets
    The gradients live in one contiguous vector (`parallel.nn.models.flat_storage`),
    cut into buckets: consecutive parameters taken from the last layer backwards
    (the order backward produces them), grouped while the bucket holds at most
    ``bucket_bytes`` bytes of gradient (a larger parameter is a bucket of its own;
    ``bucket_bytes=0``: one bucket, the whole vector). Each bucket is one allreduce.
Reduced precision (``precision="float16"`` or ``"bfloat16"``)
    Master weights, optimiser and local gradients keep the model's dtype; only
    the exchange is 16-bit. bfloat16 is the upper half of a float32, rounded to
    nearest even; a NaN stays a quiet NaN of its sign (never a number), so a
    NaN gradient on any rank is a NaN after the exchange on every rank. With ``allreduce="mpi"`` the 16-bit values travel as 16-bit
    words (half the bytes of float32): float16 as MPI's float16 with ``MPI.SUM``,
    bfloat16 as uint16 upper halves with a user-defined op that widens to float32,
    adds and rounds back. The hand-written algorithms reduce float32 / float64
    only, so with them the rounded values travel in the gradient dtype (for
    bfloat16: float32 with the low 16 bits zero) and the sum is rounded to the
    16-bit format at the end: same input and output rounding, float32 partial
    sums, no bytes saved.
Device arrays (CuPy)
    Encoding and decoding stay in the gradients' array module (bit operations and
    ``astype`` only); the bfloat16 op of MPI runs on the host words a staging
    `kernels.comm.device.DeviceComm` hands it. A CUDA-aware MPI would hand the
    Python op device memory: `WireFormat` refuses that combination (``"mpi"`` with
    bfloat16 on a CUDA-aware device communicator; the hand-written algorithms work).
"""
import numpy as np
from mpi4py import MPI

from kernels.backend import array_module
from kernels.errors import InputError

PRECISIONS = ("full", "float16", "bfloat16")


def bucket_bounds(param_sizes, itemsize, bucket_bytes):
    """Return the buckets of a flat vector as ``(start, stop)`` pairs, last parameters first.

    Parameters
    ----------
    param_sizes : sequence of int
        Element counts of the parameters, in flat-vector order.
    itemsize : int
        Bytes per element.
    bucket_bytes : int
        Cap on a bucket's bytes; a parameter larger than the cap is a bucket of its
        own. 0: one bucket holding everything.
    """
    bounds = []
    start = stop = int(sum(param_sizes))
    for size in reversed(param_sizes):
        if bucket_bytes and start < stop and (stop - start + size) * itemsize > bucket_bytes:
            bounds.append((start, stop))
            stop = start
        start -= size
    bounds.append((start, stop))
    return bounds


#: float32 bit masks of the bfloat16 rounding: the magnitude, +inf, the quiet-NaN bit, the upper half.
_MAGNITUDE, _INFINITY = np.uint32(0x7FFFFFFF), np.uint32(0x7F800000)
_QUIET_NAN, _UPPER_HALF = np.uint32(0x00400000), np.uint32(0xFFFF0000)


def _round_words(words):
    """Round float32 bit patterns ``words`` (uint32, overwritten) to bfloat16 in their upper halves; return them.

    The one rule of every bfloat16 rounding here. Numbers, infinities included,
    round to nearest, ties to even: adding ``0x7FFF`` plus the lowest kept bit
    carries into the upper half exactly when the dropped half is more than half a
    bfloat16 step, or exactly half with an odd kept bit; a finite number at least
    halfway above the largest bfloat16 becomes inf, as IEEE rounding gives. A NaN
    is not rounded (that carry would turn it into inf or wrap it to a zero): it
    keeps its sign and upper bits, with the quiet bit set, so it stays a (quiet)
    NaN even when its payload lay in the dropped half. The low halves are cleared.
    Computes in the array module of ``words``.
    """
    xp = array_module(words)
    nan = (words & _MAGNITUDE) > _INFINITY
    carry = words >> np.uint32(16)
    carry &= np.uint32(1)
    carry += np.uint32(0x7FFF)
    words += xp.where(nan, np.uint32(0), carry)
    words |= xp.where(nan, _QUIET_NAN, np.uint32(0))
    words &= _UPPER_HALF
    return words


def bfloat16_bits(values):
    """Return ``values`` rounded to bfloat16 as uint16 upper halves of float32 (`_round_words`: nearest,
    ties to even; NaN stays a quiet NaN of the same sign)."""
    words = values.astype(np.float32).view(np.uint32)
    return (_round_words(words) >> np.uint32(16)).astype(np.uint16)


def round_to_bfloat16(values):
    """Round the float32 array ``values`` in place to bfloat16 precision (`_round_words`).

    The result is `bfloat16_values(bfloat16_bits(values))` without the 16-bit copy:
    float32 numbers whose low 16 bits are zero. NumPy has no bfloat16 dtype, so
    mixed precision emulates bfloat16 arithmetic by this rounding. Returns ``values``.
    """
    if values.dtype != np.float32:
        raise TypeError(f"round_to_bfloat16: need a float32 array, got {values.dtype}")
    _round_words(values.view(np.uint32))
    return values


def bfloat16_values(bits):
    """Return the float32 numbers of bfloat16 ``bits`` (uint16 upper halves; low 16 bits zero)."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _bfloat16_sum(incoming, partial, datatype):
    """MPI user op: ``partial = bf16(float32(incoming) + float32(partial))`` on uint16 words."""
    incoming = np.frombuffer(incoming, dtype=np.uint16)
    partial = np.frombuffer(partial, dtype=np.uint16)
    partial[:] = bfloat16_bits(bfloat16_values(incoming) + bfloat16_values(partial))


_USER_OPS = {}


def _bfloat16_sum_op():
    """The MPI op of `_bfloat16_sum`, created once per process."""
    if "bfloat16" not in _USER_OPS:
        _USER_OPS["bfloat16"] = MPI.Op.Create(_bfloat16_sum, commute=True)
    return _USER_OPS["bfloat16"]


# precision -> (pack to 16-bit words, unpack to float32, dtype of the words, MPI op on the words)
_SIXTEEN_BIT = {
    "float16": (lambda x: x.astype(np.float16), lambda w: w.astype(np.float32), np.float16,
                lambda: MPI.SUM),
    "bfloat16": (bfloat16_bits, bfloat16_values, np.uint16, _bfloat16_sum_op),
}


class WireFormat:
    """How a bucket's gradients are encoded before the allreduce and decoded after it.

    ``full``: the gradients are reduced in place (no encoding). ``native`` 16-bit:
    16-bit words with their own MPI op. Otherwise (hand-written algorithms) the
    gradients are rounded to the 16-bit format in their own dtype before and after.

    Parameters
    ----------
    precision : {"full", "float16", "bfloat16"}
    native : bool
        Whether the allreduce takes the 16-bit words and `op` (``MPI.Allreduce``).
    device_buffers_to_mpi : bool
        Whether MPI is handed device memory (a CUDA-aware MPI under a device
        communicator): the bfloat16 op, Python code on host memory, is refused then.

    Attributes
    ----------
    full : bool
    op : MPI.Op
        The sum of the wire's elements.
    """

    def __init__(self, precision, native, device_buffers_to_mpi=False):
        if precision not in PRECISIONS:
            raise InputError(f"unknown gradient precision {precision!r}; choose from {', '.join(PRECISIONS)}")
        self.full = precision == "full"
        self.op = MPI.SUM
        self._words = None  # the wire's dtype; None: the gradients' own
        if self.full:
            return
        pack, unpack, words, make_op = _SIXTEEN_BIT[precision]
        if native and precision == "bfloat16" and device_buffers_to_mpi:
            raise InputError("the bfloat16 exchange with allreduce 'mpi' needs host buffers (its MPI op is "
                             "Python code); with a CUDA-aware MPI use a hand-written allreduce")
        if native:
            self._words, self.op = np.dtype(words), make_op()
            self._encode, self._decode = pack, unpack
        else:
            self._encode = self._decode = lambda values: unpack(pack(values))

    def buffer(self, grads):
        """The wire of the bucket ``grads``: ``grads`` itself when `full`, else a new array of its length
        (16-bit words, or the gradients' dtype) in the gradients' array module."""
        if self.full:
            return grads
        return array_module(grads).empty(grads.size, grads.dtype if self._words is None else self._words)

    def encode(self, grads, wire):
        """Write the bucket ``grads`` into its `buffer` ``wire`` (nothing to do when `full`)."""
        if not self.full:
            wire[...] = self._encode(grads)

    def decode(self, wire, grads):
        """Write the reduced ``wire`` back into the bucket ``grads`` (nothing to do when `full`)."""
        if not self.full:
            grads[...] = self._decode(wire)
