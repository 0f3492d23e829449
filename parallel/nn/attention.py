"""Multi-head attention: the serial reference, and the blockwise kernels the parallel versions share.

Layout: ``Q, K, V, O`` and their gradients are C-contiguous arrays of shape
``(heads, seq, dim)``; a batch is folded into the heads axis (``batch * heads``
independent problems). Per head, with ``c = 1 / sqrt(dim)``::

    S = c Q K^T        (causal: S_ij = -inf where key position j > query position i)
    m_i = max_j S_ij,  lse_i = m_i + log sum_j exp(S_ij - m_i),  P = exp(S - lse),  O = P V
    dV = P^T dO,  dP = dO V^T,  D_i = sum_k dO_ik O_ik,  dS = P * (dP - D),  dQ = c dS K,  dK = c dS^T Q

Exponents are always max-subtracted (``S - m`` or ``S - lse`` is <= 0), so scores
of any magnitude are safe; ``lse`` has shape ``(heads, seq)``. A query that sees no
key at all gets ``O = 0`` and ``lse = -inf``. Every function computes with the
array module of its inputs (`kernels.backend.array_module`): device arrays in,
device arrays out, scratch and causal masks made on the device.

The blockwise kernels work on *spans*: a rank's tokens are a list of global,
increasing, half-open ranges ``(start, stop)`` stored one after another along the
``seq`` axis. `attend_block` merges the attention of local queries to one key
block into running ``(O, lse)`` by log-sum-exp (online softmax), one score tile
of ``TILES = (query rows, keys)`` at a time and one head at a time, so the score
scratch is one tile (two in the backward pass) whatever the sequence length.
Under a causal mask only the keys a tile can see are computed: for increasing
key spans they are a prefix of the key tile, and a tile no query sees costs nothing.
"""
import math
import time
from dataclasses import dataclass

import numpy as np

from kernels.backend import array_module
from kernels.errors import InputError

#: Score tile of the blockwise kernels: (query rows, keys).
TILES = (256, 1024)


@dataclass
class AttentionStats:
    """Work counters of attention calls on one rank, accumulated over calls.

    ``compute_s``: seconds inside the blockwise kernels; ``bytes_sent`` and
    ``messages``: point-to-point or all-to-all traffic sent by this rank.
    """

    compute_s: float = 0.0
    bytes_sent: int = 0
    messages: int = 0


def check_qkv(q, k, v):
    """Raise `InputError` unless ``q, k, v`` are finite float (heads, seq, dim) arrays that fit together
    (all in host memory, or all on one device)."""
    xp = array_module(q, k, v)
    for name, array in (("q", q), ("k", k), ("v", v)):
        if not isinstance(array, xp.ndarray) or array.ndim != 3 or array.dtype.kind != "f":
            raise InputError(f"attention: {name} must be a float array of shape (heads, seq, dim), "
                             f"in the memory of the others ({xp.__name__})")
        if not xp.isfinite(array).all():
            raise InputError(f"attention: {name} holds NaN or infinite values")
    if k.shape != v.shape or q.shape[::2] != k.shape[::2] or not q.dtype == k.dtype == v.dtype:
        raise InputError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} need equal heads, dim and dtype, "
                         "and k, v equal shapes")


def _masked_scores(q, k, causal, q_positions, k_positions):
    """Dense scores ``c Q K^T`` of shape (heads, nq, nk), -inf where the causal mask hides a key."""
    xp = array_module(q)
    scores = xp.matmul(q, k.transpose(0, 2, 1)) / math.sqrt(q.shape[-1])
    if causal:
        q_pos = xp.arange(q.shape[1]) if q_positions is None else xp.asarray(q_positions)
        k_pos = xp.arange(k.shape[1]) if k_positions is None else xp.asarray(k_positions)
        scores += _mask_bias(xp, k_pos[None, :] > q_pos[:, None], scores.dtype)
    return scores


def _mask_bias(xp, hidden, dtype):
    """-inf where ``hidden``, 0 elsewhere: added to scores, it masks them (scores are finite)."""
    return xp.where(hidden, -np.inf, 0.0).astype(dtype)


def _finite_or(xp, values, fill):
    """``values`` with -inf replaced by ``fill`` (rows that see no key)."""
    return xp.where(values == -np.inf, fill, values)


def attention_forward(q, k, v, causal=False, q_positions=None, k_positions=None):
    """Dense serial attention: return ``(O, lse)`` of shapes (heads, nq, dim) and (heads, nq).

    ``q_positions`` / ``k_positions`` (default ``arange``) are the global token
    positions the causal mask compares, so a few query rows can be checked alone.
    Holds the (heads, nq, nk) scores: for tests and row-wise checks.
    """
    check_qkv(q, k, v)
    xp = array_module(q)
    scores = _masked_scores(q, k, causal, q_positions, k_positions)
    row_max = scores.max(axis=-1) if k.shape[1] else xp.full(scores.shape[:-1], -np.inf, dtype=scores.dtype)
    weights = xp.exp(scores - _finite_or(xp, row_max, 0.0)[..., None])
    total = weights.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = xp.matmul(weights, v) / total[..., None]
        lse = row_max + xp.log(total)
    return xp.where(total[..., None] > 0, out, 0.0), lse


