"""Mixture-of-experts routing: top-k softmax gate, expert capacity, dropped assignments, auxiliary loss.

Serial NumPy on one shard of tokens at a time; the layers of `parallel.expert.layer`
and `parallel.expert.moe` call these for every shard.

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

TOP_K_CHOICES = (1, 2)


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
        (k, n) (0 where dropped), ``counts`` (E,) kept rows per expert, and
        ``outputs`` (None) for the layer to fill with the experts' rows.
    """
    logits = x @ gate_weight + gate_bias
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = exp / exp.sum(axis=1, keepdims=True)
    n, k, experts = len(x), top_k, gate_weight.shape[1]
    choices = np.ascontiguousarray(np.argsort(-probs, axis=1, kind="stable")[:, :k].T)
    flat = choices.ravel()
    order = np.argsort(flat, kind="stable")
    wanted = np.bincount(flat, minlength=experts)
    position = np.empty(k * n, dtype=np.int64)
    position[order] = np.arange(k * n) - np.repeat(np.cumsum(wanted) - wanted, wanted)
    capacity = expert_capacity(n, experts, k, capacity_factor)
    kept = position < capacity
    weights = np.where(kept, probs[np.tile(np.arange(n), k), flat], 0).reshape(k, n)
    return _Routing(x, probs, choices, order[kept[order]], weights, np.minimum(wanted, capacity))


def routing_statistics(routings, experts):
    """The ``3E + 2`` float64 sums over ``routings`` behind the aux loss, the loads and the drops.

    In order: first choices per expert (E), probabilities per expert summed over the
    tokens (E), kept rows per expert (E), dropped assignments, tokens. Sums over
    shards (and ranks) add up elementwise.
    """
    stats = np.zeros(3 * experts + 2)
    for r in routings:
        stats[:experts] += np.bincount(r.choices[0], minlength=experts)
        stats[experts:2 * experts] += r.probs.sum(axis=0)
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
    gradient added to every token's probabilities (`auxiliary_loss_gradient`).
    Back through the softmax:
    ``dlogits = probs * (dprobs - sum(dprobs * probs))``.
    """
    n = len(routing.x)
    dprobs = np.tile(probability_grads, (n, 1))
    for choice, experts in enumerate(routing.choices):
        dprobs[np.arange(n), experts] += weight_grads[choice]
    probs = routing.probs
    return probs * (dprobs - np.sum(dprobs * probs, axis=1, keepdims=True))
