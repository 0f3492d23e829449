"""Data-parallel training: full model replicas, sharded global batches, allreduced gradients.

Every rank holds the whole model and trains on its block (`block_range`) of each
global batch. Each rank divides its loss by the *global* batch size, so the sum
over ranks of the local gradients is the serial mean gradient: one allreduce
(SUM) gives every replica the gradient of serial training on the global batch,
and the same optimiser update keeps the replicas identical.

Buckets
    Gradients are exchanged in buckets of the flat gradient vector, last layers
    first (`parallel.data.gradient_wire.bucket_bounds`); each bucket is one allreduce.
Overlap
    Backward runs layer by layer over ``model.leaves()`` in reverse, which is what
    `Sequential.backward` does (nested ones too). With ``overlap=True``, as soon as
    a layer completes a bucket, ``comm.Iallreduce`` starts on it; after every later
    layer `kernels.device_comm.poll_all` lets MPI progress the transfers (MPICH advances
    non-blocking collectives only inside MPI calls unless ``MPICH_ASYNC_PROGRESS=1``);
    one `kernels.device_comm.wait_all` ends the step. Needs ``allreduce="mpi"``: the hand-written
    algorithms are blocking.
Accumulation
    ``micro_batches = m`` splits each rank's shard into ``m`` blocks run one after
    another; their gradients are summed in a buffer and exchanged once, during the
    last micro-batch's backward. The sum is the gradient of the whole batch.
Reduced precision of the exchange (``precision="float16"`` or ``"bfloat16"``)
    The exchange is 16-bit; the gradients are rounded before and after it
    (wire formats: `parallel.data.gradient_wire`).
Mixed precision (``compute="float16"`` or ``"bfloat16"``)
    Forward and backward run in the 16-bit format on a copy of the weights; the
    model's own float32 vectors stay the master weights, gradients and optimiser
    state; the loss gradient is scaled, the 16-bit weight gradients are widened
    into the master gradients bucket by bucket, exchanged scaled (in the
    ``precision`` format), then unscaled; a step whose reduced gradients are not
    finite is skipped on every rank (`parallel.data.mixed_precision`). Either
    option works with the other and with buckets, overlap and accumulation.

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
import contextlib
import functools

import numpy as np
from mpi4py import MPI

from kernels.backend import array_module
from kernels.comm.device import DeviceComm, poll_all, wait_all
from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.collectives import ALLREDUCE_ALGORITHMS
from parallel.data.gradient_wire import PRECISIONS, WireFormat, bucket_bounds
from parallel.data.mixed_precision import COMPUTE_FORMATS, ComputeFormat, default_scaler
from parallel.nn.layers import softmax_cross_entropy
from parallel.nn.models import flat_storage
from parallel.nn.optim import GradientStep

ALLREDUCE_CHOICES = ("mpi",) + tuple(ALLREDUCE_ALGORITHMS)


def shard(comm, n):
    """Return the slice of a global batch of ``n`` samples that ``comm.rank`` trains on (`block_range`)."""
    return slice(*block_range(n, comm.size, comm.rank))


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
        if allreduce not in ALLREDUCE_CHOICES:
            raise InputError(f"unknown allreduce {allreduce!r}; choose from {', '.join(ALLREDUCE_CHOICES)}")
        if precision not in PRECISIONS:
            raise InputError(f"unknown gradient precision {precision!r}; choose from {', '.join(PRECISIONS)}")
        if compute not in COMPUTE_FORMATS:
            raise InputError(f"unknown compute format {compute!r}; choose from {', '.join(COMPUTE_FORMATS)}")
        if overlap and allreduce != "mpi":
            raise InputError(f"overlap needs a non-blocking allreduce: use allreduce 'mpi', not {allreduce!r}")
        if int(bucket_bytes) != bucket_bytes or bucket_bytes < 0 or int(micro_batches) != micro_batches \
                or micro_batches < 1:
            raise InputError(f"need integers bucket_bytes >= 0 and micro_batches >= 1, got {bucket_bytes} "
                             f"and {micro_batches}")
        self.model, self.comm, self.loss = model, comm, loss
        self.allreduce, self.overlap, self.micro_batches = allreduce, bool(overlap), int(micro_batches)
        self.precision = precision
        self._algorithm = ALLREDUCE_ALGORITHMS.get(allreduce)
        self.flat_params, self.flat_grads = flat_storage(model)
        comm.Bcast(self.flat_params, root=0)
        self._compute = None if compute == "full" else ComputeFormat(compute)
        self.loss_scaler = None if self._compute is None else loss_scaler or default_scaler(compute)
        # The model's own vectors: the master ones, or (mixed precision) 16-bit copies re-bound into the model.
        self._model_params, self._model_grads = (self.flat_params, self.flat_grads) if self._compute is None \
            else flat_storage(model, self._compute.dtype)
        self.compute = compute
        self._layers = [(leaf, sum(array.size for array in leaf.params.values())) for leaf in model.leaves()]
        sizes = [array.size for leaf, _ in self._layers for array in leaf.params.values()]
        self.buckets = bucket_bounds(sizes, self.flat_grads.itemsize, int(bucket_bytes))
        self._format = WireFormat(precision, allreduce == "mpi", self.flat_grads.dtype,
                                  isinstance(comm, DeviceComm) and comm.backend.device_buffers_to_mpi)
        self._grads = [self.flat_grads[start:stop] for start, stop in self.buckets]
        self._model_bucket_grads = [self._model_grads[start:stop] for start, stop in self.buckets]
        xp = array_module(self.flat_grads)
        self._wires = self._grads if self._format.full else \
            [xp.empty(stop - start, self._format.dtype) for start, stop in self.buckets]
        self._accum = xp.empty_like(self.flat_grads) if self.micro_batches > 1 else None
        self._accumulated = False
        self._next_bucket = 0
        self._requests = []
        self.comm_seconds = 0.0

    def parameters(self):
        """Return ``[(flat_params, flat_grads)]``, the pairs an optimiser (`parallel.nn.optim`) updates."""
        return [(self.flat_params, self.flat_grads)]

    def sync_model(self):
        """Copy the master weights into the model's 16-bit copy (mixed precision; nothing otherwise).

        `compute_gradients` does it at every step; call it before using ``model``
        alone (e.g. for accuracy) after the last optimiser step.
        """
        if self._compute is not None:
            self._compute.cast(self.flat_params, self._model_params)

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
            batch_size = self._timed(self.comm.allreduce, len(x))
        parts = [slice(*block_range(len(x), self.micro_batches, index)) for index in range(self.micro_batches)]
        parts = [part for part in parts if part.stop > part.start]
        self._accumulated, self._next_bucket = False, 0
        self.sync_model()
        if not parts:
            self._model_grads.fill(0)
        loss = 0.0
        # Under mixed precision an overflow is expected now and then: it is detected and the step skipped.
        with np.errstate(over="ignore", invalid="ignore") if self._compute else contextlib.nullcontext():
            for number, part in enumerate(parts):
                value, dlogits = self._loss(self._forward(x[part]), y[part], batch_size)
                loss += value
                last = number == len(parts) - 1
                self._backward(dlogits, release_buckets=last)
                if not last:
                    self._accumulate()
        self._release_buckets(0)
        self._finish_exchange()
        if self._compute is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                self._unscale()
        return loss

    def replica_mismatches(self):
        """Return how many parameters on this rank differ from rank 0's (one ``Bcast`` of the parameters)."""
        reference = self.flat_params.copy()
        self.comm.Bcast(reference, root=0)
        return int(array_module(reference).count_nonzero(reference != self.flat_params))

    def _timed(self, call, *args, **kwargs):
        start = MPI.Wtime()
        result = call(*args, **kwargs)
        self.comm_seconds += MPI.Wtime() - start
        return result

    def _forward(self, x):
        """Run forward layer by layer (the 16-bit format rounds the input and every output)."""
        if self._compute is None:
            return self.model.forward(x)
        x = self._compute.input(x)
        for layer, _ in self._layers:
            x = self._compute.round(layer.forward(x))
        return x

    def _loss(self, logits, y, batch_size):
        """The loss and its gradient (mixed precision: from master-dtype logits, scaled, in the 16-bit format)."""
        if self._compute is None:
            return self.loss(logits, y, batch_size)
        value, dlogits = self.loss(logits.astype(self.flat_params.dtype), y, batch_size)
        dlogits *= self.loss_scaler.scale
        return value, self._compute.input(dlogits)

    def _unscale(self):
        """Divide the reduced gradients by the loss scale; skip the step (on every rank) if one is not finite."""
        finite = bool(array_module(self.flat_grads).isfinite(self.flat_grads).all())
        self.flat_grads *= 1 / self.loss_scaler.scale
        self.step_skipped = not self.loss_scaler.update(finite)

    def _backward(self, dy, release_buckets):
        """Run backward layer by layer; optionally hand each completed bucket to `_bucket_ready`."""
        remaining = self.flat_grads.size
        for layer, count in reversed(self._layers):
            dy = layer.backward(dy)
            if self._compute is not None:
                self._compute.round(dy)
            if release_buckets:
                remaining -= count
                self._release_buckets(remaining)
                if self._requests:
                    self._timed(poll_all, self._requests)

    def _accumulate(self):
        if self._compute is not None:
            self._compute.to_master(self._model_grads, self.flat_grads)
        if self._accumulated:
            self._accum += self.flat_grads
        else:
            self._accum[...] = self.flat_grads
            self._accumulated = True

    def _release_buckets(self, remaining):
        """Mark ready every bucket lying wholly after the first ``remaining`` (not yet produced) gradients."""
        while self._next_bucket < len(self.buckets) and self.buckets[self._next_bucket][0] >= remaining:
            self._bucket_ready(self._next_bucket)
            self._next_bucket += 1

    def _bucket_ready(self, index):
        grads, wire = self._grads[index], self._wires[index]
        if self._compute is not None:
            self._compute.to_master(self._model_bucket_grads[index], grads)
        if self._accumulated:
            start, stop = self.buckets[index]
            grads += self._accum[start:stop]
        if not self._format.full:
            wire[...] = self._format.encode(grads)
        if self.overlap:
            self._requests.append(self._timed(self.comm.Iallreduce, MPI.IN_PLACE, wire, op=self._format.op))

    def _finish_exchange(self):
        if self.overlap:
            self._timed(wait_all, self._requests)
            self._requests = []
        else:
            for wire in self._wires:
                self._timed(self._reduce, wire)
        if not self._format.full:
            for grads, wire in zip(self._grads, self._wires):
                grads[...] = self._format.decode(wire)

    def _reduce(self, wire):
        if self.allreduce == "mpi":
            self.comm.Allreduce(MPI.IN_PLACE, wire, op=self._format.op)
        elif isinstance(self.comm, DeviceComm):
            # The hand-written algorithms run on persistent requests: stage the whole call, once.
            self.comm.backend.staged(functools.partial(self._algorithm, self.comm.comm, MPI.IN_PLACE), wire)
        else:
            self._algorithm(self.comm, MPI.IN_PLACE, wire)