def attention_backward(q, k, v, out, lse, dout, causal=False, q_positions=None, k_positions=None):
    """Dense serial backward: return ``(dQ, dK, dV)`` given ``dO`` (see the module formulas).

    ``out`` and ``lse`` are the forward results of all queries ``q``; with a subset
    of keys ``k, v`` (and their ``k_positions``) it returns those keys' exact
    ``dK, dV`` rows and the part of ``dQ`` that comes from them.
    """
    check_qkv(q, k, v)
    xp = array_module(q)
    scores = _masked_scores(q, k, causal, q_positions, k_positions)
    weights = xp.exp(scores - _finite_or(xp, lse, np.inf)[..., None])
    dscores = weights * (xp.matmul(dout, v.transpose(0, 2, 1)) - output_delta(out, dout)[..., None])
    scale = 1.0 / math.sqrt(q.shape[-1])
    return (scale * xp.matmul(dscores, k), scale * xp.matmul(dscores.transpose(0, 2, 1), q),
            xp.matmul(weights.transpose(0, 2, 1), dout))


def output_delta(out, dout):
    """``D = rowsum(dO * O)`` of shape (heads, seq), the softmax term of the backward pass."""
    return array_module(out).einsum("hnd,hnd->hn", dout, out)


def span_length(spans):
    """Number of tokens in ``spans``."""
    return sum(stop - start for start, stop in spans)


def split_spans(spans, size):
    """Cut the tokens of ``spans`` (in storage order) into pieces of at most ``size`` tokens.

    Returns ``[(first, last, piece_spans), ...]``: local token range and global spans of each piece.
    """
    pieces = []
    for first in range(0, span_length(spans), size):
        last, piece_spans, offset = min(first + size, span_length(spans)), [], 0
        for start, stop in spans:
            low, high = max(first, offset), min(last, offset + stop - start)
            if low < high:
                piece_spans.append((start + low - offset, start + high - offset))
            offset += stop - start
        pieces.append((first, last, piece_spans))
    return pieces


def _work(q_spans, k_spans, causal, tiles, xp, dtype):
    """Yield ``(columns, rows, masks)`` for every (query tile, key tile) pair with something to compute.

    ``rows`` / ``columns`` slice the local queries and keys (under a causal mask
    only the keys the tile can see, a prefix of the key tile since key spans
    increase); ``masks`` are the `_causal_masks` relative to ``columns``, arrays
    of module ``xp`` and type ``dtype``.
    """
    query_rows, key_columns = tiles
    for key_first, _, tile_spans in split_spans(k_spans, key_columns):
        local = 0
        for start, stop in q_spans:
            for first in range(start, stop, query_rows):
                last = min(first + query_rows, stop)
                keys = span_length(tile_spans)
                if causal:
                    keys = sum(min(max(last - low, 0), high - low) for low, high in tile_spans)
                if keys:
                    masks = _causal_masks(first, last, tile_spans, xp, dtype) if causal else []
                    yield (slice(key_first, key_first + keys), slice(local + first - start, local + last - start),
                           masks)
            local += stop - start


def _causal_masks(first, stop, k_spans, xp, dtype):
    """``(column slice, bias)`` pairs hiding keys after the query in a tile of queries ``[first, stop)``:
    ``bias`` is -inf on the hidden (query, key) pairs and 0 elsewhere, added to the scores."""
    masks, offset = [], 0
    for ks, ke in k_spans:
        low, high = max(ks, first + 1), min(ke, stop)
        if low < high:
            shift = low - first - 1
            hidden = xp.arange(high - low)[None, :] + shift >= xp.arange(stop - first)[:, None]
            masks.append((slice(offset + low - ks, offset + high - ks), _mask_bias(xp, hidden, dtype)))
        offset += ke - ks
    return masks


def _scores(xp, scratch, q_tile, k_prefix, masks):
    """Scores of a query tile (already scaled) against a key prefix, in ``scratch``, masked."""
    scores = scratch[:q_tile.shape[0] * k_prefix.shape[0]].reshape(q_tile.shape[0], k_prefix.shape[0])
    xp.matmul(q_tile, k_prefix.T, out=scores)
    for columns, bias in masks:
        scores[:, columns] += bias
    return scores


