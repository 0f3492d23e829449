"""Suite ``attention``: long-sequence multi-head attention, serial and sequence-parallel.

Size is the sequence length ``n`` in tokens (weak scaling: per rank). One run is
one forward pass (plus the backward pass when asked) of attention over ``n``
tokens, arrays (heads, seq, dim) as in `parallel.nn.attention`. Variants:

- ``full``: `parallel.nn.attention.blockwise_attention_forward` / ``_backward`` on one
  process, the reference. It runs at any rank count so that it fits every sweep:
  rank 0 holds all tokens and computes, the other ranks hold none and wait in a
  sleeping barrier (no core stolen), so a ``full`` row at ``p`` ranks measures one
  process (params ``computing_ranks = 1``).
- ``ring``: `parallel.sequence.ring_attention` with contiguous blocks (any ``n``).
- ``ring_zigzag``: the same with the zig-zag layout (2p chunks, any ``n``).
- ``ulysses``: `parallel.sequence.ulysses` (any ``n``; heads must divide by the rank count,
  else the point is skipped in a sweep, or an `InputError` when the variant is named).

Settings (`bench.models.attention.SETTINGS`, all recorded in params): heads, head dim, causal mask,
backward pass, and the query rows and keys per score tile (default
`parallel.nn.attention.TILES`); the ring variants also stream their last key / value
block in pieces of ``ATTN_KEY_TILE`` tokens.

Inputs: Q, K, V, dO standard normal, drawn per 512-token block from a seed, so
every rank draws only its own tokens. Check (each rank, on up to 32 sampled local
query rows, all rows of small shards): O, lse and dQ against the dense serial
reference computed for those rows against all keys (float64), and dK, dV of up to
32 sampled local key rows against all queries, using O and lse of all queries
gathered from the run (themselves checked on the sampled rows). Tolerance
``rtol`` with ``atol = rtol * max |reference|``: 1e-9 in float64, 2e-3 in float32.

Metrics: items_per_s = tokens/s; gflops counts ``4 n^2 heads dim`` flops per
forward and ``10 n^2 heads dim`` per backward (scores recomputed), halved under a
causal mask, over every rank; ``gflops_per_rank`` in params: gflops over the ranks holding tokens
(``computing_ranks``: 1 for ``full``). Metric ``imbalance`` (causal: max / mean over ranks holding tokens of
the per-rank compute seconds per run) or ``peak_mem_mb`` (otherwise: the largest
rank's peak). Params: settings, compute seconds, bytes and messages sent per
rank and run, and peak memory per rank in MB (1e6 bytes) = the rank's input
arrays plus the ``tracemalloc`` peak (NumPy reports its buffers to it) of the
point's first run, which the harness never times (warm-up or its probe run);
MPI's own buffers are not included.

Backends: on a device the tokens are drawn on the host and moved once, the
parallel variants run on ``backend.comm(comm)``, and the results come to the host
only in the check. ``tracemalloc`` sees host allocations only, so there the peak
memory is the inputs plus the host side of the run (params ``memory`` says so).
"""
import math
import tracemalloc
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from bench.case import Case, Metrics
from bench.models import flops as counts
from bench.faults import sleeping_barrier
from bench.models.attention import AttentionModel
from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.nn.attention import (AttentionStats, attention_backward, attention_forward,
                                blockwise_attention_backward, blockwise_attention_forward, output_delta)
from parallel.sequence.ring_attention import ring_attention_backward, ring_attention_forward, sequence_spans
from parallel.sequence.ulysses import ulysses_attention_backward, ulysses_attention_forward

SEED = 2024
TOKEN_BLOCK = 512
CHECK_ROWS = 32
TOLERANCES = {"float64": 1e-9, "float32": 2e-3}


