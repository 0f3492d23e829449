"""ZeRO stage 1: the optimiser state sharded (Megatron's distributed optimiser).

Every rank keeps the whole model (parameters and gradients) but the optimiser
state of its shard only. Backward leaves the gradients in the flat vector; each
gradient bucket (`parallel.data.gradient_wire.bucket_bounds`, last layers first;
one bucket by default) is reduce-scattered (SUM) as soon as backward has produced
it, so rank ``r`` gets the mean gradient of its pieces; the optimiser updates its
pieces of the parameters; the next step (or `sync_model`) first allgathers every
bucket's pieces, so every rank again holds all the parameters. Under mixed
precision the model's vectors are 16-bit copies, the master weights the shard's;
the pieces are cast to 16 bits before the allgather (half the bytes).

Memory per rank (float32, Adam, ``Psi`` parameters, ``N`` ranks): parameters
``4 Psi``, gradients ``4 Psi``, optimiser state ``8 Psi / N``.

Communication cost per step and rank: per bucket of ``n`` bytes one
reduce-scatter and one allgather of ``(p-1)/p n`` bytes each (the ring:
``2 (p-1)`` messages), i.e. one allreduce's bytes; with ``m`` micro-batches
``m`` reduce-scatters.
"""
from kernels.errors import InputError
from parallel.data.gradient_wire import bucket_bounds
from parallel.data.zero.base import ShardedTrainer
from parallel.nn.models import flat_storage


class OptimizerSharding(ShardedTrainer):
    """ZeRO stage 1 on ``comm``: whole parameters and gradients, optimiser state of this rank's shard.

    Parameters
    ----------
    comm, model, collectives, micro_batches, loss, compute, loss_scaler
        As for `parallel.data.zero.base.ShardedTrainer`.
    bucket_bytes : int
        Cap on a gradient bucket's bytes in the master dtype (>= 0; 0: one bucket).

    Attributes
    ----------
    model_params, model_grads : ndarray, shape (number of parameters,)
        The model's flat vectors (compute dtype; in full precision the master weights' memory too).
    buckets : list of (int, int)
        The segments, in the order they are reduce-scattered.
    """

    def __init__(self, comm, model, collectives="mpi", bucket_bytes=0, micro_batches=1, **options):
        if int(bucket_bytes) != bucket_bytes or bucket_bytes < 0:
            raise InputError(f"need an integer bucket_bytes >= 0, got {bucket_bytes}")
        self.bucket_bytes = int(bucket_bytes)
        super().__init__(comm, model, collectives, micro_batches, **options)
        self.buckets = self.layout.segments

    def sync_model(self):
        """Allgather the updated pieces into the model (cast to the compute format first); collective."""
        for index, segment in enumerate(self._param_segments):
            if self._format:
                self._format.cast(self.param_pieces[index], segment[self.layout.own(index)])
            self._exchange.allgather(segment, self.layout.counts[index], self.layout.displacements[index])

    def _gradient_shard(self, flat_grads):
        """In full precision with one micro-batch the pieces are the gradient vector's own (each bucket is
        reduce-scattered in place): no shard vector; else `ShardedTrainer`'s."""
        if self.compute != "full" or self.micro_batches > 1:
            return super()._gradient_shard(flat_grads)
        return None, self.layout.flat_views(flat_grads)

    def _segments(self, sizes):
        return bucket_bounds(sizes, self.dtype.itemsize, self.bucket_bytes)

    def _place(self, flat_params, flat_grads):
        """The model computes on the flat vectors (16-bit copies under mixed precision); return the master
        pieces (views of the parameters in full precision)."""
        if self._format:
            pieces = self._copy_pieces(flat_params)
            self.model_params, self.model_grads = flat_storage(self.model, self.compute_dtype)
        else:
            self.model_params, self.model_grads = flat_params, flat_grads
            pieces = self.layout.flat_views(flat_params)
        self._param_segments = [self.model_params[start:stop] for start, stop in self.layout.segments]
        self._grad_segments = [self.model_grads[start:stop] for start, stop in self.layout.segments]
        return pieces

    def _begin(self):
        self.sync_model()

    def _begin_micro_batch(self):
        self._remaining, self._next = self.size, 0

    def _after_backward(self, index):
        """Reduce-scatter every bucket lying wholly after the gradients backward has still to produce."""
        self._remaining -= sum(stop - start for _, start, stop, _ in self._entries[index])
        segments = self.layout.segments
        while self._next < len(segments) and segments[self._next][0] >= self._remaining:
            self._reduce(self._next, self._bucket(self._next))
            self._release(self._next)
            self._next += 1

    def _bucket(self, index):
        """The gradients of bucket ``index`` (a view of `model_grads`)."""
        return self._grad_segments[index]

    def _release(self, index):
        """Bucket ``index`` has been reduce-scattered: the gradients stay (stage 1)."""
