"""Mixture-of-experts layer: experts, dispatch to expert batches, combine, and the serial reference.

Layer ``y_t = sum_{c < k, kept} g_{t,c} * expert_{e(t,c)}(x_t)``, with the gate,
choices ``e(t, c)``, weights ``g``, capacity and auxiliary loss of
`parallel.expert.routing`. ``backward(dy)`` returns the gradients of
``sum(y * dy) + aux_loss_weight * aux``.

Experts
    Expert ``e`` is ``Sequential([Linear(hidden, ffn), ReLU(), Linear(ffn, hidden)])``
    with weights from ``default_rng([seed, e + 1, 0])`` and ``default_rng([seed, e + 1,
    1])``; the gate is ``Linear(hidden, E, rng=seed)``. Each expert runs once per pass
    on all its rows, ordered by source shard, then by processing order, in the serial
    and parallel layers alike.

`MoELayer` holds what the serial and expert-parallel layers share; `SerialMoE`
(every expert on one process) is the reference for `parallel.expert.moe.ParallelMoE`.

Devices: build the layer on the host, move it with ``layer.to(backend)``
(`parallel.nn.layers.Layer.to`) and pass device tokens; the rows, expert
batches and gradients then stay in device memory (the array module of the
tokens), only the routing counts and statistics come to the host
(`parallel.expert.routing`). The expert batches are host index arrays.
"""
import numpy as np

from kernels.backend import array_module
from kernels.errors import InputError
from parallel.nn.layers import Layer, Linear, ReLU, Sequential
from parallel.expert.routing import (TOP_K_CHOICES, auxiliary_loss, auxiliary_loss_gradient, gate_logit_gradient,
                                     route_tokens, routing_statistics)


def build_expert(hidden, ffn, expert, seed, dtype):
    """Expert ``expert``: ``Linear(hidden, ffn)``, ReLU, ``Linear(ffn, hidden)``, seeds ``[seed, expert + 1, 0 / 1]``."""
    return Sequential([Linear(hidden, ffn, np.random.default_rng([seed, expert + 1, 0]), dtype), ReLU(),
                       Linear(ffn, hidden, np.random.default_rng([seed, expert + 1, 1]), dtype)])


class MoELayer(Layer):
    """Gate, routing, expert batches and combine shared by the serial and parallel layers.

    Subclasses define how shards are formed and how expert rows travel:
    ``_shards(x)``, ``_to_experts(rows, counts)``, ``_from_experts(rows)`` and ``_sum(array)``.
    """

    def __init__(self, hidden, ffn, experts, owned, top_k, capacity_factor, seed, dtype, aux_loss_weight):
        if min(hidden, ffn, experts) < 1 or top_k not in TOP_K_CHOICES or top_k > experts or \
                not capacity_factor > 0:
            raise InputError(f"MoE: need hidden, ffn, experts >= 1, top_k in {TOP_K_CHOICES} (<= experts) and "
                             f"capacity_factor > 0; got {hidden}, {ffn}, {experts}, {top_k}, {capacity_factor}")
        self.hidden, self.ffn, self.num_experts, self.top_k = hidden, ffn, experts, top_k
        self.capacity_factor, self.seed, self.dtype = capacity_factor, seed, np.dtype(dtype)
        self.aux_loss_weight = aux_loss_weight
        self.gate = Linear(hidden, experts, rng=seed, dtype=dtype)
        self.experts = {e: build_expert(hidden, ffn, e, seed, dtype) for e in owned}

    def _named(self, kind):
        """``params`` or ``grads`` of the gate and the owned experts: ``gate.weight``, ``expert3.0.bias``..."""
        named = {f"gate.{key}": value for key, value in getattr(self.gate, kind).items()}
        for expert, net in self.experts.items():
            named.update((f"expert{expert}.{key}", value) for key, value in getattr(net, kind).items())
        return named

    @property
    def params(self):
        return self._named("params")

    @property
    def grads(self):
        return self._named("grads")

    def leaves(self):
        return [self.gate] + [leaf for net in self.experts.values() for leaf in net.leaves()]

    def _expert_batches(self, counts):
        """Per owned expert, the rows of a (source-major, expert-minor) buffer it takes, source by source."""
        starts = (np.cumsum(counts.ravel()) - counts.ravel()).reshape(counts.shape)
        return [np.concatenate([np.arange(starts[s, j], starts[s, j] + counts[s, j]) for s in range(len(counts))])
                .astype(np.int64) for j in range(counts.shape[1])]

    def _run_experts(self, rows, method):
        """Apply ``method`` (forward or backward) of each owned expert to its batch of ``rows``."""
        result = array_module(rows).empty_like(rows)
        for batch, net in zip(self._batches, self.experts.values()):
            result[batch] = getattr(net, method)(rows[batch])
        return result

    def forward(self, x):
        x = x.astype(self.dtype, copy=False)
        xp = array_module(x)
        if x.ndim != 2 or x.shape[1] != self.hidden:
            raise InputError(f"MoE: expected tokens of shape (n, {self.hidden}), got {x.shape}")
        self._routings = [route_tokens(shard, self.gate.params["weight"], self.gate.params["bias"], self.top_k,
                                       self.capacity_factor) for shard in self._shards(x)]
        sent = [r.x[r.dispatch % max(len(r.x), 1)] for r in self._routings]
        rows, counts = self._to_experts(sent, [r.counts for r in self._routings])
        self._batches = self._expert_batches(counts)
        outputs = self._from_experts(self._run_experts(rows, "forward"))
        ys = []
        for routing, out in zip(self._routings, outputs):
            n = len(routing.x)
            routing.outputs = xp.zeros((self.top_k * n, self.hidden), dtype=self.dtype)
            routing.outputs[routing.dispatch] = out
            routing.outputs = routing.outputs.reshape(self.top_k, n, self.hidden)
            ys.append((routing.weights[:, :, None] * routing.outputs).sum(axis=0))
        self._record_statistics()
        return _join(xp, ys)

    def _record_statistics(self):
        """aux loss, loads and drops over all shards of all ranks (one `_sum` of ``3E + 2`` numbers)."""
        experts = self.num_experts
        stats = routing_statistics(self._routings, experts)
        self._sum(stats)
        self.tokens = int(stats[-1])
        self.first_choice_fraction = stats[:experts] / max(self.tokens, 1)
        self.aux_loss = auxiliary_loss(self.first_choice_fraction, stats[experts:2 * experts], self.tokens)
        #: Kept rows per expert over all tokens, and the dropped assignments.
        self.expert_load, self.dropped = stats[2 * experts:3 * experts].astype(np.int64), int(stats[-2])

    def backward(self, dy):
        dy = dy.astype(self.dtype, copy=False)
        xp = array_module(dy)
        dys = _split(xp, dy, [len(r.x) for r in self._routings])
        sent = [(r.weights[:, :, None] * d[None]).reshape(-1, self.hidden)[r.dispatch]
                for r, d in zip(self._routings, dys)]
        rows, _ = self._to_experts(sent, None)
        gate_grads = self.gate.grads
        for grad in gate_grads.values():
            grad[...] = 0
        dx_rows = self._from_experts(self._run_experts(rows, "backward"))
        aux_dprobs = xp.asarray(auxiliary_loss_gradient(self.aux_loss_weight, self.first_choice_fraction,
                                                        self.tokens).astype(self.dtype))
        dxs = []
        for routing, d, dx_kept in zip(self._routings, dys, dx_rows):
            n = len(routing.x)
            dx = xp.zeros((self.top_k * n, self.hidden), dtype=self.dtype)
            dx[routing.dispatch] = dx_kept
            dlogits = gate_logit_gradient(routing, xp.einsum("knd,nd->kn", routing.outputs, d), aux_dprobs)
            gate_grads["weight"] += routing.x.T @ dlogits
            gate_grads["bias"] += dlogits.sum(axis=0)
            dxs.append(dx.reshape(self.top_k, n, self.hidden).sum(axis=0) + dlogits @ self.gate.params["weight"].T)
        flat = self._sum(xp.concatenate([gate_grads["weight"].ravel(), gate_grads["bias"]]))
        gate_grads["weight"].ravel()[:] = flat[:gate_grads["weight"].size]
        gate_grads["bias"][:] = flat[gate_grads["weight"].size:]
        return _join(xp, dxs)