def _merge(xp, out, lse, partial, row_max, total):
    """Merge an unnormalised block result ``partial = sum_j exp(S_ij - m_i) v_j`` into (out, lse)."""
    with np.errstate(divide="ignore"):
        block_lse = _finite_or(xp, row_max, 0.0) + xp.log(total)
    merged = xp.logaddexp(lse, block_lse)
    reference = _finite_or(xp, merged, 0.0)
    out *= xp.exp(lse - reference)[:, None]
    out += partial * xp.exp(row_max - reference)[:, None]
    lse[...] = merged


def attend_block(q, k, v, out, lse, q_spans, k_spans, causal=False, stats=None, tiles=TILES):
    """Merge the attention of local queries ``q`` to one key block ``(k, v)`` into ``(out, lse)``.

    ``out`` (like ``q``) and ``lse`` (heads, nq) hold the running result: start
    from zeros and -inf. ``q_spans`` / ``k_spans`` are the global ranges of the
    rows of ``q`` and of ``k, v``; ``tiles`` = (query rows, keys) per score tile.
    Cost: ``4 nq nk dim`` flops per head (less under a causal mask); scratch one tile.
    """
    started = time.perf_counter()
    heads, _, dim = q.shape
    scale = 1.0 / math.sqrt(dim)
    xp = array_module(q)
    scratch = xp.empty(min(tiles[0], q.shape[1]) * min(tiles[1], k.shape[1]), dtype=q.dtype)
    for columns, rows, masks in _work(q_spans, k_spans, causal, tiles, xp, q.dtype):
        for head in range(heads):
            scores = _scores(xp, scratch, q[head, rows] * scale, k[head, columns], masks)
            row_max = scores.max(axis=1)
            scores -= _finite_or(xp, row_max, 0.0)[:, None]
            xp.exp(scores, out=scores)
            _merge(xp, out[head, rows], lse[head, rows], scores @ v[head, columns], row_max, scores.sum(axis=1))
    if stats is not None:
        stats.compute_s += time.perf_counter() - started


def attend_block_backward(q, k, v, lse, dout, delta, q_spans, k_spans, grads, causal=False, stats=None,
                          tiles=TILES):
    """Add the gradient terms of local queries ``q`` against one key block into ``grads = (dq, dk, dv)``.

    ``lse`` is the final log-sum-exp of the queries, ``delta = rowsum(dO * O)``;
    ``dq`` is shaped like ``q``, ``dk, dv`` like ``k`` (views are fine). Cost:
    ``8 nq nk dim`` flops per head (less under a causal mask); scratch two tiles.
    """
    started = time.perf_counter()
    dq, dk, dv = grads
    heads, _, dim = q.shape
    scale = 1.0 / math.sqrt(dim)
    xp = array_module(q)
    scratch = xp.empty((2, min(tiles[0], q.shape[1]) * min(tiles[1], k.shape[1])), dtype=q.dtype)
    shift = _finite_or(xp, lse, np.inf)
    for columns, rows, masks in _work(q_spans, k_spans, causal, tiles, xp, q.dtype):
        for head in range(heads):
            q_tile, do_tile = q[head, rows] * scale, dout[head, rows]
            weights = _scores(xp, scratch[0], q_tile, k[head, columns], masks)
            weights -= shift[head, rows, None]
            xp.exp(weights, out=weights)
            dv[head, columns] += weights.T @ do_tile
            dscores = _scores(xp, scratch[1], do_tile, v[head, columns], [])
            dscores -= delta[head, rows, None]
            dscores *= weights
            dq[head, rows] += (dscores @ k[head, columns]) * scale
            dk[head, columns] += dscores.T @ q_tile
    if stats is not None:
        stats.compute_s += time.perf_counter() - started


def blockwise_attention_forward(q, k, v, causal=False, stats=None, tiles=TILES):
    """Serial attention in score tiles (one tile of scratch beyond the arrays): ``(O, lse)``."""
    check_qkv(q, k, v)
    xp = array_module(q)
    out, lse = xp.zeros_like(q), xp.full(q.shape[:2], -np.inf, dtype=q.dtype)
    attend_block(q, k, v, out, lse, [(0, q.shape[1])], [(0, k.shape[1])], causal, stats, tiles)
    return out, lse


def blockwise_attention_backward(q, k, v, lse, dout, delta, causal=False, stats=None, tiles=TILES):
    """Serial backward in score tiles: ``(dQ, dK, dV)`` given ``dO``, ``lse`` and ``delta = output_delta(O, dO)``."""
    check_qkv(q, k, v)
    xp = array_module(q)
    grads = xp.zeros_like(q), xp.zeros_like(k), xp.zeros_like(v)
    attend_block_backward(q, k, v, lse, dout, delta, [(0, q.shape[1])], [(0, k.shape[1])], grads, causal, stats,
                          tiles)
    return grads
