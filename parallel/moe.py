"""Mixture of experts: top-k softmax gating, expert capacity, all-to-all dispatch and combine.

Layer ``y_t = sum_{c < k, kept} g_{t,c} * expert_{e(t,c)}(x_t)``:

Gate
    ``probs = softmax(x Wg + bg)`` over ``E`` experts (``Wg`` (hidden, E), replicated);
    the ``k`` (1 or 2) choices of a token are its ``k`` largest probabilities (ties:
    lower expert first), and the combine weight ``g`` of a choice is its softmax
    probability (not renormalised over the ``k`` choices).
Capacity
    Tokens come in shards (one per rank; the serial layer is given the same shard
    sizes). Each (shard, expert) pair takes at most ``C = ceil(k * n / E *
    capacity_factor)`` assignments, ``n`` the shard's token count (`expert_capacity`).
    Assignments are processed choice by choice, tokens in order within a choice
    (all first choices, then all second choices, as GShard); those past ``C`` are
    dropped: they add nothing to ``y`` (a token with every choice dropped gives 0).
Auxiliary loss (Switch / GShard)
    ``aux = E * sum_e f_e P_e`` over all ``T`` tokens: ``f_e`` the fraction of tokens
    whose first choice is ``e`` (before drops), ``P_e`` the mean probability of ``e``.
    ``backward(dy)`` returns the gradients of ``sum(y * dy) + aux_loss_weight * aux``
    (``f`` is held constant: ``d aux / d probs[t, e] = E f_e / T``).
Experts
    Expert ``e`` is ``Sequential([Linear(hidden, ffn), ReLU(), Linear(ffn, hidden)])``
    with weights from ``default_rng([seed, e + 1, 0])`` and ``default_rng([seed, e + 1,
    1])``; the gate is ``Linear(hidden, E, rng=seed)``. With ``p`` ranks (``E``
    divisible by ``p``, else `InputError`) rank ``r`` owns experts ``r E/p ..
    (r+1) E/p - 1``. Each expert runs once per pass on all its rows, ordered by
    source shard, then by processing order, in the serial and parallel layers alike.

Parallel pass (`ParallelMoE`, tokens sharded: each rank routes its own ``n_r``
tokens). Forward: one ``Alltoall`` of the row counts per (destination, expert),
one ``Alltoallv`` of the kept rows to the experts' owners (exact counts, no
padding to capacity), the experts, one ``Alltoallv`` of their outputs back, the
combine, and one ``Allreduce`` of ``3E + 2`` float64 statistics (aux loss, loads,
drops). Backward: the same two ``Alltoallv`` (output gradients out, input
gradients back) and one ``Allreduce`` of the gate gradients (``(hidden + 1) E``
numbers). With ``R_out`` rows this rank sends to other ranks' experts (at most
``k n_r``) and ``R_in`` rows it takes from other ranks, ``w`` bytes per number,
each pass costs ``~2 (p-1) alpha + (R_out + R_in) hidden w beta`` in the
all-to-alls (plus ``(p-1) alpha`` for the counts, forward) and one small
allreduce. ``bytes_sent`` counts the all-to-all rows and counts exactly and the
allreduces as a ring would send them (`parallel.tensor_parallel.CommCounter`).
Memory per rank: the ``(k n_r, hidden)`` output and gradient buffers of the
combine, the received rows and the experts' activations (``R_in + kept own rows``
by ``ffn``).
"""
import math
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from kernels.errors import InputError
from parallel.layers import Layer, Linear, ReLU, Sequential
from parallel.tensor_parallel import CommCounter, CountedCommunication

TOP_K_CHOICES = (1, 2)


def expert_capacity(tokens, experts, top_k, capacity_factor):
    """Assignments one expert takes from a shard of ``tokens`` tokens: ``ceil(k * tokens / E * factor)``."""
    return math.ceil(top_k * tokens / experts * capacity_factor)


def build_expert(hidden, ffn, expert, seed, dtype):
    """Expert ``expert``: ``Linear(hidden, ffn)``, ReLU, ``Linear(ffn, hidden)``, seeds ``[seed, expert + 1, 0 / 1]``."""
    return Sequential([Linear(hidden, ffn, np.random.default_rng([seed, expert + 1, 0]), dtype), ReLU(),
                       Linear(ffn, hidden, np.random.default_rng([seed, expert + 1, 1]), dtype)])


@dataclass
class _Routing:
    """One shard's routing: ``choices`` (k, n) experts, ``dispatch`` kept assignment indices ``c * n + t``
    ordered by expert then processing order, ``weights`` (k, n) gates (0 where dropped), ``counts`` (E,)."""

    x: np.ndarray
    probs: np.ndarray
    choices: np.ndarray
    dispatch: np.ndarray
    weights: np.ndarray
    counts: np.ndarray
    outputs: np.ndarray = None


