"""Ring attention: the sequence split over ranks, key / value blocks passed around a ring.

Every rank keeps its queries and sees every key / value block once: in step
``t = 0 .. p-1`` rank ``r`` holds the block of rank ``(r - t) mod p`` and merges its
attention into the running ``(O, lse)`` by log-sum-exp (`parallel.nn.attention.attend_block`),
while the next block is already in flight (``Isend`` to ``r + 1``, ``Irecv`` from
``r - 1`` into a second buffer). The block of the last step is not passed on, so
it travels in pieces of ``tiles[1]`` tokens instead, each received while the one
before is computed: at ``p = 2`` a rank never holds its peer's whole block.
Arrays are (heads, seq, dim) as in `parallel.nn.attention`; results match the
serial reference to rounding.

Layouts of the ``n`` tokens over ``p`` ranks (`sequence_spans`):

- plain: rank ``r`` holds the contiguous `block_range` ``r`` of ``n`` (any ``n``:
  blocks differ by at most one token). Under a causal mask rank ``r`` has work
  in ``r + 1`` steps only (blocks of later ranks are skipped, the own block is
  half masked), so rank ``p - 1`` does ``(2p - 1) / p`` times the mean work.
- zig-zag: the tokens are cut into ``2p`` chunks (`block_range` over ``2p``, any
  ``n``) and rank ``r`` holds chunks ``r`` and ``2p - 1 - r``, stored in that
  order. Under a causal mask every rank computes two chunk pairs in every step
  (one diagonal pair and one full pair in step 0): balanced to a chunk's rounding.

Local shapes: ``q, k, v, O, dO, dQ, dK, dV`` are (heads, n_r, dim) and ``lse``
(heads, n_r) with ``n_r`` the rank's token count (``n / p`` up to one or two
tokens). Memory per rank beyond those arrays, all ``O(n / p)``: receive buffers
for one key / value block when ``p = 3``, two when ``p > 3``, two pieces, one score
tile (two in the backward pass), and two travelling dK / dV blocks in the
backward pass. Costs per rank with ``b = 8 heads n_r dim`` bytes (float64) per
array and ``c`` pieces per block: forward ``2(p - 2) + 2c`` messages (``p > 1``),
``2(p - 1) b`` bytes, ``(2(p - 2) + 2c) alpha + 2(p - 1) b beta``, each transfer overlapping a
compute; backward the same for K / V plus ``p`` accumulator
messages of ``2 b`` bytes (dK and dV of the block at hand, received before its
step's compute and sent on after it, so they arrive home after ``p`` steps).

Devices: with device arrays and ``comm`` from `kernels.backend.Backend.comm`, the
buffers are allocated on the device and every transfer is synchronised (and
staged) by the `kernels.comm.device.DeviceComm`; requests complete through
`kernels.comm.device.wait_all`, which also copies staged receives to the device.
"""
from mpi4py import MPI
from mpi4py.util import dtlib
import numpy as np

from kernels.backend import array_module
from kernels.comm.device import wait_all
from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.nn.attention import (TILES, attend_block, attend_block_backward, check_qkv, output_delta, span_length,
                                split_spans)

KV_TAG, GRAD_TAG = 0x5241, 0x5242


def sequence_spans(seq_len, ranks, rank, zigzag=False):
    """Global token ranges ``[(start, stop), ...]`` of ``rank``'s shard, in local storage order."""
    if seq_len < 0:
        raise InputError(f"ring attention: sequence length must be >= 0, got {seq_len}")
    if not zigzag:
        return [block_range(seq_len, ranks, rank)]
    return [block_range(seq_len, 2 * ranks, rank), block_range(seq_len, 2 * ranks, 2 * ranks - 1 - rank)]


def sequence_positions(seq_len, ranks, rank, zigzag=False):
    """Global positions of ``rank``'s tokens, in local storage order (1-D int array)."""
    return np.concatenate([np.arange(*span) for span in sequence_spans(seq_len, ranks, rank, zigzag)])


