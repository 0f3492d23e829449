"""Serial attention: dense reference against the textbook formula and finite differences, blockwise kernels."""
import itertools

import numpy as np
import pytest

from kernels.errors import InputError
from parallel.nn.attention import (AttentionStats, attend_block, attend_block_backward, attention_backward,
                                attention_forward, blockwise_attention_backward, blockwise_attention_forward,
                                output_delta, split_spans)


def qkv(heads, seq, dim, seed=0, scale=1.0, kv_seq=None):
    rng = np.random.default_rng(seed)
    kv_seq = seq if kv_seq is None else kv_seq
    return (rng.standard_normal((heads, seq, dim)) * scale, rng.standard_normal((heads, kv_seq, dim)) * scale,
            rng.standard_normal((heads, kv_seq, dim)), rng.standard_normal((heads, seq, dim)))


def textbook(q, k, v, causal):
    """softmax(Q K^T / sqrt(d)) V without max subtraction (fine for small scores)."""
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    if causal:
        scores[:, np.triu(np.ones(scores.shape[1:], dtype=bool), 1)] = -np.inf
    weights = np.exp(scores)
    return weights @ v / weights.sum(-1, keepdims=True), np.log(weights.sum(-1))


@pytest.mark.parametrize("causal", [False, True])
def test_dense_forward_is_the_textbook_formula(causal):
    q, k, v, _ = qkv(3, 11, 5)
    out, lse = attention_forward(q, k, v, causal)
    expected_out, expected_lse = textbook(q, k, v, causal)
    np.testing.assert_allclose(out, expected_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-12, atol=1e-12)
    if causal:
        np.testing.assert_allclose(out[:, 0], v[:, 0], rtol=1e-14)


@pytest.mark.parametrize("causal", [False, True])
def test_dense_backward_matches_finite_differences(causal):
    q, k, v, dout = qkv(2, 6, 3, seed=1)
    out, lse = attention_forward(q, k, v, causal)
    grads = attention_backward(q, k, v, out, lse, dout, causal)
    step = 1e-6
    for index, array in enumerate((q, k, v)):
        numeric = np.empty_like(array)
        for position in np.ndindex(array.shape):
            losses = []
            for sign in (1, -1):
                inputs = [q, k, v]
                inputs[index] = array.copy()
                inputs[index][position] += sign * step
                losses.append(np.sum(attention_forward(*inputs, causal)[0] * dout))
            numeric[position] = (losses[0] - losses[1]) / (2 * step)
        np.testing.assert_allclose(grads[index], numeric, rtol=1e-7, atol=1e-8)


def test_large_scores_do_not_overflow():
    q, k, v, dout = qkv(2, 9, 4, seed=2, scale=1e3)
    with np.errstate(over="ignore", invalid="ignore"):
        naive_out, _ = textbook(q, k, v, False)
    assert not np.isfinite(naive_out).all()
    out, lse = attention_forward(q, k, v)
    scores = q @ k.transpose(0, 2, 1) / 2.0
    np.testing.assert_allclose(lse, scores.max(-1), rtol=1e-12)
    winner = np.take_along_axis(v, scores.argmax(-1)[..., None], axis=1)
    np.testing.assert_allclose(out, winner, rtol=1e-9, atol=1e-9)
    grads = attention_backward(q, k, v, out, lse, dout)
    assert all(np.isfinite(grad).all() for grad in grads)


def test_row_subsets_and_fully_masked_rows():
    q, k, v, dout = qkv(2, 10, 3, seed=3)
    out, lse = attention_forward(q, k, v, causal=True)
    rows = np.array([0, 4, 9])
    out_rows, lse_rows = attention_forward(q[:, rows], k, v, causal=True, q_positions=rows)
    np.testing.assert_allclose(out_rows, out[:, rows], rtol=1e-13)
    np.testing.assert_allclose(lse_rows, lse[:, rows], rtol=1e-13)
    dq, dk, dv = attention_backward(q, k, v, out, lse, dout, causal=True)
    _, dk_rows, dv_rows = attention_backward(q, k[:, rows], v[:, rows], out, lse, dout, causal=True,
                                             k_positions=rows)
    np.testing.assert_allclose(dk_rows, dk[:, rows], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dv_rows, dv[:, rows], rtol=1e-12, atol=1e-14)
    with np.errstate(all="raise"):
        hidden_out, hidden_lse = attention_forward(q[:, :2], k[:, 5:], v[:, 5:], True, [0, 1], np.arange(5, 10))
    assert np.all(hidden_out == 0) and np.all(np.isneginf(hidden_lse))


