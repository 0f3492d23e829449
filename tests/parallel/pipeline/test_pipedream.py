"""PipeDream (1F1B without flush, an update per micro-batch, weight stashing) against its serial replay."""
import itertools

import numpy as np
import pytest
from mpi4py import MPI

from kernels.datasets import load_mnist_sample
from kernels.errors import InputError
from parallel.nn.layers import softmax_cross_entropy
from parallel.nn.models import mlp, mnist_cnn, train_step
from parallel.nn.optim import SGD
from parallel.pipeline.pipedream import PipeDream, forward_versions, serial_pipedream
from parallel.pipeline.schedule import (BACKWARD, FORWARD, bubble_fraction, partition, pipedream_drain,
                                        pipedream_step, replay, stage_schedule)
from tests.mpitools import all_ranks, from_root

SIZES = [6, 9, 7, 8, 5, 4]  # 5 Linear and 4 ReLU layers: room for 4 stages
LR = 0.1
#: MNIST check: after 40 updates (lr 0.02, micro-batches of 16), the held-out loss of PipeDream's weights is
#: within this fraction of synchronous SGD's on the same micro-batches (measured: +7%, +7%, +10% on 2, 3, 4
#: stages; at lr 0.05 two stages' staleness costs +117%, so the tolerance holds for the stated lr only).
LOSS_TOLERANCE = 0.15


def test_steps_then_drain_are_one_endless_1f1b_schedule_whose_one_step_stream_is_1f1b():
    for stages, m, steps in itertools.product(range(1, 5), range(1, 6), range(1, 4)):
        for stage in range(stages):
            warmup = stages - stage - 1
            assert pipedream_step(stages, stage, 0, m) + pipedream_drain(stages, stage, 1, m) == \
                stage_schedule("1f1b", stages, stage, m)
            actions = [action for step in range(steps) for action in pipedream_step(stages, stage, step, m)]
            assert all(index < (step + 1) * m for step in range(steps)
                       for kind, index in pipedream_step(stages, stage, step, m))  # only data fed in so far
            actions += pipedream_drain(stages, stage, steps, m)
            total = steps * m
            assert sorted(actions) == sorted((kind, i) for kind in (FORWARD, BACKWARD) for i in range(total))
            # The forward of micro-batch k follows exactly the backwards of 0 .. k - w - 1: its weight version.
            assert forward_versions(actions) == [max(0, k - warmup) for k in range(total)]


def test_the_steady_state_has_no_bubble_and_replay_takes_earlier_inputs_as_ready():
    for stages, m in itertools.product(range(1, 5), (1, 4, 8)):
        step = 2 * stages  # past the fill
        schedules = [pipedream_step(stages, stage, step, m) for stage in range(stages)]
        assert all(len(schedule) == 2 * m for schedule in schedules)
        clocks = replay(schedules, [[1.0] * len(schedule) for schedule in schedules])
        assert bubble_fraction([2.0 * m] * stages, clocks) == 0.0


