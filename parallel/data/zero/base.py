"""What the three ZeRO stages share: the step over micro-batches, the shards, their optimiser pairs.

A sharded trainer (`parallel.data.zero`) owns a `ShardLayout` of the flat
vectors; rank ``r`` holds the gradient (``shard_grads``) and the master weights
(`param_pieces`) of its pieces, and the optimiser built on `parameters` updates
only those, so its state is sharded too (ZeRO stage 1). A step runs every
micro-batch (``block_range`` of the rank's samples; each reduce-scattered and
summed into the shard: one reduce-scatter per micro-batch, as DeepSpeed's ZeRO-2
accumulates) layer by layer, calling the stage's hooks around each layer's
forward and backward; the stage gathers parameters and hands complete gradient
segments to `_reduce`. A rank without samples runs the same collectives with zero
gradients.

Mixed precision (``compute="float16"`` or ``"bfloat16"``,
`parallel.data.mixed_precision.ComputeFormat`): forward and backward in the
16-bit format, the loss scaled (`LossScaler`), each segment's gradients widened
into the master dtype before the reduce-scatter, the shard unscaled and the step
skipped on every rank when any shard holds a non-finite gradient (one
``allreduce`` of a flag); the master weights are the shard's, the model computes
on 16-bit copies (whole in stages 1 and 2, gathered per layer in stage 3).
"""
import contextlib

import numpy as np
from mpi4py import MPI

from kernels.backend import array_module
from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.data.mixed_precision import COMPUTE_FORMATS, ComputeFormat, default_scaler
from parallel.data.zero.exchange import ShardExchange
from parallel.data.zero.shards import ShardLayout, TransientBytes
from parallel.nn.layers import softmax_cross_entropy
from parallel.nn.models import flat_storage, flatten_arrays
from parallel.nn.optim import GradientStep