@pytest.mark.parametrize("causal, tiles, seq", [(False, (4, 5), 13), (True, (4, 3), 13), (True, (5, 5), 5),
                                                (True, (3, 8), 13), (False, (256, 1024), 7)])
def test_blockwise_matches_dense(causal, tiles, seq):
    q, k, v, dout = qkv(3, seq, 4, seed=4)
    out, lse = attention_forward(q, k, v, causal)
    stats = AttentionStats()
    block_out, block_lse = blockwise_attention_forward(q, k, v, causal, stats, tiles)
    np.testing.assert_allclose(block_out, out, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(block_lse, lse, rtol=1e-12, atol=1e-13)
    grads = blockwise_attention_backward(q, k, v, lse, dout, output_delta(out, dout), causal, stats, tiles)
    for grad, expected in zip(grads, attention_backward(q, k, v, out, lse, dout, causal)):
        np.testing.assert_allclose(grad, expected, rtol=1e-11, atol=1e-12)
    assert stats.compute_s > 0 and stats.messages == 0


def test_key_blocks_merge_in_any_order():
    """Zig-zag-like spans: keys arrive as blocks of two chunks, in several orders; results equal dense."""
    heads, dim, seq = 2, 3, 16
    q, k, v, dout = qkv(heads, seq, dim, seed=5, scale=30.0)
    chunks = [(0, 3), (3, 5), (5, 8), (8, 11), (11, 13), (13, 16)]
    blocks = [[chunks[0], chunks[5]], [chunks[1], chunks[4]], [chunks[2], chunks[3]]]
    positions = [np.concatenate([np.arange(*span) for span in spans]) for spans in blocks]
    for causal, order in itertools.product([False, True], [(0, 1, 2), (2, 0, 1), (1, 2, 0)]):
        out, lse = attention_forward(q, k, v, causal)
        expected = attention_backward(q, k, v, out, lse, dout, causal)
        dk, dv = np.zeros_like(k), np.zeros_like(v)
        for mine, spans in zip(positions, blocks):
            q_mine, dout_mine = q[:, mine], dout[:, mine]
            out_mine, lse_mine = np.zeros_like(q_mine), np.full(q_mine.shape[:2], -np.inf)
            for index in order:
                theirs = positions[index]
                attend_block(q_mine, k[:, theirs], v[:, theirs], out_mine, lse_mine, spans, blocks[index], causal,
                             tiles=(2, 3))
            np.testing.assert_allclose(out_mine, out[:, mine], rtol=1e-11, atol=1e-12)
            np.testing.assert_allclose(lse_mine, lse[:, mine], rtol=1e-12)
            delta, dq_mine = output_delta(out_mine, dout_mine), np.zeros_like(q_mine)
            for index in order:
                theirs = positions[index]
                grads = dq_mine, np.zeros_like(k[:, theirs]), np.zeros_like(v[:, theirs])
                attend_block_backward(q_mine, k[:, theirs], v[:, theirs], lse_mine, dout_mine, delta, spans,
                                      blocks[index], grads, causal, tiles=(3, 2))
                dk[:, theirs] += grads[1]
                dv[:, theirs] += grads[2]
            np.testing.assert_allclose(dq_mine, expected[0][:, mine], rtol=1e-10, atol=1e-11)
        np.testing.assert_allclose(dk, expected[1], rtol=1e-10, atol=1e-11)
        np.testing.assert_allclose(dv, expected[2], rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("shapes, message", [
    (((2, 4, 3), (2, 4, 3), (2, 5, 3)), "equal"),
    (((2, 4, 3), (3, 4, 3), (3, 4, 3)), "equal"),
    (((2, 4), (2, 4), (2, 4)), "shape"),
])
def test_bad_shapes_are_input_errors(shapes, message):
    arrays = [np.zeros(shape) for shape in shapes]
    with pytest.raises(InputError, match=message):
        attention_forward(*arrays)


def test_non_finite_inputs_are_input_errors():
    q, k, v, _ = qkv(1, 3, 2)
    k[0, 1, 1] = np.nan
    with pytest.raises(InputError, match="NaN"):
        blockwise_attention_forward(q, k, v)


def test_split_spans_cuts_in_storage_order():
    spans = [(2, 5), (10, 14)]
    assert split_spans(spans, 3) == [(0, 3, [(2, 5)]), (3, 6, [(10, 13)]), (6, 7, [(13, 14)])]
    assert split_spans(spans, 4) == [(0, 4, [(2, 5), (10, 11)]), (4, 7, [(11, 14)])]
    assert split_spans([(0, 0)], 4) == []