class _MixtureOfExperts(Layer):
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

    def _route(self, x):
        logits = x @ self.gate.params["weight"] + self.gate.params["bias"]
        exp = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = exp / exp.sum(axis=1, keepdims=True)
        n, k = len(x), self.top_k
        choices = np.ascontiguousarray(np.argsort(-probs, axis=1, kind="stable")[:, :k].T)
        flat = choices.ravel()
        order = np.argsort(flat, kind="stable")
        wanted = np.bincount(flat, minlength=self.num_experts)
        position = np.empty(k * n, dtype=np.int64)
        position[order] = np.arange(k * n) - np.repeat(np.cumsum(wanted) - wanted, wanted)
        capacity = expert_capacity(n, self.num_experts, k, self.capacity_factor)
        kept = position < capacity
        weights = np.where(kept, probs[np.tile(np.arange(n), k), flat], 0).reshape(k, n)
        return _Routing(x, probs, choices, order[kept[order]], weights, np.minimum(wanted, capacity))

    def _expert_batches(self, counts):
        """Per owned expert, the rows of a (source-major, expert-minor) buffer it takes, source by source."""
        starts = (np.cumsum(counts.ravel()) - counts.ravel()).reshape(counts.shape)
        return [np.concatenate([np.arange(starts[s, j], starts[s, j] + counts[s, j]) for s in range(len(counts))])
                .astype(np.int64) for j in range(counts.shape[1])]

    def _run_experts(self, rows, method):
        """Apply ``method`` (forward or backward) of each owned expert to its batch of ``rows``."""
        result = np.empty_like(rows)
        for batch, net in zip(self._batches, self.experts.values()):
            result[batch] = getattr(net, method)(rows[batch])
        return result

    def forward(self, x):
        x = np.asarray(x, dtype=self.dtype)
        if x.ndim != 2 or x.shape[1] != self.hidden:
            raise InputError(f"MoE: expected tokens of shape (n, {self.hidden}), got {x.shape}")
        self._routings = [self._route(shard) for shard in self._shards(x)]
        sent = [r.x[r.dispatch % max(len(r.x), 1)] for r in self._routings]
        rows, counts = self._to_experts(sent, [r.counts for r in self._routings])
        self._batches = self._expert_batches(counts)
        outputs = self._from_experts(self._run_experts(rows, "forward"))
        ys = []
        for routing, out in zip(self._routings, outputs):
            n = len(routing.x)
            routing.outputs = np.zeros((self.top_k * n, self.hidden), dtype=self.dtype)
            routing.outputs[routing.dispatch] = out
            routing.outputs = routing.outputs.reshape(self.top_k, n, self.hidden)
            ys.append((routing.weights[:, :, None] * routing.outputs).sum(axis=0))
        self._record_statistics()
        return _join(ys)

    def _record_statistics(self):
        """aux loss, loads and drops over all shards of all ranks (one `_sum` of ``3E + 2`` numbers)."""
        experts = self.num_experts
        stats = np.zeros(3 * experts + 2)
        for r in self._routings:
            stats[:experts] += np.bincount(r.choices[0], minlength=experts)
            stats[experts:2 * experts] += r.probs.sum(axis=0)
            stats[2 * experts:3 * experts] += r.counts
            stats[-2:] += (self.top_k * len(r.x) - r.counts.sum(), len(r.x))
        self._sum(stats)
        self.tokens = int(stats[-1])
        self.first_choice_fraction = stats[:experts] / max(self.tokens, 1)
        self.aux_loss = float(experts * np.dot(self.first_choice_fraction, stats[experts:2 * experts])
                              / max(self.tokens, 1))
        #: Kept rows per expert over all tokens, and the dropped assignments.
        self.expert_load, self.dropped = stats[2 * experts:3 * experts].astype(np.int64), int(stats[-2])

    def backward(self, dy):
        dy = np.asarray(dy, dtype=self.dtype)
        bounds = np.cumsum([len(r.x) for r in self._routings])[:-1]
        dys = np.split(dy, bounds)
        sent = [(r.weights[:, :, None] * d[None]).reshape(-1, self.hidden)[r.dispatch]
                for r, d in zip(self._routings, dys)]
        rows, _ = self._to_experts(sent, None)
        gate_grads = self.gate.grads
        for grad in gate_grads.values():
            grad[...] = 0
        dx_rows = self._from_experts(self._run_experts(rows, "backward"))
        aux_dprobs = self.aux_loss_weight * self.num_experts * self.first_choice_fraction / max(self.tokens, 1)
        dxs = []
        for routing, d, dx_kept in zip(self._routings, dys, dx_rows):
            n = len(routing.x)
            dx = np.zeros((self.top_k * n, self.hidden), dtype=self.dtype)
            dx[routing.dispatch] = dx_kept
            dweights = np.einsum("knd,nd->kn", routing.outputs, d)
            dprobs = np.tile(aux_dprobs.astype(self.dtype), (n, 1))
            for choice in range(self.top_k):
                dprobs[np.arange(n), routing.choices[choice]] += dweights[choice]
            probs = routing.probs
            dlogits = probs * (dprobs - np.sum(dprobs * probs, axis=1, keepdims=True))
            gate_grads["weight"] += routing.x.T @ dlogits
            gate_grads["bias"] += dlogits.sum(axis=0)
            dxs.append(dx.reshape(self.top_k, n, self.hidden).sum(axis=0) + dlogits @ self.gate.params["weight"].T)
        flat = self._sum(np.concatenate([gate_grads["weight"].ravel(), gate_grads["bias"]]))
        gate_grads["weight"].ravel()[:] = flat[:gate_grads["weight"].size]
        gate_grads["bias"][:] = flat[gate_grads["weight"].size:]
        return _join(dxs)