class ShardedTrainer(GradientStep):
    """Base of the ZeRO stages: ``compute_gradients`` leaves this rank's shard of the mean gradient.

    Parameters
    ----------
    comm : MPI.Comm or DeviceComm
    model : Layer
        As for `parallel.data.data_parallel.DataParallelTrainer` (rank 0's
        parameters are broadcast); its parameters and gradients are re-bound by the stage.
    collectives : str
        ``"mpi"`` or a hand-written pair (`parallel.data.zero.exchange.ZERO_COLLECTIVES`).
    micro_batches : int
        Micro-batches per rank and step (>= 1).
    loss : callable
        ``loss(logits, labels, batch_size) -> (value, dlogits)``.
    compute : {"full", "float16", "bfloat16"}
    loss_scaler : LossScaler, optional
        Under mixed precision (default `default_scaler`).

    Attributes
    ----------
    layout : ShardLayout
    shard_grads : ndarray, shape (layout.size,), or None
        This rank's pieces of the mean gradient after `compute_gradients` (unscaled);
        None where they are views of the model's gradients (stage 1, see `_gradient_shard`).
    param_pieces, grad_pieces : list of ndarray
        This rank's master weights and gradients, one view per segment (the optimiser's pairs).
    dtype, compute_dtype : numpy.dtype
        The master dtype (the model's) and the one forward and backward run in.
    transient : TransientBytes
        The arrays steps allocate and free (its ``peak``: the most at once).
    step_skipped : bool
    loss_scaler : LossScaler or None
    """

    def __init__(self, comm, model, collectives="mpi", micro_batches=1, loss=softmax_cross_entropy,
                 compute="full", loss_scaler=None):
        if int(micro_batches) != micro_batches or micro_batches < 1:
            raise InputError(f"need an integer micro_batches >= 1, got {micro_batches}")
        if compute not in COMPUTE_FORMATS:
            raise InputError(f"unknown compute format {compute!r}; choose from {', '.join(COMPUTE_FORMATS)}")
        self._exchange = ShardExchange(comm, collectives)
        self.comm, self.model, self.loss, self.compute = comm, model, loss, compute
        self.collectives, self.micro_batches = collectives, int(micro_batches)
        self._format = None if compute == "full" else ComputeFormat(compute)
        self.loss_scaler = None if compute == "full" else loss_scaler or default_scaler(compute)
        self._leaves = model.leaves()
        flat_params, flat_grads = flat_storage(model)
        comm.Bcast(flat_params, root=0)
        self._xp, self.dtype = array_module(flat_params), flat_params.dtype
        self.compute_dtype = self._format.dtype if self._format else self.dtype
        self._entries, start = [], 0  # per leaf: (name, start, stop, shape) of each parameter in the flat vector
        for leaf in self._leaves:
            self._entries.append([])
            for name, value in leaf.params.items():
                self._entries[-1].append((name, start, start + value.size, value.shape))
                start += value.size
        self.size = start
        sizes = [stop - first for entries in self._entries for _, first, stop, _ in entries]
        self.layout = ShardLayout(self._segments(sizes), comm.size, comm.rank)
        self.shard_grads, self.grad_pieces = self._gradient_shard(flat_grads)
        self.transient = TransientBytes()
        self.param_pieces = self._place(flat_params, flat_grads)

    @property
    def comm_seconds(self):
        """Time spent in the MPI calls of the sharded collectives, summed over all steps."""
        return self._exchange.seconds

    def parameters(self):
        """``(param, grad)`` pairs of this rank's pieces, one per segment, for an optimiser (`parallel.nn.optim`)."""
        return list(zip(self.param_pieces, self.grad_pieces))

    def compute_gradients(self, x, y, batch_size=None):
        """Leave in `shard_grads` this rank's shard of the mean gradient of the global batch (``x, y`` its
        shard on this rank, possibly empty); return this rank's share of the mean loss.

        ``batch_size``: the global batch (one small ``allreduce`` when not given)."""
        if len(x) != len(y):
            raise InputError(f"compute_gradients: {len(x)} samples but {len(y)} labels")
        if batch_size is None:
            batch_size = self._exchange.timed(self.comm.allreduce, len(x))
        self._begin()
        loss = 0.0
        with np.errstate(over="ignore", invalid="ignore") if self._format else np.errstate():
            for index in range(self.micro_batches):
                part = slice(*block_range(len(x), self.micro_batches, index))
                self._first = index == 0
                loss += self._micro_batch(x[part], y[part], batch_size)
            self.step_skipped = self._unscale()
        return loss

    def gather(self, pieces):
        """The full vector whose pieces (one per segment, this rank's) are ``pieces`` on every rank; collective,
        one allgather per segment (not counted in `comm_seconds`)."""
        full = self._xp.empty(self.size, pieces[0].dtype if pieces else self.dtype)
        with self._untimed():
            for index, ((start, stop), piece) in enumerate(zip(self.layout.segments, pieces)):
                full[start:stop][self.layout.own(index)] = piece
                self._exchange.allgather(full[start:stop], self.layout.counts[index],
                                         self.layout.displacements[index])
        return full

    def replica_mismatches(self):
        """Parameters of this rank's model (after `sync_model`) that differ from its gathered shards in the
        compute format, or from rank 0's model (one ``Bcast``); not counted in `comm_seconds`."""
        with self._untimed():
            self.sync_model()
        model = flatten_arrays([leaf.params[name] for leaf, entries in zip(self._leaves, self._entries)
                                for name, *_ in entries])
        gathered = self.gather(self.param_pieces)
        expected = self._xp.empty_like(model)
        if self._format:
            self._format.cast(gathered, expected)
        else:
            expected[...] = gathered
        reference = model.copy()
        self.comm.Bcast(reference, root=0)
        return int(self._xp.count_nonzero(model != expected) + self._xp.count_nonzero(model != reference))

    @contextlib.contextmanager
    def _untimed(self):
        """The collectives inside (a check's) are left out of `comm_seconds`."""
        seconds = self._exchange.seconds
        yield
        self._exchange.seconds = seconds

    def state_arrays(self):
        """The arrays of parameters and gradients this rank holds now (the model's as bound, the shards)."""
        return [self.shard_grads] + self.param_pieces + self.grad_pieces + [array for leaf in self._leaves
                                                         for kind in (leaf.params, leaf.grads)
                                                         for array in kind.values()]

    def _micro_batch(self, x, y, batch_size):
        """Forward, loss and backward of one micro-batch, layer by layer between the stage's hooks; the loss share.

        Without samples only the hooks run (their collectives), the gradients zero."""
        compute = len(x) > 0
        value = 0.0
        self._begin_micro_batch()
        if compute and self._format:
            x = self._format.input(x)
        for index, leaf in enumerate(self._leaves):
            self._before_forward(index)
            if compute:
                x = self._round(leaf.forward(x))
            self._after_forward(index)
        if compute:
            value, x = self._loss_and_gradient(x, y, batch_size)
        for index in reversed(range(len(self._leaves))):
            leaf = self._leaves[index]
            self._before_backward(index)
            if compute:
                x = self._round(leaf.backward(x))
            else:
                for grads in leaf.grads.values():
                    grads.fill(0)
            self._after_backward(index)
        return value

    def _loss_and_gradient(self, logits, y, batch_size):
        if not self._format:
            return self.loss(logits, y, batch_size)
        value, dlogits = self.loss(logits.astype(self.dtype), y, batch_size)
        dlogits *= self.loss_scaler.scale
        return value, self._format.input(dlogits)

    def _round(self, values):
        """``values`` rounded to the compute format (None, a first layer's skipped input gradient, as it is)."""
        return self._format.round(values) if self._format and values is not None else values

    def _reduce(self, index, gradients):
        """Reduce-scatter ``gradients`` (segment ``index``, this micro-batch's, compute dtype) into this rank's
        piece of `shard_grads` (added to it after the first micro-batch)."""
        if self._format:
            self._format.round(gradients)  # bfloat16: the weight gradients in the format
        widened = gradients.dtype != self.dtype
        source = self.transient.empty(self._xp, gradients.size, self.dtype) if widened else gradients
        if widened:
            source[...] = gradients
        piece, counts = self.grad_pieces[index], self.layout.counts[index]
        if self.shard_grads is None:  # the piece is the segment's own block
            scratch = self.transient.empty(self._xp, piece.size, self.dtype) if self._exchange.nonblocking else None
            self._exchange.reduce_scatter_in_place(source, self.layout.own(index), counts, scratch)
            if scratch is not None:
                self.transient.free(scratch)
        elif self._first:
            self._exchange.reduce_scatter(source, piece, counts)
        else:
            partial = self.transient.empty(self._xp, piece.size, self.dtype)
            self._exchange.reduce_scatter(source, partial, counts)
            piece += partial
            self.transient.free(partial)
        if widened:
            self.transient.free(source)

    def _unscale(self):
        """Unscale the shard; whether the step must be skipped (a non-finite gradient on any rank)."""
        if self.loss_scaler is None:
            return False
        finite = self._exchange.timed(self.comm.allreduce, bool(self._xp.isfinite(self.shard_grads).all()),
                                      op=MPI.LAND)
        self.shard_grads *= 1 / self.loss_scaler.scale
        return not self.loss_scaler.update(finite)

    def _gradient_shard(self, flat_grads):
        """The shard vector of this rank's gradients and its views per segment."""
        shard = self._xp.zeros(self.layout.size, self.dtype)
        return shard, self.layout.shard_views(shard)

    def _copy_pieces(self, flat_params):
        """This rank's pieces of ``flat_params`` copied into a master shard vector; its views per segment."""
        pieces = self.layout.shard_views(self._xp.empty(self.layout.size, self.dtype))
        for piece, source in zip(pieces, self.layout.flat_views(flat_params)):
            piece[...] = source
        return pieces

    def _bind(self, index, kind, entry, vector, start):
        """Bind parameter ``entry`` of leaf ``index``'s ``kind`` ("params" or "grads") to a view of ``vector``,
        which holds the flat range from ``start``."""
        name, low, high, shape = entry
        getattr(self._leaves[index], kind)[name] = vector[low - start:high - start].reshape(shape)

    def _unbind(self, index, kind):
        owner = getattr(self._leaves[index], kind)
        for name in owner:
            owner[name] = None

    def _begin_micro_batch(self):
        """A micro-batch starts."""

    def _before_forward(self, index):
        """Leaf ``index`` is about to run forward."""

    def _after_forward(self, index):
        """Leaf ``index`` has run forward."""

    def _before_backward(self, index):
        """Leaf ``index`` is about to run backward."""
