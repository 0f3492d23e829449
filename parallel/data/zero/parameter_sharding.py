"""ZeRO stage 3 (FSDP): parameters sharded too, each layer's gathered before use and freed after.

Segments are the layers (each leaf with parameters: its flat range), each split
by `block_range`. Between steps a rank holds only its pieces of the parameters,
gradients and optimiser state. In a micro-batch, every layer's parameters are
allgathered into a buffer before its forward and freed after it, allgathered
again before its backward (the last layer's stay from its forward), and after
its backward its gradients are reduce-scattered into the shard and both buffers
freed. The next layer's allgather is posted (``Iallgatherv``, prefetch depth one)
before the current layer computes, so it travels during the compute; with the
hand-written collectives (blocking) it runs when posted, without overlap. Under
mixed precision a rank casts its master piece to the 16-bit format into the
gathered buffer, so the allgather carries 16-bit values.

Memory per rank (float32, Adam): ``16 Psi / N`` between steps; within a step
two layers' parameters (the one computing and the prefetched one), one layer's
gradients and, in mixed precision, their widened copy.

Communication cost per micro-batch and rank: per layer of ``n`` parameter bytes
(compute format) two allgathers (one for the last layer) of ``(p-1)/p n`` bytes
and one reduce-scatter of ``(p-1)/p n`` bytes in the master dtype: 1.5 times
the bytes of stages 1 and 2, in ``3 L`` collectives instead of ``2`` per bucket.
"""
from parallel.data.zero.base import ShardedTrainer


class ParameterSharding(ShardedTrainer):
    """ZeRO stage 3 on ``comm``: this rank's shard of parameters, gradients and optimiser state only.

    Parameters are `parallel.data.zero.base.ShardedTrainer`'s. Between steps the
    model's ``params`` and ``grads`` entries are None; `sync_model` gathers the
    whole model into it (freed at the next step).
    """

    def sync_model(self):
        """Allgather every layer's parameters into the model and keep them (until the next step); collective."""
        self._free_all()
        for index in self._layers:
            buffer, request = self._post(index)
            self._exchange.wait(request)
            self._gathered[index] = buffer, None

    def _segments(self, sizes):
        spans = []
        for entries in self._entries:
            if entries:
                spans.append((entries[0][1], entries[-1][2]))
        return spans

    def _place(self, flat_params, flat_grads):
        """Keep this rank's pieces; the model holds nothing until a layer is gathered."""
        pieces = self._copy_pieces(flat_params)
        self._layers = [index for index, entries in enumerate(self._entries) if entries]
        self._segment_of = {index: segment for segment, index in enumerate(self._layers)}
        self._uses = self._layers + self._layers[::-1]  # the order the layers are gathered in a micro-batch
        self._gathered, self._gradients = {}, {}  # leaf -> (buffer, request); leaf -> gradient buffer
        for index in self._layers:
            leaf = self._leaves[index]
            if self._format and hasattr(leaf, "dtype"):
                leaf.dtype = self.compute_dtype  # the layer casts its input to the gathered weights' type
            self._unbind(index, "params")
            self._unbind(index, "grads")
        return pieces

    def _begin(self):
        self._free_all()

    def _begin_micro_batch(self):
        self._cursor = 0
        if self._uses:
            self._gathered[self._uses[0]] = self._post(self._uses[0])

    def _before_forward(self, index):
        if index in self._segment_of:
            self._acquire(index)

    def _after_forward(self, index):
        if index in self._segment_of and self._uses[self._cursor] != index:
            self._free(index)

    def _before_backward(self, index):
        if index in self._segment_of:
            self._acquire(index)
            start, stop = self.layout.segments[self._segment_of[index]]
            self._gradients[index] = self.transient.empty(self._xp, stop - start, self.compute_dtype)
            for entry in self._entries[index]:
                self._bind(index, "grads", entry, self._gradients[index], start)

    def _after_backward(self, index):
        if index in self._segment_of:
            gradients = self._gradients.pop(index)
            self._reduce(self._segment_of[index], gradients)
            self.transient.free(gradients)
            self._unbind(index, "grads")
            self._free(index)

    def _acquire(self, index):
        """Wait for leaf ``index``'s parameters (the use at the cursor; the last layer's backward finds them
        kept from its forward) and post the next use's allgather."""
        buffer, request = self._gathered[index]
        self._exchange.wait(request)
        self._gathered[index] = buffer, None
        self._cursor += 1
        following = self._uses[self._cursor] if self._cursor < len(self._uses) else None
        if following is not None and following not in self._gathered:
            self._gathered[following] = self._post(following)

    def _post(self, index):
        """Allocate leaf ``index``'s parameter buffer, put this rank's piece in it (compute format), bind the
        leaf's parameters to it and start the allgather; return ``(buffer, request)``."""
        segment = self._segment_of[index]
        start, stop = self.layout.segments[segment]
        buffer = self.transient.empty(self._xp, stop - start, self.compute_dtype)
        own = buffer[self.layout.own(segment)]
        if self._format:
            self._format.cast(self.param_pieces[segment], own)
        else:
            own[...] = self.param_pieces[segment]
        for entry in self._entries[index]:
            self._bind(index, "params", entry, buffer, start)
        return buffer, self._exchange.start_allgather(buffer, self.layout.counts[segment],
                                                      self.layout.displacements[segment])

    def _free(self, index):
        buffer, _ = self._gathered.pop(index)
        self.transient.free(buffer)
        self._unbind(index, "params")

    def _free_all(self):
        for index in list(self._gathered):
            self._free(index)
