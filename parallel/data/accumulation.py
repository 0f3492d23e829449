"""Gradient accumulation: a rank's shard run as micro-batches, one exchange per step.

``micro_batches = m`` splits each rank's shard into ``m`` blocks (`block_range`)
run one after another. The gradients of all but the last are summed in a buffer
(`GradientAccumulation.hold`); the last one's are completed bucket by bucket
during its backward (`add_held`), so every bucket is exchanged once, with the
gradient of the whole shard. No communication.
"""
from kernels.backend import array_module
from kernels.distribution import block_range
from kernels.errors import InputError


class GradientAccumulation:
    """The micro-batches of a step and the sum of their gradients.

    Parameters
    ----------
    grads : ndarray, shape (number of parameters,)
        The flat (master) gradient vector each micro-batch's backward leaves.
    micro_batches : int
        Micro-batches per rank and step (>= 1); from 2 on, a buffer like ``grads``
        holds the sum.

    Attributes
    ----------
    micro_batches : int
    sum : ndarray or None
        The buffer of the held sum (None for one micro-batch).
    """

    def __init__(self, grads, micro_batches):
        if int(micro_batches) != micro_batches or micro_batches < 1:
            raise InputError(f"need an integer micro_batches >= 1, got {micro_batches}")
        self.micro_batches = int(micro_batches)
        self._grads = grads
        self.sum = array_module(grads).empty_like(grads) if self.micro_batches > 1 else None
        self._holding = False

    def begin(self, n):
        """Start a step on ``n`` local samples (nothing held); return the slices of its non-empty micro-batches."""
        self._holding = False
        parts = [slice(*block_range(n, self.micro_batches, index)) for index in range(self.micro_batches)]
        return [part for part in parts if part.stop > part.start]

    def hold(self):
        """Add the gradients of a micro-batch before the last to the sum (the first is copied into it)."""
        if self._holding:
            self.sum += self._grads
        else:
            self.sum[...] = self._grads
            self._holding = True

    def add_held(self, start, stop):
        """Add the held sum to the last micro-batch's gradients ``grads[start:stop]`` (one bucket)."""
        if self._holding:
            self._grads[start:stop] += self.sum[start:stop]