def _join(xp, parts):
    """The per-shard arrays ``parts`` as one array (no copy for one shard)."""
    return parts[0] if len(parts) == 1 else xp.concatenate(parts)


def _split(xp, array, sizes):
    """``array`` cut along its first axis into blocks of ``sizes`` rows (a host list)."""
    return xp.split(array, np.cumsum(sizes)[:-1].tolist())


class SerialMoE(MoELayer):
    """The reference: every expert on one process; tokens routed shard by shard as the ranks would.

    Parameters
    ----------
    hidden, ffn : int
        Token width and expert inner width.
    experts : int
        Number of experts ``E``.
    top_k : int
        1 or 2 choices per token.
    capacity_factor : float
        ``> 0``; see `parallel.expert.routing.expert_capacity`.
    seed : int
    dtype : numpy dtype
    aux_loss_weight : float
        Weight of the auxiliary loss in the gradients of `backward`.

    ``forward(x, shard_sizes=None)``: ``x`` (T, hidden), the tokens of all shards in
    order; ``shard_sizes`` their token counts (default: one shard of ``T``). Returns
    ``y`` (T, hidden). ``backward(dy)`` returns ``dx`` (T, hidden).
    """

    def __init__(self, hidden, ffn, experts, top_k=1, capacity_factor=1.0, seed=0, dtype=np.float32,
                 aux_loss_weight=0.0):
        super().__init__(hidden, ffn, experts, range(experts), top_k, capacity_factor, seed, dtype,
                         aux_loss_weight)

    def forward(self, x, shard_sizes=None):
        self._shard_sizes = [len(x)] if shard_sizes is None else list(shard_sizes)
        if sum(self._shard_sizes) != len(x) or min(self._shard_sizes) < 0:
            raise InputError(f"SerialMoE: shard sizes {self._shard_sizes} do not add up to {len(x)} tokens")
        return super().forward(x)

    def _shards(self, x):
        return _split(array_module(x), x, self._shard_sizes)

    def _to_experts(self, rows, counts):
        if counts is not None:
            self._counts = np.stack(counts)
        return array_module(*rows).concatenate(rows), self._counts

    def _from_experts(self, rows):
        return _split(array_module(rows), rows, self._counts.sum(axis=1))

    def _sum(self, array):
        return array