def _layout(comm, q, k, v, seq_len, zigzag):
    """Spans of every rank and contiguous ``k, v``; `InputError` unless the arrays fit this rank's shard."""
    check_qkv(q, k, v)
    spans = [sequence_spans(seq_len, comm.size, rank, zigzag) for rank in range(comm.size)]
    local = span_length(spans[comm.rank])
    if q.shape[1] != local or k.shape[1] != local:
        raise InputError(f"ring attention: rank {comm.rank} holds {local} of {seq_len} tokens, "
                         f"got q {q.shape} and k {k.shape}")
    xp = array_module(q)
    return spans, xp.ascontiguousarray(k), xp.ascontiguousarray(v)


def _pair_buffer(like, tokens):
    """An empty flat buffer for two (heads, tokens, dim) arrays shaped like ``like`` otherwise."""
    return array_module(like).empty(2 * like.shape[0] * tokens * like.shape[2], dtype=like.dtype)


def _views(buffer, tokens, shape):
    """The first two (heads, tokens, dim) arrays packed at the start of the flat ``buffer``."""
    heads, _, dim = shape
    size = heads * tokens * dim
    return tuple(buffer[index * size:(index + 1) * size].reshape(heads, tokens, dim) for index in range(2))


def _send_piece(comm, array, first, last, dest, kept):
    """``Isend`` tokens ``[first, last)`` of a contiguous (heads, tokens, dim) array.

    Host arrays are sent in place (vector datatype). A device array sends a
    contiguous copy of the piece, appended to ``kept`` until the send completes:
    staging then copies the piece alone, not the array's tail for every piece.
    """
    xp = array_module(array)
    if xp is not np:
        kept.append(xp.ascontiguousarray(array[:, first:last]))
        return comm.Isend(kept[-1], dest, KV_TAG)
    heads, tokens, dim = array.shape
    piece = dtlib.from_numpy_dtype(array.dtype).Create_vector(heads, (last - first) * dim, tokens * dim).Commit()
    request = comm.Isend([array.reshape(-1)[first * dim:], 1, piece], dest, KV_TAG)
    piece.Free()
    return request


def _receive_piece(comm, buffer, piece, shape):
    """Post the ``Irecv`` of K and V of one piece ``(first, last, spans)`` from the left neighbour."""
    first, last, _ = piece
    return [comm.Irecv(array, (comm.rank - 1) % comm.size, KV_TAG) for array in _views(buffer, last - first, shape)]


def _receive_pieces(comm, pieces, k, posted, buffers):
    """Yield the parts of the last block as its pieces arrive; the next one is in flight meanwhile."""
    for index, (first, last, piece_spans) in enumerate(pieces):
        wait_all(posted)
        k_piece, v_piece = _views(buffers[index % 2], last - first, k.shape)
        if index + 1 < len(pieces):
            posted = _receive_piece(comm, buffers[(index + 1) % 2], pieces[index + 1], k.shape)
        yield first, last, piece_spans, k_piece, v_piece


def _circulate(comm, k, v, spans, stats, piece):
    """Yield ``(owner, parts)`` for the ``p`` steps of the ring; ``parts`` yields
    ``(first, last, part_spans, k_part, v_part)``: tokens ``[first, last)`` of the owner's block.

    Blocks that must be passed on arrive whole during the previous step (two
    alternating buffers); the last block, which is not passed on, comes in
    pieces of ``piece`` tokens, each in flight while the one before is computed.
    Own ``k, v`` and forwarded blocks are sent in place (the pieces of device arrays as copies).
    """
    size, rank = comm.size, comm.rank
    left, right = (rank - 1) % size, (rank + 1) % size
    buffers = [_pair_buffer(k, max(map(span_length, spans))) for _ in range(min(size - 2, 2))]
    last_pieces = split_spans(spans[right], piece) if size > 1 else []
    piece_buffers = [_pair_buffer(k, piece) for _ in range(min(len(last_pieces), 2))]
    block, sent, posted, kept = (k, v), [], [], []
    for step in range(size - 1):
        owner, requests = (rank - step) % size, []
        if step < size - 2:
            incoming = _views(buffers[step % 2], span_length(spans[(owner - 1) % size]), k.shape)
            requests = [comm.Irecv(array, left, KV_TAG) for array in incoming]
            requests += [comm.Isend(array, right, KV_TAG) for array in block]
        else:
            sent = [_send_piece(comm, array, first, last, right, kept)
                    for first, last, _ in split_spans(spans[owner], piece) for array in block]
            if last_pieces:
                posted = _receive_piece(comm, piece_buffers[0], last_pieces[0], k.shape)
        if stats is not None:
            stats.messages += 2 if step < size - 2 else len(sent)
            stats.bytes_sent += block[0].nbytes + block[1].nbytes
        yield owner, [(0, block[0].shape[1], spans[owner], block[0], block[1])]
        wait_all(requests)
        if requests:
            block = incoming
    if size == 1:
        yield rank, [(0, k.shape[1], spans[rank], k, v)]
    else:
        yield right, _receive_pieces(comm, last_pieces, k, posted, piece_buffers)
    wait_all(sent)


