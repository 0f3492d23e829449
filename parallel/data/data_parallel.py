"""Data-parallel training: full model replicas, sharded global batches, allreduced gradients.

Every rank holds the whole model and trains on its block (`block_range`) of each
global batch. Each rank divides its loss by the *global* batch size, so the sum
over ranks of the local gradients is the serial mean gradient: one allreduce
(SUM) gives every replica the gradient of serial training on the global batch,
and the same optimiser update keeps the replicas identical.

The trainer composes one part per concern, so a step is forward, backward and
the exchange, whatever the settings:

Buckets (`parallel.data.buckets`)
    Gradients are exchanged in buckets of the flat gradient vector, last layers
    first; each bucket is one allreduce. Backward runs layer by layer over
    ``model.leaves()`` in reverse, which is what `Sequential.backward` does (nested
    ones too), and reports each layer to the bucket manager. With
    ``overlap=True`` a bucket's ``Iallreduce`` starts as soon as a layer completes
    it, progressed after every later layer and waited for at the end of the step
    (needs ``allreduce="mpi"``: the hand-written algorithms are blocking).
The exchange (`parallel.data.exchange`)
    The allreduce algorithm and the wire format: 32-bit, or 16-bit with
    ``precision="float16"`` or ``"bfloat16"`` (the gradients rounded before and
    after it; `parallel.data.gradient_wire`).
Accumulation (`parallel.data.accumulation`)
    ``micro_batches = m`` splits each rank's shard into ``m`` blocks run one after
    another; their gradients are summed in a buffer and exchanged once, during the
    last micro-batch's backward. The sum is the gradient of the whole batch.
Mixed precision (``compute="float16"`` or ``"bfloat16"``)
    Forward and backward run in the 16-bit format on a copy of the weights; the
    model's own float32 vectors stay the master weights, gradients and optimiser
    state; the loss gradient is scaled, the 16-bit weight gradients are widened
    into the master gradients bucket by bucket, exchanged scaled (in the
    ``precision`` format), then unscaled; a step whose reduced gradients are not
    finite is skipped on every rank (`parallel.data.mixed_precision.MixedPrecision`;
    ``"full"``: `FullPrecision`, the same calls doing nothing). Either option works
    with the other and with buckets, overlap and accumulation.

Device arrays (CuPy)
    With device parameters (``model.to(backend)``) and ``backend.comm(comm)`` all
    buffers come from the parameters' array module; every MPI call synchronises
    the stream first (overlap stays correct) and is staged without a CUDA-aware
    MPI; the hand-written algorithms (persistent requests) are staged as one call
    (`kernels.backend.Backend.staged`); mixed precision reads one flag back.

Communication cost per step and rank: one allreduce per bucket, i.e. the cost of
the chosen algorithm (`parallel.collectives`) summed over buckets; for the ring
``2 (p-1) B alpha + 2 (p-1)/p n beta`` for ``B`` buckets of ``n`` bytes in total.
"""
from kernels.backend import array_module
from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.data.accumulation import GradientAccumulation
from parallel.data.buckets import BucketManager, OverlappedBuckets
from parallel.data.exchange import ALLREDUCE_CHOICES, GradientExchange
from parallel.data.mixed_precision import compute_precision
from parallel.nn.layers import softmax_cross_entropy
from parallel.nn.models import flat_storage
from parallel.nn.optim import GradientStep

__all__ = ["ALLREDUCE_CHOICES", "DataParallelTrainer", "shard"]


def shard(comm, n):
    """Return the slice of a global batch of ``n`` samples that ``comm.rank`` trains on (`block_range`)."""
    return slice(*block_range(n, comm.size, comm.rank))


def _before_the_last_micro_batch(count):
    """Backward of a micro-batch before the last: no bucket is complete yet."""


