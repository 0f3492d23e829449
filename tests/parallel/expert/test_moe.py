"""Mixture of experts: the serial layer by finite differences, the expert-parallel one against it."""
import itertools

import numpy as np
import pytest
from mpi4py import MPI

from kernels.distribution import block_counts, block_range
from kernels.errors import InputError
from parallel.collectives import release_plans
from parallel.collectives.alltoall import ALLTOALLV_ALGORITHMS
from parallel.expert.moe import ParallelMoE
from parallel.expert.layer import SerialMoE
from parallel.expert.routing import expert_capacity
from tests.mpitools import combination

RTOL = 1e-12


def draw(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def objective(layer, x, shard_sizes, weights):
    """``sum(y * weights) + aux_loss_weight * aux``: the loss whose gradients `backward(weights)` returns."""
    y = layer.forward(x, shard_sizes)
    return float(np.sum(y * weights)) + layer.aux_loss_weight * layer.aux_loss


@pytest.mark.parametrize("top_k, capacity_factor", [(1, 0.7), (2, 0.6), (2, 4.0)])
def test_serial_backward_matches_finite_differences(top_k, capacity_factor):
    x, shards = draw((11, 3), 0), [6, 5]
    weights = draw((11, 3), 1)
    layer = SerialMoE(3, 4, 4, top_k, capacity_factor, seed=5, dtype=np.float64, aux_loss_weight=0.7)
    for name, param in layer.params.items():
        param += 0.1 * draw(param.shape, len(name))
    objective(layer, x, shards, weights)
    assert (layer.dropped > 0) == (capacity_factor < 1)
    dx = layer.backward(weights)
    grads = {name: grad.copy() for name, grad in layer.grads.items()}
    eps = 1e-6

    def numeric(array):
        result = np.empty_like(array)
        for index in np.ndindex(array.shape):
            saved = array[index]
            array[index] = saved + eps
            up = objective(layer, x, shards, weights)
            array[index] = saved - eps
            down = objective(layer, x, shards, weights)
            array[index] = saved
            result[index] = (up - down) / (2 * eps)
        return result

    assert np.allclose(dx, numeric(x), rtol=1e-6, atol=1e-8)
    for name, param in layer.params.items():
        assert np.allclose(grads[name], numeric(param), rtol=1e-6, atol=1e-8), name


def test_capacity_drops_second_choices_after_all_first_choices():
    # tokens 0, 1 prefer expert 1 then 0; tokens 2, 3 prefer expert 0 then 1; capacity 2 per expert
    layer = SerialMoE(1, 3, 2, top_k=2, capacity_factor=0.5, seed=2, dtype=np.float64)
    layer.gate.params["weight"][:] = [[-1.0, 1.0]]
    x = np.array([[1.0], [0.5], [-1.0], [-0.5]])
    assert expert_capacity(4, 2, 2, 0.5) == 2
    y = layer.forward(x)
    first = np.array([1, 1, 0, 0])
    probs = np.exp(x * [[-1.0, 1.0]])
    probs /= probs.sum(axis=1, keepdims=True)
    expected = np.concatenate([probs[t, e] * layer.experts[e].forward(x[t:t + 1]) for t, e in enumerate(first)])
    assert layer.dropped == 4 and layer.expert_load.tolist() == [2, 2]
    assert np.allclose(y, expected, rtol=RTOL, atol=RTOL)
    assert layer.aux_loss == pytest.approx(2 * (0.5 * probs[:, 0].mean() + 0.5 * probs[:, 1].mean()))


def test_bad_settings_are_input_errors():
    for top_k, capacity_factor in [(3, 1.0), (0, 1.0), (1, 0.0)]:
        with pytest.raises(InputError, match="top_k"):
            SerialMoE(4, 4, 4, top_k, capacity_factor)
    with pytest.raises(InputError, match="do not add up"):
        SerialMoE(2, 2, 2).forward(np.ones((3, 2)), [1, 1])


def agreed(comm, verdict):
    return comm.allreduce(bool(verdict), op=MPI.LAND)


def close(actual, expected):
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1.0)
    return actual.shape == expected.shape and np.allclose(actual, expected, rtol=RTOL, atol=RTOL * scale)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("top_k, capacity_factor", [(1, 0.6), (2, 0.5), (1, 50.0), (2, 50.0)])
def test_parallel_equals_serial_with_the_same_shards(comm, top_k, capacity_factor):
    p, hidden = comm.size, 5
    tokens = 5 * p + 2
    layer = ParallelMoE(comm, hidden, 6, 2 * p, top_k, capacity_factor, seed=9, dtype=np.float64,
                        aux_loss_weight=0.3)
    serial = layer.serial_reference()
    for name, param in serial.params.items():  # biases start at zero: make every parameter count
        param += 0.1 * draw(param.shape, len(name))
        if name in layer.params:
            layer.params[name][...] = param
    x, dy = draw((tokens, hidden), 3), draw((tokens, hidden), 4)
    mine = slice(*block_range(tokens, p, comm.rank))
    y, dx = layer.forward(x[mine]), layer.backward(dy[mine])
    expected_y, expected_dx = serial.forward(x, block_counts(tokens, p)), serial.backward(dy)
    assert (serial.dropped > 0) == (capacity_factor < 1)
    assert len(layer.params) == 2 + 4 * 2 and set(layer.grads) <= set(serial.grads)
    assert agreed(comm, close(y, expected_y[mine]) and close(dx, expected_dx[mine]))
    assert agreed(comm, all(close(grad, serial.grads[name]) for name, grad in layer.grads.items()))
    assert agreed(comm, (layer.dropped, layer.tokens, layer.expert_load.tolist()) ==
                  (serial.dropped, tokens, serial.expert_load.tolist()))
    assert agreed(comm, layer.aux_loss == pytest.approx(serial.aux_loss, rel=RTOL))