def ring_attention_forward(comm, q, k, v, seq_len, causal=False, zigzag=False, stats=None, tiles=TILES):
    """Attention of this rank's queries to the whole sequence: ``(O, lse)`` of the local tokens.

    Parameters
    ----------
    comm : MPI.Comm
        The ranks sharing the sequence; all call this together.
    q, k, v : ndarray
        This rank's shard, (heads, n_r, dim), tokens as `sequence_spans` lays them out
        (NumPy, or device arrays with ``comm`` from `kernels.backend.Backend.comm`).
    seq_len : int
        Global sequence length ``n``.
    causal : bool
        Hide keys after the query (tiles no local query sees are not computed).
    zigzag : bool
        Zig-zag layout (balanced under a causal mask) instead of contiguous blocks.
    stats : AttentionStats, optional
        Accumulates compute seconds, messages and bytes sent.
    tiles : (int, int)
        Query rows and keys per score tile; the keys are also the piece size of the last block.
    """
    spans, k, v = _layout(comm, q, k, v, seq_len, zigzag)
    xp = array_module(q)
    out, lse = xp.zeros_like(q), xp.full(q.shape[:2], -np.inf, dtype=q.dtype)
    for _, parts in _circulate(comm, k, v, spans, stats, tiles[1]):
        for _, _, part_spans, k_part, v_part in parts:
            attend_block(q, k_part, v_part, out, lse, spans[comm.rank], part_spans, causal, stats, tiles)
    return out, lse


def ring_attention_backward(comm, q, k, v, out, lse, dout, seq_len, causal=False, zigzag=False, stats=None,
                            tiles=TILES):
    """Gradients ``(dQ, dK, dV)`` of this rank's shard given ``dO``; ``out, lse`` from the forward pass.

    K / V travel as in `ring_attention_forward`; the dK / dV accumulators of the
    block at hand travel with it (one packed message per step, received before
    the step's compute) and come home after ``p`` steps. Parameters as in
    `ring_attention_forward`.
    """
    spans, k, v = _layout(comm, q, k, v, seq_len, zigzag)
    size, rank = comm.size, comm.rank
    delta, dq = output_delta(out, dout), array_module(q).zeros_like(q)
    accumulators = [_pair_buffer(k, max(map(span_length, spans))) for _ in range(min(size, 2))]
    sends = [MPI.REQUEST_NULL, MPI.REQUEST_NULL]
    for step, (owner, parts) in enumerate(_circulate(comm, k, v, spans, stats, tiles[1])):
        accumulator = accumulators[step % 2][:2 * k.shape[0] * span_length(spans[owner]) * k.shape[2]]
        sends[step % 2].Wait()
        if step == 0:
            accumulator.fill(0)
        else:
            comm.Recv(accumulator, (rank - 1) % size, GRAD_TAG)
        dk_block, dv_block = _views(accumulator, span_length(spans[owner]), k.shape)
        for first, last, part_spans, k_part, v_part in parts:
            grads = dq, dk_block[:, first:last], dv_block[:, first:last]
            attend_block_backward(q, k_part, v_part, lse, dout, delta, spans[rank], part_spans, grads, causal,
                                  stats, tiles)
        if size > 1:
            sends[step % 2] = comm.Isend(accumulator, (rank + 1) % size, GRAD_TAG)
            if stats is not None:
                stats.messages += 1
                stats.bytes_sent += accumulator.nbytes
    if size > 1:
        sends[size % 2].Wait()
        accumulator = accumulators[size % 2][:2 * k.size]
        comm.Recv(accumulator, (rank - 1) % size, GRAD_TAG)
        sends[(size - 1) % 2].Wait()
    return (dq,) + _views(accumulator, k.shape[1], k.shape)
