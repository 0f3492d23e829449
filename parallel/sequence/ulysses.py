"""Ulysses sequence parallelism: all-to-all from sequence shards to head shards and back.

Each rank holds all heads of its contiguous `block_range` of the ``n`` tokens
(any ``n``: blocks differ by at most one token). One ``Alltoallv`` per array
trades that for all ``n`` tokens of a group of ``heads / p`` heads (rank ``r`` gets
heads ``r h/p .. (r+1) h/p - 1``); each rank runs the serial blockwise attention
(`parallel.nn.attention`) on its heads, and one ``Alltoallv`` per result brings the
tokens home. The head count must be divisible by ``p`` (`InputError` otherwise).

No copies around the exchanges: MPI derived datatypes (one token of a head
group: ``heads / p`` rows of ``width`` numbers, ``seq`` rows apart) read the
(heads, n_r, dim) shard and write the (heads / p, n, dim) group in place.

Local shapes: ``q, k, v, O, dO, dQ, dK, dV`` are (heads, n_r, dim), ``lse``
(heads, n_r). Memory per rank: those plus the head-group copies (heads / p, n,
dim) of the exchanged arrays (as much as the shards: ``O(n / p)``) and one or
two score tiles of `parallel.nn.attention`. Device arrays work with ``comm`` from
`kernels.backend.Backend.comm` (head groups allocated on the device; each exchange
synchronised, and staged when MPI is not CUDA-aware).
Costs per rank with ``b = 8 heads n_r dim`` bytes (float64) per array, each
``Alltoallv`` sending ``(p - 1) / p`` of it in ``p - 1`` messages: forward 3 arrays
in and ``O`` plus ``lse`` out, ``4 (p - 1) b / p`` bytes; backward ``q, k, v, dO`` and
``lse, D`` in, ``dQ, dK, dV`` out, ``7 (p - 1) b / p`` bytes; ``alpha`` terms
``(p - 1)`` per exchange (5 forward, 9 backward).
"""
import math

from mpi4py.util import dtlib

from kernels.backend import array_module
from kernels.distribution import block_counts, block_offsets
from kernels.errors import InputError
from parallel.nn.attention import (TILES, blockwise_attention_backward, blockwise_attention_forward, check_qkv,
                                output_delta)


class _HeadExchange:
    """The ``Alltoallv`` between sequence shards (heads, n_r, w) and head groups (heads / p, n, w)."""

    def __init__(self, comm, heads, seq_len, dtype, stats):
        size, rank = comm.size, comm.rank
        if heads % size:
            raise InputError(f"ulysses: {heads} heads cannot be split evenly over {size} ranks")
        self.comm, self.stats, self.group = comm, stats, heads // size
        self.counts, self.offsets = block_counts(seq_len, size), block_offsets(seq_len, size)
        self.local, self.seq_len, self.base = self.counts[rank], seq_len, dtlib.from_numpy_dtype(dtype)

    def _token_type(self, tokens, width):
        """One token of a head group in an array of ``tokens`` tokens: ``group`` rows of ``width``."""
        vector = self.base.Create_vector(self.group, width, max(tokens, 1) * width)
        token = vector.Create_resized(0, width * self.base.extent).Commit()
        vector.Free()
        return token

    def _exchange(self, send, recv, to_heads):
        size, width = self.comm.size, math.prod(send.shape[2:])
        shard = ([self.local] * size, [peer * self.group * self.local for peer in range(size)])
        group = (self.counts, self.offsets)
        shard_type, group_type = self._token_type(self.local, width), self._token_type(self.seq_len, width)
        if to_heads:
            self.comm.Alltoallv([send, shard, shard_type], [recv, group, group_type])
        else:
            self.comm.Alltoallv([send, group, group_type], [recv, shard, shard_type])
        shard_type.Free()
        group_type.Free()
        if self.stats is not None:
            rank = self.comm.rank
            sent = [count for peer, count in enumerate(shard[0] if to_heads else group[0]) if peer != rank]
            self.stats.messages += sum(1 for count in sent if count)
            self.stats.bytes_sent += sum(sent) * self.group * width * send.itemsize

    def to_heads(self, shard):
        """(heads, n_r[, w]) sequence shard -> (heads / p, n[, w]) head group of this rank."""
        xp = array_module(shard)
        group = xp.empty((self.group, self.seq_len) + shard.shape[2:], dtype=shard.dtype)
        self._exchange(xp.ascontiguousarray(shard), group, True)
        return group

    def to_sequence(self, group):
        """(heads / p, n[, w]) head group -> (heads, n_r[, w]) sequence shard of this rank."""
        shard = array_module(group).empty((self.group * self.comm.size, self.local) + group.shape[2:],
                                          dtype=group.dtype)
        self._exchange(group, shard, False)
        return shard


def _exchange_for(comm, q, k, v, seq_len, stats):
    """Validate this rank's shard and return the exchange of its (heads, seq_len) layout."""
    check_qkv(q, k, v)
    exchange = _HeadExchange(comm, q.shape[0], seq_len, q.dtype, stats)
    if q.shape[1] != exchange.local or k.shape[1] != exchange.local:
        raise InputError(f"ulysses: rank {comm.rank} holds {exchange.local} of {seq_len} tokens, "
                         f"got q {q.shape} and k {k.shape}")
    return exchange


def ulysses_attention_forward(comm, q, k, v, seq_len, causal=False, stats=None, tiles=TILES):
    """Attention of this rank's tokens over the whole sequence: ``(O, lse)`` of the local tokens.

    Parameters
    ----------
    comm : MPI.Comm
        The ranks sharing the sequence; all call this together.
    q, k, v : ndarray
        This rank's shard (heads, n_r, dim): tokens ``block_range(seq_len, p, rank)``
        (NumPy, or device arrays with ``comm`` from `kernels.backend.Backend.comm`).
    seq_len : int
        Global sequence length ``n``.
    causal : bool
        Hide keys after the query.
    stats : AttentionStats, optional
        Accumulates compute seconds, messages and bytes sent.
    tiles : (int, int)
        Query rows and keys per score tile.
    """
    exchange = _exchange_for(comm, q, k, v, seq_len, stats)
    out, lse = blockwise_attention_forward(*(exchange.to_heads(x) for x in (q, k, v)), causal, stats, tiles)
    return exchange.to_sequence(out), exchange.to_sequence(lse)


def ulysses_attention_backward(comm, q, k, v, out, lse, dout, seq_len, causal=False, stats=None,
                               tiles=TILES):
    """Gradients ``(dQ, dK, dV)`` of this rank's shard given ``dO``; ``out, lse`` from the forward pass.

    ``D = rowsum(dO * O)`` is formed on the shard, so ``O`` itself is not exchanged.
    Parameters as in `ulysses_attention_forward`.
    """
    exchange = _exchange_for(comm, q, k, v, seq_len, stats)
    q_h, k_h, v_h, dout_h = (exchange.to_heads(x) for x in (q, k, v, dout))
    lse_h, delta_h = exchange.to_heads(lse), exchange.to_heads(output_delta(out, dout))
    grads = blockwise_attention_backward(q_h, k_h, v_h, lse_h, dout_h, delta_h, causal, stats, tiles)
    return tuple(exchange.to_sequence(grad) for grad in grads)
