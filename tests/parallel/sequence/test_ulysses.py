"""Ulysses (all-to-all) attention on 1-4 ranks against the dense serial reference (float64)."""
import numpy as np
import pytest
from mpi4py import MPI

from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.nn.attention import AttentionStats, attention_backward, attention_forward
from parallel.sequence.ulysses import ulysses_attention_backward, ulysses_attention_forward

HEADS, DIM = 12, 3  # 12 heads divide by 1, 2, 3 and 4 ranks


def problem(seq, seed, scale=1.0, heads=HEADS):
    rng = np.random.default_rng(seed)
    q, k, v, dout = (rng.standard_normal((heads, seq, DIM)) for _ in range(4))
    return q * scale, k * scale, v, dout


def largest_error(comm, pairs):
    """Largest error relative to max(1, max |expected|), over pairs and ranks."""
    errors = [float(np.max(np.abs(actual - expected), initial=0.0))
              / max(1.0, float(np.max(np.abs(expected), initial=0.0))) for actual, expected in pairs]
    return comm.allreduce(max(errors), op=MPI.MAX)


def run_ulysses(comm, seq, causal, scale=1.0, stats=None, backend=None):
    """Errors of the forward and backward results against the dense reference (device shards with ``backend``)."""
    q, k, v, dout = problem(seq, seed=seq, scale=scale)
    out, lse = attention_forward(q, k, v, causal)
    grads = attention_backward(q, k, v, out, lse, dout, causal)
    mine = slice(*block_range(seq, comm.size, comm.rank))
    local = [np.ascontiguousarray(array[:, mine]) for array in (q, k, v, dout)]
    run_comm = comm
    if backend is not None:
        local, run_comm = [backend.from_host(array) for array in local], backend.comm(comm)
    my_out, my_lse = ulysses_attention_forward(run_comm, *local[:3], seq, causal, stats, tiles=(3, 4))
    my_grads = ulysses_attention_backward(run_comm, *local[:3], my_out, my_lse, local[3], seq, causal, stats,
                                          tiles=(2, 5))
    if backend is not None:
        results = [my_out, my_lse, *my_grads]
        assert comm.allreduce(sum(not backend.is_device_array(array) for array in results)) == 0
        my_out, my_lse, *my_grads = [backend.to_host(array) for array in results]
    forward = largest_error(comm, [(my_out, out[:, mine]), (my_lse, lse[:, mine])])
    return forward, largest_error(comm, [(mine_grad, grad[:, mine]) for mine_grad, grad in zip(my_grads, grads)])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq", [1, 3, 10, 21])
def test_ulysses_matches_serial(comm, seq, causal):
    forward, backward = run_ulysses(comm, seq, causal)
    assert forward < 1e-12 and backward < 1e-11


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq", [1, 10])
def test_ulysses_on_the_device_matches_serial(comm, device_backend, seq, causal):
    """Device shards: head groups allocated on the device, each Alltoallv staged by the DeviceComm."""
    forward, backward = run_ulysses(comm, seq, causal, backend=device_backend)
    assert forward < 1e-12 and backward < 1e-11


@pytest.mark.mpi(min_size=1)
def test_large_magnitudes(comm):
    """Q, K scaled by 1e3 (scores near 1e6, themselves rounded to about 1e-10)."""
    forward, backward = run_ulysses(comm, 17, True, scale=1e3)
    assert forward < 1e-12 and backward < 1e-8


@pytest.mark.mpi(min_size=1)
def test_traffic_counts(comm):
    """Per exchange of an array of w numbers per token and head, a rank sends its tokens' other head groups."""
    seq, size = 11, comm.size
    stats = AttentionStats()
    run_ulysses(comm, seq, False, stats=stats)
    mine = block_range(seq, size, comm.rank)[1] - block_range(seq, size, comm.rank)[0]
    others = [block_range(seq, size, peer) for peer in range(size) if peer != comm.rank]
    group = HEADS // size
    out_tokens = (size - 1) * mine  # tokens of this rank sent to each other head group
    back_tokens = sum(stop - start for start, stop in others)  # other ranks' tokens of this head group
    widths_in, widths_back = [DIM] * 3 + [DIM] * 4 + [1, 1], [DIM, 1] + [DIM] * 3
    expected = 8 * group * (out_tokens * sum(widths_in) + back_tokens * sum(widths_back))
    assert comm.allreduce(int(stats.bytes_sent != expected)) == 0


@pytest.mark.mpi(min_size=2)
def test_heads_must_divide_by_ranks(comm):
    heads = comm.size + 1
    q, k, v, _ = problem(2 * comm.size, seed=0, heads=heads)
    mine = slice(*block_range(2 * comm.size, comm.size, comm.rank))
    with pytest.raises(InputError, match="heads"):
        ulysses_attention_forward(comm, q[:, mine], k[:, mine], v[:, mine], 2 * comm.size)


@pytest.mark.mpi(min_size=1)
def test_wrong_local_shape_is_an_input_error(comm):
    q, k, v, _ = problem(comm.size + 2, seed=0)
    with pytest.raises(InputError, match="holds"):
        ulysses_attention_forward(comm, q, k, v, comm.size + 1)


@pytest.mark.mpi(min_size=1)
def test_strided_shards_are_accepted(comm):
    """Views that are not contiguous (every other head of a larger array) give the same result."""
    seq = 2 * comm.size + 1
    q, k, v, _ = problem(seq, seed=3, heads=2 * HEADS)
    mine = slice(*block_range(seq, comm.size, comm.rank))
    strided = [array[::2, mine] for array in (q, k, v)]
    out, lse = ulysses_attention_forward(comm, *strided, seq)
    expected_out, expected_lse = attention_forward(q[::2], k[::2], v[::2])
    assert largest_error(comm, [(out, expected_out[:, mine]), (lse, expected_lse[:, mine])]) < 1e-12