@pytest.mark.mpi(min_size=1)
def test_each_hand_written_alltoall_gives_mpis_layer_and_counts_its_bytes(comm):
    """Every algorithm of ALLTOALLV_ALGORITHMS against the serial layer, with drops and fewer tokens than
    ranks (empty shards, empty blocks), and the bytes MPI's calls count; Bruck refused."""
    p, hidden = comm.size, 3
    for alltoall, top_k, capacity_factor, tokens in itertools.product(
            sorted(ALLTOALLV_ALGORITHMS), (1, 2), (0.5,), (4 * p + 3, p - 1)):
        with combination(alltoall, top_k, capacity_factor, tokens):
            layers = [ParallelMoE(comm, hidden, 4, 2 * p, top_k, capacity_factor, seed=2, dtype=np.float64,
                                  aux_loss_weight=0.1, alltoall=choice) for choice in (alltoall, "mpi")]
            serial = layers[0].serial_reference()
            x, dy = draw((tokens, hidden), 5), draw((tokens, hidden), 6)
            mine = slice(*block_range(tokens, p, comm.rank))
            y, dx = layers[0].forward(x[mine]), layers[0].backward(dy[mine])
            layers[1].forward(x[mine])
            layers[1].backward(dy[mine])
            expected_y, expected_dx = serial.forward(x, block_counts(tokens, p)), serial.backward(dy)
            ok = close(y, expected_y[mine]) and close(dx, expected_dx[mine])
            ok = ok and all(close(grad, serial.grads[name]) for name, grad in layers[0].grads.items())
            assert agreed(comm, ok and layers[0].bytes_sent == pytest.approx(layers[1].bytes_sent))
    release_plans(comm)
    with pytest.raises(InputError, match="'bruck' cannot take the routing's counts"):
        ParallelMoE(comm, 4, 4, comm.size, alltoall="bruck")


@pytest.mark.mpi(min_size=1)
def test_bytes_sent_count_rows_to_other_ranks_and_the_allreduces(comm):
    p, hidden, experts, rank = comm.size, 4, 2 * comm.size, comm.rank
    tokens = 3 * p + 1
    layer = ParallelMoE(comm, hidden, 3, experts, top_k=2, capacity_factor=1.0, seed=1, dtype=np.float64)
    serial = layer.serial_reference()
    x = draw((tokens, hidden), 6)
    serial.forward(x, block_counts(tokens, p))
    layer.forward(x[slice(*block_range(tokens, p, rank))])
    layer.backward(np.ones((block_counts(tokens, p)[rank], hidden)))
    loads = np.stack([routing.counts for routing in serial._routings]).reshape(p, p, 2).sum(axis=2)
    rows_out = loads[rank].sum() - loads[rank, rank]
    rows_in = loads[:, rank].sum() - loads[rank, rank]
    ring = [2 * (p - 1) * 8 * n / p for n in (3 * experts + 2, (hidden + 1) * experts)]
    expected = 2 * (rows_out + rows_in) * hidden * 8 + (p - 1) * 2 * 8 + sum(ring)
    assert agreed(comm, layer.bytes_sent == pytest.approx(expected))


@pytest.mark.mpi(min_size=2)
def test_experts_not_divisible_by_the_ranks_is_an_input_error(comm):
    with pytest.raises(InputError, match="spread evenly"):
        ParallelMoE(comm, 4, 4, comm.size + 1)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("top_k, capacity_factor, per_rank", [(1, 0.6, 5), (2, 0.5, 3), (2, 50.0, 0)])
def test_parallel_on_the_device_equals_serial_on_the_host(comm, device_backend, top_k, capacity_factor, per_rank):
    """Routing, dispatch and combine in device memory; per_rank 0: fewer tokens than ranks (empty shards)."""
    p, hidden = comm.size, 4
    tokens = per_rank * p + 1
    layer = ParallelMoE(device_backend.comm(comm), hidden, 3, 2 * p, top_k, capacity_factor, seed=5,
                        dtype=np.float64, aux_loss_weight=0.2)
    serial = layer.serial_reference()
    layer.to(device_backend)
    x, dy = draw((tokens, hidden), 7), draw((tokens, hidden), 8)
    mine = slice(*block_range(tokens, p, comm.rank))
    y = layer.forward(device_backend.from_host(x[mine]))
    dx = layer.backward(device_backend.from_host(dy[mine]))
    expected_y, expected_dx = serial.forward(x, block_counts(tokens, p)), serial.backward(dy)
    host = device_backend.to_host
    assert agreed(comm, all(device_backend.is_device_array(a) for a in [y, dx, *layer.grads.values()]))
    assert agreed(comm, close(host(y), expected_y[mine]) and close(host(dx), expected_dx[mine]))
    assert agreed(comm, all(close(host(grad), serial.grads[name]) for name, grad in layer.grads.items()))
    assert agreed(comm, (layer.dropped, layer.tokens) == (serial.dropped, tokens))
    assert agreed(comm, layer.aux_loss == pytest.approx(serial.aux_loss, rel=RTOL))
