"""ZeRO stage 2: gradients sharded too; each bucket reduce-scattered as backward produces it, then freed.

As stage 1 (`parallel.data.zero.optimizer_sharding`), but the model keeps no
gradient vector: before a layer's backward its gradients are bound to the
buffers of the buckets they belong to (allocated when the first of their
parameters comes), and once backward has completed a bucket it is
reduce-scattered into this rank's shard and its buffer freed. Between steps a
rank holds the whole parameters, its shard of the gradients and of the optimiser
state; within a step, the buckets in flight (at most the buckets a layer's
parameters span, plus the one being filled): the bucket cap bounds it.

Memory per rank (float32, Adam): ``4 Psi + 12 Psi / N`` between steps.

Communication cost per step and rank: stage 1's (one reduce-scatter per bucket
and micro-batch, one allgather per bucket).
"""
from parallel.data.zero.base import ShardedTrainer
from parallel.data.zero.optimizer_sharding import OptimizerSharding


class GradientSharding(OptimizerSharding):
    """ZeRO stage 2 on ``comm``: whole parameters, this rank's shard of the gradients and optimiser state.

    Parameters are `OptimizerSharding`'s; `model_grads` is None (the buckets are allocated per step).
    """

    _gradient_shard = ShardedTrainer._gradient_shard  # a shard vector of its own: the buckets are freed

    def _place(self, flat_params, flat_grads):
        pieces = super()._place(flat_params, flat_grads)
        self.model_grads, self._grad_segments, self._buffers = None, None, {}
        self._bucket_of = {}  # (leaf, parameter entry) -> the bucket holding its gradient
        for index, entries in enumerate(self._entries):
            self._unbind(index, "grads")
            for entry in entries:
                self._bucket_of[index, entry[0]] = next(
                    k for k, (start, stop) in enumerate(self.layout.segments) if start <= entry[1] < stop)
        return pieces

    def _before_backward(self, index):
        """Bind the leaf's gradients to their buckets' buffers, allocating those not yet there."""
        for entry in self._entries[index]:
            bucket = self._bucket_of[index, entry[0]]
            start, stop = self.layout.segments[bucket]
            if bucket not in self._buffers:
                self._buffers[bucket] = self.transient.empty(self._xp, stop - start, self.compute_dtype)
            self._bind(index, "grads", entry, self._buffers[bucket], start)

    def _bucket(self, index):
        return self._buffers[index]

    def _release(self, index):
        """Free bucket ``index`` and unbind the gradients it held."""
        self.transient.free(self._buffers.pop(index))
        start, stop = self.layout.segments[index]
        for leaf, entries in enumerate(self._entries):
            for name, low, _, _ in entries:
                if start <= low < stop:
                    self._leaves[leaf].grads[name] = None