def _join(parts):
    """The per-shard arrays ``parts`` as one array (no copy for one shard)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class SerialMoE(_MixtureOfExperts):
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
        ``> 0``; see `expert_capacity`.
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
        return np.split(x, np.cumsum(self._shard_sizes)[:-1])

    def _to_experts(self, rows, counts):
        if counts is not None:
            self._counts = np.stack(counts)
        return np.concatenate(rows), self._counts

    def _from_experts(self, rows):
        return np.split(rows, np.cumsum(self._counts.sum(axis=1))[:-1])

    def _sum(self, array):
        return array


class ParallelMoE(CountedCommunication, _MixtureOfExperts):
    """Expert-parallel MoE: rank ``r`` owns experts ``r E/p .. (r+1) E/p - 1`` and routes its own tokens.

    Parameters as in `SerialMoE`, plus ``comm`` (the expert-parallel group; ``E``
    divisible by ``comm.size``). ``forward(x_local)``: this rank's tokens (n_r,
    hidden), any ``n_r >= 0``; returns their ``y``. ``backward(dy_local)`` returns
    their ``dx``. ``params`` / ``grads`` hold the replicated gate (its gradient
    summed over the ranks) and the owned experts, named as in the serial layer.
    After forward: ``aux_loss``, ``dropped``, ``expert_load``, ``tokens`` (global).
    """

    def __init__(self, hidden, ffn, experts, comm, top_k=1, capacity_factor=1.0, seed=0, dtype=np.float32,
                 aux_loss_weight=0.0):
        if experts % comm.size:
            raise InputError(f"ParallelMoE: {experts} experts cannot be spread evenly over {comm.size} ranks")
        self.local_experts = experts // comm.size
        first = comm.rank * self.local_experts
        super().__init__(hidden, ffn, experts, range(first, first + self.local_experts), top_k, capacity_factor,
                         seed, dtype, aux_loss_weight)
        self.comm, self.counter = comm, CommCounter(comm)

    def serial_reference(self):
        """A `SerialMoE` with the same settings (call its forward with every rank's token count)."""
        return SerialMoE(self.hidden, self.ffn, self.num_experts, self.top_k, self.capacity_factor, self.seed,
                         self.dtype, self.aux_loss_weight)

    def _shards(self, x):
        return [x]

    def _alltoallv(self, send, send_rows, recv_rows):
        start = MPI.Wtime()
        recv = np.empty((int(recv_rows.sum()), self.hidden), dtype=self.dtype)
        layout = [(rows * self.hidden, (np.cumsum(rows) - rows) * self.hidden) for rows in (send_rows, recv_rows)]
        self.comm.Alltoallv([np.ascontiguousarray(send), layout[0]], [recv, layout[1]])
        self.counter.seconds += MPI.Wtime() - start
        self.counter.bytes_sent += int(send_rows.sum() - send_rows[self.comm.rank]) * self.hidden * send.itemsize
        return recv

    def _to_experts(self, rows, counts):
        if counts is not None:
            start = MPI.Wtime()
            send_counts = counts[0].reshape(self.comm.size, self.local_experts).astype(np.int64)
            self._recv_counts = np.empty_like(send_counts)
            self.comm.Alltoall(send_counts, self._recv_counts)
            self.counter.seconds += MPI.Wtime() - start
            self.counter.bytes_sent += (self.comm.size - 1) * self.local_experts * send_counts.itemsize
            self._send_rows = send_counts.sum(axis=1)
        return self._alltoallv(rows[0], self._send_rows, self._recv_counts.sum(axis=1)), self._recv_counts

    def _from_experts(self, rows):
        return [self._alltoallv(rows, self._recv_counts.sum(axis=1), self._send_rows)]

    def _sum(self, array):
        return self.counter.allreduce(array)