class DataParallelTrainer(GradientStep):
    """Train a replica of ``model`` on each rank's shard of every global batch.

    Parameters
    ----------
    comm : MPI.Comm
    model : Layer
        A `Sequential` (or single layer) whose backward equals running
        ``model.leaves()`` backwards in reverse; the same seed on every rank (rank
        0's parameters are broadcast at construction anyway). Its parameters and
        gradients are moved into `flat_params` / `flat_grads`.
    allreduce : str
        ``"mpi"`` (``MPI.Allreduce`` / ``Iallreduce``) or a key of
        `parallel.collectives.ALLREDUCE_ALGORITHMS`.
    bucket_bytes : int
        Cap on a bucket's gradient bytes (>= 0; 0: one bucket).
    overlap : bool
        Start each bucket's ``Iallreduce`` during backward (needs ``"mpi"``).
    micro_batches : int
        Micro-batches per rank and step, gradients accumulated (>= 1).
    precision : {"full", "float16", "bfloat16"}
        Format of the gradient exchange (see `parallel.data.gradient_wire`).
    loss : callable
        ``loss(logits, labels, batch_size) -> (value, dlogits)`` dividing by
        ``batch_size``, like `softmax_cross_entropy` (under mixed precision it gets
        the logits in the master dtype).
    compute : {"full", "float16", "bfloat16"}
        Format of forward and backward (``"full"``: the model's dtype; else mixed
        precision, `parallel.data.mixed_precision`).
    loss_scaler : LossScaler, optional
        Under mixed precision (default `default_scaler`: dynamic for float16,
        fixed 1 for bfloat16); ignored for ``"full"``.

    Attributes
    ----------
    flat_params, flat_grads : ndarray, shape (number of parameters,)
        The (master) weights and gradients in the model's dtype, the vectors an
        optimiser updates. After `compute_gradients`, ``flat_grads`` holds the
        global mean gradient (unscaled).
    step_skipped : bool
        Whether the last `compute_gradients` found non-finite gradients under mixed
        precision (`train_step` then leaves the weights alone); the same on all ranks.
    loss_scaler : LossScaler or None
        None for ``compute="full"``.
    buckets : list of (int, int)
        ``(start, stop)`` ranges of the flat vectors, in the order they are sent.
    comm_seconds : float
        Time spent in MPI calls exchanging gradients (including waits for slower
        ranks), summed over all steps.
    """

    def __init__(self, comm, model, allreduce="mpi", bucket_bytes=0, overlap=False, micro_batches=1,
                 precision="full", loss=softmax_cross_entropy, compute="full", loss_scaler=None):
        self._exchange = GradientExchange(comm, allreduce, precision)
        self.model, self.comm, self.loss = model, comm, loss
        self.allreduce, self.overlap, self.precision, self.compute = allreduce, bool(overlap), precision, compute
        self.flat_params, self.flat_grads = flat_storage(model)
        comm.Bcast(self.flat_params, root=0)
        self._precision = compute_precision(compute, model, self.flat_params, self.flat_grads, loss, loss_scaler)
        self.loss_scaler = self._precision.loss_scaler
        self._layers = [(leaf, sum(array.size for array in leaf.params.values())) for leaf in model.leaves()]
        sizes = [array.size for leaf, _ in self._layers for array in leaf.params.values()]
        self._buckets = (OverlappedBuckets if overlap else BucketManager)(
            self.flat_grads, sizes, bucket_bytes, self._exchange, self._complete_bucket)
        self.buckets = self._buckets.bounds
        self._accumulation = GradientAccumulation(self.flat_grads, micro_batches)
        self.micro_batches = self._accumulation.micro_batches

    @property
    def comm_seconds(self):
        """Time spent in MPI calls exchanging gradients, summed over all steps."""
        return self._exchange.seconds

    def parameters(self):
        """Return ``[(flat_params, flat_grads)]``, the pairs an optimiser (`parallel.nn.optim`) updates."""
        return [(self.flat_params, self.flat_grads)]

    def sync_model(self):
        """Copy the master weights into the model's 16-bit copy (mixed precision; nothing otherwise).

        `compute_gradients` does it at every step; call it before using ``model``
        alone (e.g. for accuracy) after the last optimiser step.
        """
        self._precision.sync_model()

    def compute_gradients(self, x, y, batch_size=None):
        """Leave in `flat_grads` the mean gradient of the global batch whose shard on this rank is ``x, y``.

        Parameters
        ----------
        x, y : ndarray, shape (n_local, ...) and (n_local,)
            This rank's samples and labels (may be empty), e.g. ``x[shard(comm, n)]``.
        batch_size : int, optional
            The global batch size (the sum of ``n_local`` over ranks); computed with
            one small ``allreduce`` when not given.

        Returns
        -------
        float
            This rank's share of the mean loss (the shares add up to the global mean loss).
        """
        if len(x) != len(y):
            raise InputError(f"compute_gradients: {len(x)} samples but {len(y)} labels")
        if batch_size is None:
            batch_size = self._exchange.timed(self.comm.allreduce, len(x))
        parts = self._accumulation.begin(len(x))
        self._buckets.begin()
        self._precision.sync_model()
        if not parts:  # no sample on this rank: a zero gradient
            self._precision.model_grads.fill(0)
        loss = 0.0
        with self._precision.errors():
            for part in parts[:-1]:
                loss += self._forward_backward(x[part], y[part], batch_size, _before_the_last_micro_batch)
                self._precision.to_master()
                self._accumulation.hold()
            for part in parts[-1:]:  # the last micro-batch: each bucket is exchanged once it is complete
                loss += self._forward_backward(x[part], y[part], batch_size, self._buckets.after_layer)
            self._buckets.finish()
            self.step_skipped = self._precision.unscale()
        return loss

    def state_arrays(self):
        """The arrays of parameters and gradients this rank holds: the (master) vectors, the model's (its
        16-bit copies under mixed precision) and the held sum of accumulated micro-batches."""
        return [self.flat_params, self.flat_grads, self._accumulation.sum] + [
            array for leaf in self.model.leaves() for kind in (leaf.params, leaf.grads) for array in kind.values()]

    def replica_mismatches(self):
        """Return how many parameters on this rank differ from rank 0's (one ``Bcast`` of the parameters)."""
        reference = self.flat_params.copy()
        self.comm.Bcast(reference, root=0)
        return int(array_module(reference).count_nonzero(reference != self.flat_params))

    def _forward_backward(self, x, y, batch_size, after_layer):
        """Forward, loss and backward of one micro-batch, backward layer by layer, each layer reported to
        ``after_layer(parameters it has)``; return the loss share."""
        value, dy = self._precision.loss_and_gradient(self._precision.forward(x), y, batch_size)
        for layer, count in reversed(self._layers):
            dy = self._precision.round(layer.backward(dy))
            after_layer(count)
        return value

    def _complete_bucket(self, start, stop):
        """The last micro-batch's gradients ``[start:stop]`` are in: widen them, add the earlier micro-batches'."""
        self._precision.to_master(start, stop)
        self._accumulation.add_held(start, stop)
