"""Mixture-of-experts routing: top-k softmax gate, expert capacity, dropped assignments, auxiliary loss.

One shard of tokens at a time; the layers of `parallel.expert.layer` and
`parallel.expert.moe` call these for every shard. The gate, the choices, the
dispatch order and the weights stay in the tokens' memory (NumPy or CuPy: the
array module of ``x``); the per-expert counts and the routing statistics, which
MPI exchanges (``Alltoall`` of counts, ``Allreduce`` of statistics), are small
host arrays (``3 E`` numbers per shard read back from a device).

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
    Its gradient holds ``f`` constant: ``d aux / d probs[t, e] = E f_e / T``.
"""
import math
from dataclasses import dataclass

import numpy as np

from kernels.backend import array_module

TOP_K_CHOICES = (1, 2)


def host(array):
    """``array`` as a NumPy array: itself on the host, a copy from device memory (small arrays only)."""
    return array if array_module(array) is np else array.get()


def bincount(xp, values, length):
    """``xp.bincount(values, minlength=length)``, also for no values (CuPy takes the maximum of ``values``)."""
    return xp.bincount(values, minlength=length) if values.size else xp.zeros(length, np.int64)


def expert_capacity(tokens, experts, top_k, capacity_factor):
    """Assignments one expert takes from a shard of ``tokens`` tokens: ``ceil(k * tokens / E * factor)``."""
    return math.ceil(top_k * tokens / experts * capacity_factor)


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


def route_tokens(x, gate_weight, gate_bias, top_k, capacity_factor):
    """Gate and route one shard of tokens.

    Parameters
    ----------
    x : ndarray (n, hidden)
        The shard's tokens.
    gate_weight, gate_bias : ndarray (hidden, E), (E,)
        The gate's parameters.
    top_k : int
        Choices per token (1 or 2).
    capacity_factor : float
        ``> 0``; see `expert_capacity`.

    Returns
    -------
    routing
        ``x``, ``probs`` (n, E), ``choices`` (k, n), ``dispatch`` (the kept assignment
        indices ``c * n + t``, ordered by expert then processing order), ``weights``
        (k, n) (0 where dropped), ``counts`` (E,) kept rows per expert (a host
        array), and ``outputs`` (None) for the layer to fill with the experts' rows;
        all but ``counts`` in the memory of ``x``.
    """
    xp = array_module(x)
    logits = x @ gate_weight + gate_bias
    exp = xp.exp(logits - logits.max(axis=1, keepdims=True))
    probs = exp / exp.sum(axis=1, keepdims=True)
    n, k, experts = len(x), top_k, gate_weight.shape[1]
    choices = xp.ascontiguousarray(xp.argsort(-probs, axis=1, kind="stable")[:, :k].T)
    flat = choices.ravel()
    order = xp.argsort(flat, kind="stable")
    wanted = bincount(xp, flat, experts)
    position = xp.empty(k * n, dtype=np.int64)
    position[order] = xp.arange(k * n) - (xp.cumsum(wanted) - wanted)[flat[order]]  # rank within the expert
    capacity = expert_capacity(n, experts, k, capacity_factor)
    kept = position < capacity
    weights = xp.where(kept, probs[xp.tile(xp.arange(n), k), flat], 0).reshape(k, n)
    return _Routing(x, probs, choices, order[kept[order]], weights, host(xp.minimum(wanted, capacity)))


def routing_statistics(routings, experts):
    """The ``3E + 2`` float64 sums over ``routings`` behind the aux loss, the loads and the drops (host).

    In order: first choices per expert (E), probabilities per expert summed over the
    tokens (E), kept rows per expert (E), dropped assignments, tokens. Sums over
    shards (and ranks) add up elementwise.
    """
    stats = np.zeros(3 * experts + 2)
    for r in routings:
        xp = array_module(r.probs)
        stats[:experts] += host(bincount(xp, r.choices[0], experts))
        stats[experts:2 * experts] += host(r.probs.sum(axis=0))
        stats[2 * experts:3 * experts] += r.counts
        stats[-2:] += (r.choices.size - r.counts.sum(), len(r.x))
    return stats


def auxiliary_loss(first_choice_fraction, probability_sums, tokens):
    """``E * sum_e f_e P_e`` with ``f`` the ``first_choice_fraction`` (E,) and ``P = probability_sums / tokens``."""
    experts = len(first_choice_fraction)
    return float(experts * np.dot(first_choice_fraction, probability_sums) / max(tokens, 1))


def auxiliary_loss_gradient(weight, first_choice_fraction, tokens):
    """``weight * d aux / d probs[t, :]`` (E,), the same for every token: ``weight E f / T`` (``f`` held constant)."""
    return weight * len(first_choice_fraction) * first_choice_fraction / max(tokens, 1)


def gate_logit_gradient(routing, weight_grads, probability_grads):
    """Gradient of the loss with respect to one shard's gate logits (n, E).

    ``weight_grads`` (k, n): the gradients of the combine weights ``g`` (0 for
    dropped assignments, whose expert output is 0); ``probability_grads`` (E,): a
    gradient added to every token's probabilities (`auxiliary_loss_gradient`), in
    the memory of the routing's arrays.
    Back through the softmax:
    ``dlogits = probs * (dprobs - sum(dprobs * probs))``.
    """
    n, xp = len(routing.x), array_module(routing.probs)
    dprobs = xp.tile(probability_grads, (n, 1))
    rows = xp.arange(n)
    for choice, experts in enumerate(routing.choices):
        dprobs[rows, experts] += weight_grads[choice]
    probs = routing.probs
    return probs * (dprobs - (dprobs * probs).sum(axis=1, keepdims=True))
