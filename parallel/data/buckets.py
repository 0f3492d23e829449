"""Gradient buckets: which are complete during backward, and when their allreduce runs.

The flat gradient vector is cut into buckets (`parallel.data.gradient_wire.bucket_bounds`,
last layers first: the order backward completes them). Backward reports each
layer it has run (`BucketManager.after_layer`); a bucket lying wholly after the
gradients still to come is complete and goes to the exchange
(`parallel.data.exchange.GradientExchange`) at once. `BucketManager` then runs
the allreduces one after another once backward has ended (`finish`);
`OverlappedBuckets` starts each with ``Iallreduce`` as soon as it is complete and
lets MPI progress the transfers after every later layer (MPICH advances
non-blocking collectives only inside MPI calls unless ``MPICH_ASYNC_PROGRESS=1``),
and `finish` waits for them all.

Communication cost per step and rank: one allreduce per bucket, the exchange's;
overlapped, the same messages plus one ``Testall`` per layer while any is in flight.
"""
from kernels.errors import InputError
from parallel.data.gradient_wire import bucket_bounds


class BucketManager:
    """The buckets of a flat gradient vector, exchanged one after another at the end of backward.

    Parameters
    ----------
    grads : ndarray, shape (number of parameters,)
        The flat gradient vector the buckets are views of.
    param_sizes : sequence of int
        Element counts of the parameters, in flat-vector order.
    bucket_bytes : int
        Cap on a bucket's gradient bytes (>= 0; 0: one bucket).
    exchange : GradientExchange
    complete : callable
        ``complete(start, stop)``: called when backward has produced the gradients
        ``grads[start:stop]`` of a bucket, before it is encoded for the exchange.

    Attributes
    ----------
    bounds : list of (int, int)
        ``(start, stop)`` ranges of the buckets, in the order they are sent.
    """

    def __init__(self, grads, param_sizes, bucket_bytes, exchange, complete):
        if int(bucket_bytes) != bucket_bytes or bucket_bytes < 0:
            raise InputError(f"need an integer bucket_bytes >= 0, got {bucket_bytes}")
        self.bounds = bucket_bounds(param_sizes, grads.itemsize, int(bucket_bytes))
        self._grads = [grads[start:stop] for start, stop in self.bounds]
        self._wires = [exchange.wire(bucket) for bucket in self._grads]
        self._exchange, self._complete = exchange, complete
        self._size = grads.size
        self._remaining = self._next = 0

    def begin(self):
        """Start a step: every gradient is still to come, no bucket is complete."""
        self._remaining, self._next = self._size, 0

    def after_layer(self, count):
        """Backward has produced the gradients of ``count`` more parameters: hand over the complete buckets."""
        self._remaining -= count
        self._release(self._remaining)

    def finish(self):
        """Hand over the buckets not yet complete (backward has ended), complete every allreduce, decode."""
        self._release(0)
        self._exchange_all()
        for grads, wire in zip(self._grads, self._wires):
            self._exchange.decode(wire, grads)

    def _release(self, remaining):
        """Encode every bucket lying wholly after the first ``remaining`` gradients (those still to come)."""
        while self._next < len(self.bounds) and self.bounds[self._next][0] >= remaining:
            self._complete(*self.bounds[self._next])
            self._exchange.encode(self._grads[self._next], self._wires[self._next])
            self._released(self._next)
            self._next += 1

    def _released(self, index):
        """Bucket ``index`` is encoded: blocking, its allreduce waits for `finish`."""

    def _exchange_all(self):
        for wire in self._wires:
            self._exchange.reduce(wire)


class OverlappedBuckets(BucketManager):
    """`BucketManager` whose allreduces start (``Iallreduce``) as each bucket is complete, during backward.

    Needs a non-blocking exchange (``allreduce="mpi"``); the parameters are `BucketManager`'s.
    """

    def __init__(self, grads, param_sizes, bucket_bytes, exchange, complete):
        if not exchange.nonblocking:
            raise InputError(f"overlap needs a non-blocking allreduce: use allreduce 'mpi', not "
                             f"{exchange.allreduce!r}")
        super().__init__(grads, param_sizes, bucket_bytes, exchange, complete)
        self._requests = []

    def after_layer(self, count):
        super().after_layer(count)
        if self._requests:
            self._exchange.progress(self._requests)

    def _released(self, index):
        self._requests.append(self._exchange.start(self._wires[index]))

    def _exchange_all(self):
        self._exchange.wait(self._requests)
        self._requests = []
