"""Parameter server: sync mode against serial SGD, async / ssp convergence, the staleness bound, bad roles."""
import functools

import numpy as np
import pytest

from kernels.datasets import load_digits, train_test_split
from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.nn.layers import softmax_cross_entropy
from parallel.nn.models import accuracy, flat_storage, forward_backward, mlp
from parallel.nn.optim import SGD
from parallel.data.param_server import ParameterServer, check_roles, staleness_bound

#: Global batch size; 37 does not divide by 2 or 3 workers.
BATCH = 37


def digits(dtype):
    """The digits as ``(train_x, test_x, train_y, test_y)``, flat rows."""
    images, labels = load_digits(flat=True, dtype=dtype)
    return train_test_split(images, labels, test_fraction=0.2, seed=0)


def global_rows(step, batch, n):
    """Row indices of global batch ``step``: ``batch`` consecutive rows, wrapping around ``n``."""
    return (step * batch + np.arange(batch)) % n


def worker_gradient(ps, model, x, y, batch):
    """``compute_gradient`` of this worker: the mean-over-``batch`` gradient of its block of each global batch."""
    start, stop = block_range(batch, ps.workers, ps.worker_index)
    loss = functools.partial(softmax_cross_entropy, batch_size=batch)

    def compute(clock):
        rows = global_rows(clock, batch, len(x))[start:stop]
        forward_backward(model, loss, x[rows], y[rows])
    return compute


def parameter_server(comm, sizes, dtype, **settings):
    """Return a model of layer ``sizes`` (seed 1, flat storage) and its `ParameterServer`."""
    model = mlp(sizes, seed=1, dtype=dtype)
    params, grads = flat_storage(model)
    return model, ParameterServer(comm, params, grads, **settings)


def test_roles_and_modes_are_checked():
    check_roles(2, 1)
    for ranks, servers in [(1, 1), (4, 4), (4, 0), (0, 0)]:
        with pytest.raises(InputError):
            check_roles(ranks, servers)
    assert [staleness_bound(mode, 3) for mode in ("sync", "async", "ssp")] == [0, None, 3]
    with pytest.raises(InputError):
        staleness_bound("bsp", 1)
    with pytest.raises(InputError):
        staleness_bound("ssp", -1)


@pytest.mark.mpi(min_size=1)
def test_too_few_ranks_or_too_many_servers_is_an_input_error(comm):
    params = np.zeros(5)
    with pytest.raises(InputError, match="ranks"):
        ParameterServer(comm, params, np.zeros(5), lr=0.1, servers=max(1, comm.size))
    if comm.size >= 2:
        with pytest.raises(InputError, match="dtype"):
            ParameterServer(comm, params, np.zeros(4), lr=0.1, servers=comm.size - 1)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("many_servers", [False, True])
def test_sync_mode_equals_serial_sgd_on_the_global_batches(comm, many_servers):
    servers = comm.size - 1 if many_servers else 1
    train_x, _, train_y, _ = digits(np.float64)
    optimizer_settings = dict(lr=0.3, momentum=0.5, weight_decay=1e-3)
    model, ps = parameter_server(comm, [64, 20, 10], np.float64, mode="sync", servers=servers,
                                 **optimizer_settings)
    compute = None if ps.is_server else worker_gradient(ps, model, train_x, train_y, BATCH)
    for steps in (0, 2, 3):  # calls compose, and a call of no steps only shuts down cleanly
        ps.train(steps, compute)
    got = ps.gather_parameters()

    serial = mlp([64, 20, 10], seed=1, dtype=np.float64)
    serial_params, serial_grads = flat_storage(serial)
    optimizer = SGD([(serial_params, serial_grads)], **optimizer_settings)
    loss = functools.partial(softmax_cross_entropy, batch_size=BATCH)
    for step in range(5):
        rows = global_rows(step, BATCH, len(train_x))
        forward_backward(serial, loss, train_x[rows], train_y[rows])
        optimizer.step()
    np.testing.assert_allclose(got, serial_params, rtol=1e-10, atol=1e-12)
    stats = ps.statistics()
    assert (stats.gradient_shards, stats.max_staleness) == (5 * ps.workers * servers, 0)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["async", "ssp"])
def test_async_and_ssp_modes_converge_on_digits(comm, mode):
    train_x, test_x, train_y, test_y = digits(np.float32)
    model, ps = parameter_server(comm, [64, 32, 10], np.float32, mode=mode, servers=max(1, comm.size // 3),
                                 staleness=1, lr=0.5)
    compute = None if ps.is_server else worker_gradient(ps, model, train_x, train_y, 64)
    ps.train(80, compute)
    trained = ps.gather_parameters()
    assert np.all(np.isfinite(trained))
    ps.flat_params[:] = trained
    assert accuracy(model, test_x, test_y) > 0.8
    stats = ps.statistics()
    assert stats.gradient_shards == 80 * ps.workers * ps.servers
    if mode == "ssp":
        assert stats.max_staleness <= 1


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["ssp", "async"])
def test_a_fast_worker_runs_ahead_by_exactly_the_bound_in_ssp_only(comm, mode):
    """Worker 0 waits in its first step until worker 1 reaches clock ``ahead``, which it can only do if allowed."""
    bound, steps = 2, 6
    ahead = bound if mode == "ssp" else steps - 1
    train_x, _, train_y, _ = digits(np.float64)
    model, ps = parameter_server(comm, [64, 8, 10], np.float64, mode=mode, servers=comm.size - 2,
                                 staleness=bound, lr=0.1)
    side = comm.Dup()
    signal = np.zeros(1)
    compute = None
    if not ps.is_server:
        gradient = worker_gradient(ps, model, train_x, train_y, 16)

        def compute(clock):
            if ps.worker_index == 0 and clock == 0:
                side.Recv(signal, source=ps.servers + 1)
            if ps.worker_index == 1 and clock == ahead:
                side.Send(signal, dest=ps.servers)
            gradient(clock)
    ps.train(steps, compute)
    side.Free()
    stats = ps.statistics()
    assert stats.max_staleness == ahead
    assert stats.gradient_shards == steps * 2 * ps.servers
