"""Ring attention on 1-4 ranks against the dense serial reference (float64), plain and zig-zag layouts."""
import numpy as np
import pytest
from mpi4py import MPI

from kernels.errors import InputError
from parallel.nn.attention import AttentionStats, attention_backward, attention_forward
from parallel.sequence.ring_attention import (ring_attention_backward, ring_attention_forward, sequence_positions,
                                     sequence_spans)

HEADS, DIM = 2, 3
PIECE = 4  # keys per tile and tokens per piece of the streamed last block: several pieces per block


def global_problem(seq, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    q, k, v, dout = (rng.standard_normal((HEADS, seq, DIM)) for _ in range(4))
    return q * scale, k * scale, v, dout


def worst(comm, pairs, relative):
    """Largest error over ``(actual, expected)`` pairs and over ranks (every rank gets the same number)."""
    errors = [0.0]
    for actual, expected in pairs:
        size = max(1.0, float(np.max(np.abs(expected), initial=0.0))) if relative else 1.0
        errors.append(float(np.max(np.abs(actual - expected), initial=0.0)) / size)
    return comm.allreduce(max(errors), op=MPI.MAX)


def run_ring(comm, seq, causal, zigzag, scale=1.0, stats=None, backend=None):
    """Errors of (O, lse) and of (dQ, dK, dV) of the ring against the dense reference, agreed on every rank.

    With a device ``backend`` the shards are device arrays and the ring runs on
    ``backend.comm(comm)``; every result must be a device array.
    """
    q, k, v, dout = global_problem(seq, seed=seq + 7, scale=scale)
    out, lse = attention_forward(q, k, v, causal)
    grads = attention_backward(q, k, v, out, lse, dout, causal)
    mine = sequence_positions(seq, comm.size, comm.rank, zigzag)
    local = [np.ascontiguousarray(array[:, mine]) for array in (q, k, v, dout)]
    ring_comm = comm
    if backend is not None:
        local, ring_comm = [backend.from_host(array) for array in local], backend.comm(comm)
    ring_out, ring_lse = ring_attention_forward(ring_comm, *local[:3], seq, causal, zigzag, stats, tiles=(3, PIECE))
    ring_grads = ring_attention_backward(ring_comm, *local[:3], ring_out, ring_lse, local[3], seq, causal, zigzag,
                                         stats, tiles=(2, PIECE))
    if backend is not None:
        results = [ring_out, ring_lse, *ring_grads]
        assert comm.allreduce(sum(not backend.is_device_array(array) for array in results)) == 0
        ring_out, ring_lse, *ring_grads = [backend.to_host(array) for array in results]
    forward = worst(comm, [(ring_out, out[:, mine]), (ring_lse, lse[:, mine])], relative=scale > 1)
    backward = worst(comm, [(mine_grad, grad[:, mine]) for mine_grad, grad in zip(ring_grads, grads)], relative=True)
    return forward, backward


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("zigzag", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq", [1, 2, 7, 23])
def test_ring_matches_serial(comm, seq, causal, zigzag):
    forward, backward = run_ring(comm, seq, causal, zigzag)
    assert forward < 1e-12 and backward < 1e-11


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("zigzag", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq", [2, 23])
def test_ring_on_the_device_matches_serial(comm, device_backend, seq, causal, zigzag):
    """Device shards: overlapped K / V passing staged through the DeviceComm, completed by wait_all."""
    forward, backward = run_ring(comm, seq, causal, zigzag, backend=device_backend)
    assert forward < 1e-12 and backward < 1e-11


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("zigzag", [False, True])
def test_large_magnitudes_stay_finite_and_accurate(comm, zigzag):
    """Q, K scaled by 1e3: scores near 1e6 overflow exp without max subtraction.

    Scores that large carry a rounding error near 1e6 * 1e-16 themselves, so
    results agree to about 1e-10 relative, not to the last bit.
    """
    forward, backward = run_ring(comm, 19, True, zigzag, scale=1e3)
    assert forward < 1e-12 and backward < 1e-8


@pytest.mark.mpi(min_size=1)
def test_traffic_counts(comm):
    """K, V: two messages per step for p - 2 steps, then two per piece; dK/dV: one message per step."""
    seq, size = 23, comm.size
    stats = AttentionStats()
    run_ring(comm, seq, False, False, stats=stats)
    lengths = [len(sequence_positions(seq, size, rank)) for rank in range(size)]
    held = [(comm.rank - step) % size for step in range(size)]
    kv_bytes = sum(2 * HEADS * lengths[owner] * DIM * 8 for owner in held[:-1])
    grad_bytes = sum(2 * HEADS * lengths[owner] * DIM * 8 for owner in held) if size > 1 else 0
    kv_messages = 2 * (size - 2) + 2 * -(-lengths[held[-2]] // PIECE) if size > 1 else 0
    expected = (2 * kv_messages + (size if size > 1 else 0), 2 * kv_bytes + grad_bytes)
    assert comm.allreduce(int((stats.messages, stats.bytes_sent) != expected)) == 0
    assert comm.allreduce(int(stats.compute_s > 0)) == size


def test_layouts_cover_the_sequence_once():
    for seq, ranks, zigzag in [(23, 3, True), (23, 4, False), (5, 4, True), (0, 2, True)]:
        positions = np.concatenate([sequence_positions(seq, ranks, rank, zigzag) for rank in range(ranks)])
        assert sorted(positions) == list(range(seq))
    assert sequence_spans(16, 4, 1, zigzag=True) == [(2, 4), (12, 14)]
    with pytest.raises(InputError, match=">= 0"):
        sequence_spans(-1, 2, 0)


@pytest.mark.mpi(min_size=1)
def test_wrong_local_shape_is_an_input_error(comm):
    seq = 4 * comm.size + 1
    q, k, v, _ = global_problem(seq + 1, seed=1)
    one_too_many = len(sequence_positions(seq, comm.size, comm.rank)) + 1
    with pytest.raises(InputError, match="holds"):
        ring_attention_forward(comm, *(array[:, :one_too_many] for array in (q, k, v)), seq)


@pytest.mark.mpi(min_size=1)
def test_strided_shards_are_accepted(comm):
    """Views that are not contiguous (every other head of a larger array) give the same result."""
    seq = 3 * comm.size + 2
    q, k, v, _ = global_problem(seq, seed=3)
    mine = sequence_positions(seq, comm.size, comm.rank, zigzag=True)
    wide = [np.repeat(array[:, mine], 2, axis=0) for array in (q, k, v)]
    out, lse = ring_attention_forward(comm, *(array[::2] for array in wide), seq, zigzag=True, tiles=(2, 2))
    expected_out, expected_lse = attention_forward(q, k, v)
    assert worst(comm, [(out, expected_out[:, mine]), (lse, expected_lse[:, mine])], relative=False) < 1e-12
