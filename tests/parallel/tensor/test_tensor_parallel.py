"""Tensor parallelism (column / row linear, Megatron MLP, sequence parallel) against the serial layers."""
import numpy as np
import pytest
from mpi4py import MPI

from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.nn.layers import Linear
from parallel.collectives import release_plans
from parallel.tensor.exchange import FAMILIES, TensorExchange
from parallel.tensor.tensor_parallel import ColumnParallelLinear, ParallelMLP, RowParallelLinear, token_shard
from tests.mpitools import combination

RTOL = 1e-12


def agreed(comm, verdict):
    """True on every rank when ``verdict`` is true on every rank."""
    return comm.allreduce(bool(verdict), op=MPI.LAND)


def close(actual, expected):
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1.0)
    return actual.shape == expected.shape and np.allclose(actual, expected, rtol=RTOL, atol=RTOL * scale)


def draw(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def random_biases(block, serial):
    """Give the serial block nonzero biases (they start at zero) and the parallel block its slices of them."""
    for name, index in block.serial_slices.items():
        if name.endswith("bias"):
            serial.params[name][:] = draw(serial.params[name].shape, len(name))
            block.params[name][:] = serial.params[name][index]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("hidden, ffn, tokens", [(6, 12, 8), (5, 7, 11), (3, 4, 2)])
def test_mlp_equals_the_serial_block(comm, sequence_parallel, hidden, ffn, tokens):
    block = ParallelMLP(comm, hidden, ffn, seed=3, dtype=np.float64, sequence_parallel=sequence_parallel)
    serial = block.serial_reference()
    random_biases(block, serial)
    x, dy = draw((tokens, hidden), 1), draw((tokens, hidden), 2)
    mine = token_shard(comm, tokens) if sequence_parallel else slice(None)
    y = block.forward(x[mine])
    dx = block.backward(dy[mine])
    expected_y, expected_dx = serial.forward(x), serial.backward(dy)
    grads_ok = [close(block.grads[name], serial.grads[name][index]) for name, index in block.serial_slices.items()]
    params_ok = [np.array_equal(block.params[name], serial.params[name][index])
                 for name, index in block.serial_slices.items()]
    assert sorted(block.grads) == sorted(serial.grads) and len(block.parameters()) == 4
    assert agreed(comm, all(params_ok))
    assert agreed(comm, close(y, expected_y[mine]) and close(dx, expected_dx[mine]))
    assert agreed(comm, all(grads_ok))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_column_and_row_layers_alone(comm, sequence_parallel):
    tokens, n_in, n_out = 7, 5, 9
    serial = Linear(n_in, n_out, rng=11, dtype=np.float64)
    column = ColumnParallelLinear(comm, n_in, n_out, rng=11, dtype=np.float64, sequence_parallel=sequence_parallel)
    row = RowParallelLinear(comm, n_out, n_in, rng=11, dtype=np.float64, sequence_parallel=sequence_parallel)
    row_serial = Linear(n_out, n_in, rng=11, dtype=np.float64)
    x, dy = draw((tokens, n_in), 4), draw((tokens, n_out), 5)
    mine = token_shard(comm, tokens) if sequence_parallel else slice(None)
    cols = slice(*block_range(n_out, comm.size, comm.rank))
    y_cols = column.forward(x[mine])
    dx = column.backward(dy[:, cols])
    ok = close(y_cols, serial.forward(x)[:, cols]) and close(dx, serial.backward(dy)[mine])
    ok = ok and close(column.grads["weight"], serial.grads["weight"][:, cols])
    ok = ok and close(column.grads["bias"], serial.grads["bias"][cols])
    # the row layer takes the column layer's output layout: (T, out_r) in, y replicated or sharded out
    z = row.forward(y_cols)
    dz = draw((tokens, n_in), 6)
    dy_cols = row.backward(dz[mine])
    full_y = serial.forward(x)
    ok = ok and close(z, row_serial.forward(full_y)[mine]) and close(dy_cols, row_serial.backward(dz)[:, cols])
    ok = ok and close(row.grads["weight"], row_serial.grads["weight"][cols])
    ok = ok and close(row.grads["bias"], row_serial.grads["bias"])
    assert agreed(comm, ok)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_bytes_sent_count_one_exchange_of_the_activations_per_pass(comm, sequence_parallel):
    tokens, hidden, p = 9, 4, comm.size
    block = ParallelMLP(comm, hidden, 2 * p + 1, dtype=np.float64, sequence_parallel=sequence_parallel)
    mine = token_shard(comm, tokens) if sequence_parallel else slice(None)
    block.forward(draw((tokens, hidden), 7)[mine])
    after_forward = block.bytes_sent
    block.backward(draw((tokens, hidden), 8)[mine])
    nbytes = tokens * hidden * 8
    per_pass = 2 * (p - 1) * nbytes / p  # one allreduce, or one allgather and one reduce-scatter
    assert (after_forward, block.bytes_sent) == pytest.approx((per_pass, 2 * per_pass))
    assert block.comm_seconds >= 0 and block.layers[0].bytes_sent == block.bytes_sent


@pytest.mark.mpi(min_size=1)
def test_every_hand_written_family_gives_mpis_block_and_counts_its_bytes(comm):
    """Each family of `parallel.tensor.exchange` in both layouts, uneven sizes (fewer tokens than ranks
    too, and float32), against the serial block, with the bytes MPI's calls count."""
    for family, sequence_parallel, (hidden, ffn, tokens), dtype in [
            (family, sequence, sizes, dtype) for family in FAMILIES for sequence in (False, True)
            for sizes, dtype in [((5, 7, 11), np.float64), ((3, 4, 2), np.float32)]]:
        with combination(family, f"sequence_parallel={sequence_parallel}", hidden, ffn, tokens, dtype):
            tolerance = 1e-12 if dtype == np.float64 else 1e-5
            block = ParallelMLP(comm, hidden, ffn, 3, dtype, sequence_parallel, collectives=family)
            mpi = ParallelMLP(comm, hidden, ffn, 3, dtype, sequence_parallel)
            serial = block.serial_reference()
            mine = token_shard(comm, tokens) if sequence_parallel else slice(None)
            x, dy = draw((tokens, hidden), 1).astype(dtype), draw((tokens, hidden), 2).astype(dtype)
            y, dx = block.forward(x[mine]), block.backward(dy[mine])
            mpi.forward(x[mine])
            mpi.backward(dy[mine])
            expected = [serial.forward(x)[mine], serial.backward(dy)[mine]]
            expected += [serial.grads[name][index] for name, index in block.serial_slices.items()]
            actual = [y, dx] + [block.grads[name] for name in block.serial_slices]
            ok = all(np.allclose(a, e, rtol=tolerance, atol=tolerance * max(1.0, float(np.abs(e).max(initial=0))))
                     for a, e in zip(actual, expected))
            assert agreed(comm, ok and block.bytes_sent == pytest.approx(mpi.bytes_sent))
    release_plans(comm)
    with pytest.raises(InputError, match="unknown collectives 'bruck'"):
        TensorExchange(block.counter, "bruck")


@pytest.mark.mpi(min_size=1)
def test_a_split_with_a_rank_left_empty_is_an_input_error(comm):
    with pytest.raises(InputError, match="cannot split"):
        ParallelMLP(comm, 4, comm.size - 1)
    with pytest.raises(InputError, match="cannot split"):
        RowParallelLinear(comm, comm.size - 1, 3)


@pytest.mark.mpi(min_size=2)
def test_sequence_parallel_needs_the_block_range_token_layout(comm):
    block = ParallelMLP(comm, 3, 2 * comm.size, dtype=np.float64, sequence_parallel=True)
    local_tokens = 0 if comm.rank == 0 else 1  # block_range would give the first ranks the tokens
    with pytest.raises(InputError, match="block_range layout"):
        block.forward(np.ones((local_tokens, 3)))