def data(samples, seed=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((samples, SIZES[0])), rng.integers(0, SIZES[-1], samples)


def stage_of(comm, layers, m, shape, dtype=np.float64):
    start, stop = partition(layers, comm.size)[comm.rank]
    return PipeDream(comm, layers[start:stop], shape, m, dtype), (start, stop)


@pytest.mark.mpi(min_size=1)
def test_one_stage_is_serial_sgd_step_by_step(comm):
    pipeline = PipeDream(MPI.COMM_SELF, mlp(SIZES, seed=1, dtype=np.float64).layers, (SIZES[0],), 3, np.float64)
    optimizer = SGD(pipeline.parameters(), lr=LR, momentum=0.9)
    serial = mlp(SIZES, seed=1, dtype=np.float64)
    serial_optimizer = SGD(serial.parameters(), lr=LR, momentum=0.9)
    x, y = data(21)
    for step in range(7):
        loss = pipeline.train_step(optimizer, x[3 * step:3 * step + 3], y[3 * step:3 * step + 3])
        losses = [train_step(serial, softmax_cross_entropy, serial_optimizer, x[i:i + 1], y[i:i + 1])
                  for i in range(3 * step, 3 * step + 3)]
        assert loss == pytest.approx(np.mean(losses), rel=1e-12)
        assert pipeline.in_flight == 0 and pipeline.staleness == [0, 0, 0] and pipeline.peak_stash_bytes == 0
        assert all(np.array_equal(got, want) for (got, _), (want, _) in zip(pipeline.parameters(),
                                                                             serial.parameters()))


@pytest.mark.mpi(min_size=1)
def test_every_update_is_the_serial_gradient_at_the_stashed_weights(comm):
    # One micro-batch per step: each step applies at most one update per stage, compared with the replay's.
    layers = mlp(SIZES, seed=1, dtype=np.float64).layers
    pipeline, (start, stop) = stage_of(comm, layers, 1, (SIZES[0],))
    optimizer = SGD(pipeline.parameters(), lr=LR)
    x, y = data(7 * 2)
    record = []
    serial_pipedream(mlp(SIZES, seed=1, dtype=np.float64).layers, partition(layers, comm.size), x, y, 7, LR,
                     record=record)
    mine = [weights for stage, weights in record if stage == comm.rank]
    updates = 0
    for step in range(7):
        pipeline.train_step(optimizer, x[2 * step:2 * step + 2], y[2 * step:2 * step + 2])
        updates += sum(kind == BACKWARD for kind, _ in pipeline.actions)
        assert all_ranks(comm, pipeline.version == updates <= step + 1)
        expected = mine[updates - 1] if updates else [param for layer in layers[start:stop]
                                                      for param, _ in layer.parameters()]
        assert all_ranks(comm, all(np.allclose(got, want, rtol=1e-12, atol=1e-14)
                                   for (got, _), want in zip(pipeline.parameters(), expected)))
    pipeline.drain()
    assert all_ranks(comm, pipeline.version == 7 and pipeline.in_flight == 0 and pipeline.stash_bytes == 0)
    assert all_ranks(comm, all(np.allclose(got, want, rtol=1e-12, atol=1e-14)
                               for (got, _), want in zip(pipeline.parameters(), mine[-1])))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("m", [1, 3, 5])
def test_steps_and_drains_equal_the_serial_replay_with_staleness_and_stash_per_stage(comm, m):
    layers = mlp(SIZES, seed=1, dtype=np.float64).layers
    pipeline, (start, stop) = stage_of(comm, layers, m, (SIZES[0],))
    optimizer = SGD(pipeline.parameters(), lr=LR)
    reference = mlp(SIZES, seed=1, dtype=np.float64).layers
    bounds = partition(layers, comm.size)
    warmup = comm.size - comm.rank - 1
    stage_bytes = sum(param.nbytes for param, _ in pipeline.parameters())
    for streams, steps in enumerate((4, 2)):  # a stream of 4 steps, drained, then one of 2 (rows 2 then 3)
        rows = 2 + streams
        x, y = data(steps * m * rows, seed=streams)
        for step in range(steps):
            pipeline.train_step(optimizer, x[step * m * rows:(step + 1) * m * rows],
                                y[step * m * rows:(step + 1) * m * rows])
            if step * m >= 2 * comm.size:  # steady state: every backward is w versions stale, w copies stashed
                assert all_ranks(comm, pipeline.staleness == [warmup] * len(pipeline.staleness))
                assert all_ranks(comm, pipeline.peak_stash_bytes == warmup * stage_bytes)
            assert all_ranks(comm, max(pipeline.staleness, default=0) <= warmup)
        pipeline.drain()
        serial_pipedream(reference, bounds, x, y, steps * m, LR)
        expected = [param for layer in reference[start:stop] for param, _ in layer.parameters()]
        assert all_ranks(comm, all(np.allclose(got, want, rtol=1e-12, atol=1e-14)
                                   for (got, _), want in zip(pipeline.parameters(), expected)))


@pytest.mark.mpi(min_size=1)
def test_misuse_and_bad_batches_are_errors(comm):
    pipeline, _ = stage_of(comm, mlp(SIZES, seed=1, dtype=np.float64).layers, 2, (SIZES[0],))
    optimizer = SGD(pipeline.parameters(), lr=LR)
    x, y = data(8)
    with pytest.raises(TypeError, match="call train_step"):
        pipeline.compute_gradients(x, y)
    with pytest.raises(InputError, match="does not split into 2"):
        pipeline.train_step(optimizer, x[:3], y[:3])
    pipeline.train_step(optimizer, x[:4], y[:4])
    if comm.size > 1:  # micro-batches in flight on every stage but the last: the row count is fixed
        verdict = comm.rank == comm.size - 1
        try:
            pipeline.train_step(optimizer, x[:6], y[:6])
        except InputError as error:
            verdict = "drain() first" in str(error)
        assert all_ranks(comm, verdict)
    pipeline.drain()
    pipeline.train_step(optimizer, x[:6], y[:6])
    pipeline.drain()
    assert all_ranks(comm, pipeline.in_flight == 0)


@pytest.mark.mpi(min_size=1)
def test_mnist_loss_after_pipedream_steps_is_within_tolerance_of_synchronous_sgd(comm):
    images, labels = load_mnist_sample(dtype=np.float64)
    order = np.random.default_rng(0).permutation(len(images))
    train, test = order[:640], order[4000:4500]
    m, rows, lr = 4, 16, 0.02
    layers = mnist_cnn(seed=0, dtype=np.float64).layers
    pipeline, _ = stage_of(comm, layers, m, (1, 28, 28))
    optimizer = SGD(pipeline.parameters(), lr=lr)
    for step in range(len(train) // (m * rows)):
        batch = train[step * m * rows:(step + 1) * m * rows]
        pipeline.train_step(optimizer, images[batch], labels[batch])
    pipeline.drain()
    gathered = [array for part in comm.allgather([param for param, _ in pipeline.parameters()]) for array in part]
    trained = mnist_cnn(seed=0, dtype=np.float64)
    for (param, _), value in zip(trained.parameters(), gathered):
        param[...] = value
    initial, reference = from_root(comm, lambda: _synchronous_losses(images, labels, train, test, rows, lr))
    loss = softmax_cross_entropy(trained.forward(images[test]), labels[test])[0]
    assert reference < 0.5 * initial  # synchronous SGD has learnt; PipeDream's staleness costs at most the tolerance
    assert abs(loss - reference) <= LOSS_TOLERANCE * reference
    assert comm.size > 1 or loss == pytest.approx(reference, rel=1e-12)


def _synchronous_losses(images, labels, train, test, rows, lr):
    """Test losses of the initial CNN and after serial SGD on the same micro-batches and learning rate."""
    synchronous = mnist_cnn(seed=0, dtype=np.float64)
    serial_optimizer = SGD(synchronous.parameters(), lr=lr)
    for start in range(0, len(train), rows):
        batch = train[start:start + rows]
        train_step(synchronous, softmax_cross_entropy, serial_optimizer, images[batch], labels[batch])
    initial = softmax_cross_entropy(mnist_cnn(seed=0, dtype=np.float64).forward(images[test]), labels[test])[0]
    return initial, softmax_cross_entropy(synchronous.forward(images[test]), labels[test])[0]