def draw_tokens(spans, heads, dim, dtype):
    """Q, K, V, dO of the tokens in ``spans``: an array (4, heads, tokens, dim), the same on every rank."""
    tokens = np.empty((4, heads, sum(stop - start for start, stop in spans), dim), dtype=dtype)
    offset = 0
    for start, stop in spans:
        for block in range(start // TOKEN_BLOCK, -(-stop // TOKEN_BLOCK)):
            first, last = max(start, block * TOKEN_BLOCK), min(stop, (block + 1) * TOKEN_BLOCK)
            values = np.random.default_rng([SEED, heads, dim, block]).standard_normal((4, heads, TOKEN_BLOCK, dim))
            rows = slice(first - block * TOKEN_BLOCK, last - block * TOKEN_BLOCK)
            tokens[:, :, offset + first - start:offset + last - start] = values[:, :, rows]
        offset += stop - start
    return tokens


def layout(variant, seq_len, ranks, rank):
    """Global token spans of ``rank`` in ``variant``."""
    if variant == "full":
        return [(0, seq_len)] if rank == 0 else []
    if variant == "ulysses":
        return [block_range(seq_len, ranks, rank)]
    return sequence_spans(seq_len, ranks, rank, zigzag=variant == "ring_zigzag")


@dataclass
class _State:
    comm: object
    backend: object
    variant: str
    dtype: str
    size: int
    settings: dict
    spans: list
    tokens: np.ndarray
    stats: AttentionStats = field(default_factory=AttentionStats)
    runs: int = 0
    peak_bytes: Optional[int] = None
    result: tuple = ()
    summary: dict = field(default_factory=dict)


def _forward(state, q, k, v):
    comm, n, stats = state.comm, state.size, state.stats
    causal, tiles = state.settings["causal"], state.settings["tiles"]
    if state.variant == "full":
        return blockwise_attention_forward(q, k, v, causal, stats, tiles)
    if state.variant == "ulysses":
        return ulysses_attention_forward(comm, q, k, v, n, causal, stats, tiles)
    return ring_attention_forward(comm, q, k, v, n, causal, state.variant == "ring_zigzag", stats, tiles)


def _backward(state, q, k, v, out, lse, dout):
    comm, n, stats = state.comm, state.size, state.stats
    causal, tiles = state.settings["causal"], state.settings["tiles"]
    if state.variant == "full":
        return blockwise_attention_backward(q, k, v, lse, dout, output_delta(out, dout), causal, stats, tiles)
    if state.variant == "ulysses":
        return ulysses_attention_backward(comm, q, k, v, out, lse, dout, n, causal, stats, tiles)
    zigzag = state.variant == "ring_zigzag"
    return ring_attention_backward(comm, q, k, v, out, lse, dout, n, causal, zigzag, stats, tiles)


class Attention(Case):
    model_class = AttentionModel
    benchmark = "attention"
    size_help = "sequence length in tokens (weak: per rank); one run = attention forward (+ backward) over it"
    default_sizes = "1K:8K"
    metrics_help = ("items_per_s = tokens/s; metric imbalance (causal: max/mean per-rank compute time) or "
                    "peak_mem_mb (largest rank); params: compute s, bytes sent and peak MB per rank")

    description = ("Multi-head attention over a long sequence: full blockwise attention on one process against "
                   "ring attention (contiguous or zig-zag blocks, key / value blocks passed round the ring with an "
                   "online softmax) and Ulysses (all-to-all from sequence to head shards). Forward, optionally "
                   "backward, optionally causal; the check compares sampled rows with a dense float64 reference.")

    def __init__(self, settings=None):
        super().__init__(settings)
        self.config = self.model.config

    def iterations(self, size):
        return (10, 2) if size <= 2048 else (5, 1) if size <= 8192 else (3, 1)

    def setup(self, comm, size, variant, backend, dtype):
        if size < 1:
            raise InputError(f"attention: the sequence needs at least one token, got {size}")
        self.check_ranks(comm.size, variant)
        spans = layout(variant, size, comm.size, comm.rank)
        tokens = backend.from_host(draw_tokens(spans, self.config["heads"], self.config["dim"], dtype))
        return _State(backend.comm(comm), backend, variant, dtype, size, dict(self.config), spans, tokens)

    def run(self, state):
        """One pass; the first one (never timed by the harness) measures peak memory, then counters restart."""
        if state.peak_bytes is None:
            tracemalloc.start()
            self._pass(state)
            inputs = state.tokens[:4 if state.settings["backward"] else 3].nbytes
            state.peak_bytes = inputs + tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            state.stats, state.runs = AttentionStats(), 0
            return
        self._pass(state)
        state.runs += 1

    def _pass(self, state):
        q, k, v, dout = state.tokens
        out, lse = _forward(state, q, k, v)
        grads = _backward(state, q, k, v, out, lse, dout) if state.settings["backward"] else ()
        if state.variant == "full" and state.comm.size > 1:
            sleeping_barrier(state.comm)
        state.result = (out, lse) + tuple(grads)

    def check(self, state):
        """Wrong elements on this rank's sampled rows (collective when the backward pass is on)."""
        positions = np.concatenate([np.arange(*span) for span in state.spans] + [np.arange(0)])
        rows = _sample(len(positions))
        result = [state.backend.to_host(array) for array in state.result]
        gathered = [_gather_tokens(state, array) for array in result[:2]] if state.settings["backward"] else []
        pairs = _reference_pairs(state, result, rows, positions[rows], gathered) if len(rows) else []
        return sum(_count_wrong(actual, expected, TOLERANCES[state.dtype]) for actual, expected in pairs)

    def metrics(self, state, seconds):
        """Rates of the point; collective (allgathers of a few numbers), as the harness calls it on every rank."""
        comm, settings, n, stats = state.comm, state.settings, state.size, state.stats
        runs = max(state.runs, 1)
        mine = (round(stats.compute_s / runs, 6), stats.bytes_sent // runs, stats.messages // runs,
                round(state.peak_bytes / 1e6, 3), state.tokens.shape[2])
        compute, sent, messages, peak_mb, tokens = (list(column) for column in zip(*comm.allgather(mine)))
        busy = [seconds_ for seconds_, count in zip(compute, tokens) if count]
        imbalance = max(busy) / (sum(busy) / len(busy)) if sum(busy) > 0 else math.nan
        state.summary = dict(compute_s_per_rank=compute, bytes_sent_per_rank=sent, messages_per_rank=messages,
                             peak_mem_mb_per_rank=peak_mb, computing_ranks=len(busy), imbalance=round(imbalance, 4))
        flops = (4 + (10 if settings["backward"] else 0)) * n * n * settings["heads"] * settings["dim"]
        flops *= 0.5 if settings["causal"] else 1.0
        metric, value = ("imbalance", imbalance) if settings["causal"] else ("peak_mem_mb", max(peak_mb))
        gflops, state.summary["gflops_per_rank"] = counts.per_rank(flops, seconds, len(busy))
        return Metrics(gflops=gflops, items_per_s=n / seconds if seconds > 0 else math.nan, metric=metric,
                       metric_value=value)

    def params(self, state):
        host_only = " (host allocations only)" if state.backend.name != "numpy" else ""
        return dict(state.settings, memory="inputs + tracemalloc peak of the first run" + host_only,
                    **state.summary)

def _reference_pairs(state, result, rows, positions, gathered):
    """``(result, reference)`` pairs of the local ``rows`` at global ``positions`` (``result``: the run's, on the host).

    O, lse and dQ of the rows come from the dense reference of those query rows
    against all keys; dK and dV of the rows (as keys) from all queries, with
    ``gathered`` = O and lse of all queries from the run.
    """
    settings = state.settings
    causal = settings["causal"]
    q_all, k_all, v_all, dout_all = draw_tokens([(0, state.size)], settings["heads"], settings["dim"],
                                                state.dtype).astype(np.float64)
    q_rows, dout_rows = (array[:, positions] for array in (q_all, dout_all))
    out, lse = attention_forward(q_rows, k_all, v_all, causal, q_positions=positions)
    pairs = [(result[0][:, rows], out), (result[1][:, rows], lse)]
    if settings["backward"]:
        dq = attention_backward(q_rows, k_all, v_all, out, lse, dout_rows, causal, q_positions=positions)[0]
        _, dk, dv = attention_backward(q_all, k_all[:, positions], v_all[:, positions], *gathered, dout_all, causal,
                                       k_positions=positions)
        pairs += [(result[2][:, rows], dq), (result[3][:, rows], dk), (result[4][:, rows], dv)]
    return pairs


def _sample(count):
    """Sorted local rows to check: all of them up to `CHECK_ROWS`, else the ends and a seeded sample."""
    if count <= CHECK_ROWS:
        return np.arange(count)
    drawn = np.random.default_rng(SEED).choice(np.arange(1, count - 1), CHECK_ROWS - 2, replace=False)
    return np.sort(np.concatenate([[0, count - 1], drawn]))


def _count_wrong(actual, expected, rtol):
    atol = rtol * float(np.max(np.abs(expected), initial=0.0))
    return int(np.count_nonzero(~np.isclose(actual, expected, rtol=rtol, atol=atol)))


def _gather_tokens(state, local):
    """All ``n`` tokens of a host (heads, tokens[, dim]) array spread as the variant lays them out (float64)."""
    comm = state.comm
    moved = np.ascontiguousarray(np.moveaxis(local, 1, 0), dtype=np.float64)
    spans = [layout(state.variant, state.size, comm.size, rank) for rank in range(comm.size)]
    positions = np.concatenate([np.arange(*span) for rank_spans in spans for span in rank_spans])
    width = int(np.prod(local.shape[:1] + local.shape[2:]))
    everyone = np.empty((state.size,) + moved.shape[1:], dtype=np.float64)
    counts = [sum(stop - start for start, stop in rank_spans) * width for rank_spans in spans]
    comm.Allgatherv(moved, [everyone, counts])
    ordered = np.empty_like(everyone)
    ordered[positions] = everyone
    return np.moveaxis(ordered, 0, 1)
