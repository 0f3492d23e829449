"""Pipeline parallelism (GPipe, 1F1B) against serial training, each rank one stage."""
import itertools

import numpy as np
import pytest

from kernels.errors import InputError
from parallel.nn.layers import Flatten, Linear, Sequential, softmax_cross_entropy
from parallel.nn.models import forward_backward, mlp
from parallel.nn.optim import SGD
from parallel.pipeline.stage import Pipeline
from parallel.pipeline.schedule import (BACKWARD, FORWARD, SCHEDULES, bubble_fraction, idle_fraction,
                                        layer_parameter_count, partition, replay, stage_schedule, theoretical_bubble)
from tests.mpitools import all_ranks

SIZES = [6, 9, 7, 8, 5, 4]  # 5 Linear and 4 ReLU layers: room for 4 stages
BATCH = 12
WIDE = 300  # 16 rows x 300 float64 = 38 KB per message


def simulate(name, stages, micro_batches, durations=None):
    """`replay` of the schedule when each action of stage ``s`` takes ``durations[s]`` (default 1)."""
    schedules = [stage_schedule(name, stages, stage, micro_batches) for stage in range(stages)]
    return replay(schedules, [[(durations or [1] * stages)[stage]] * len(schedule)
                              for stage, schedule in enumerate(schedules)])


@pytest.mark.parametrize("name", SCHEDULES)
def test_schedules_run_each_micro_batch_once_without_deadlock_and_reach_the_ideal_bubble(name):
    for stages, micro_batches in itertools.product(range(1, 6), range(1, 8)):
        for stage in range(stages):
            actions = stage_schedule(name, stages, stage, micro_batches)
            assert sorted(actions) == sorted([(kind, i) for kind in (FORWARD, BACKWARD) for i in range(micro_batches)])
            assert all(actions.index((FORWARD, i)) < actions.index((BACKWARD, i)) for i in range(micro_batches))
            in_flight = np.cumsum([1 if kind == FORWARD else -1 for kind, _ in actions])
            expected = micro_batches if name == "gpipe" else min(stages - stage, micro_batches)
            assert in_flight.max() == expected
        clocks = simulate(name, stages, micro_batches)
        ideal = theoretical_bubble(stages, micro_batches)
        for share in (bubble_fraction, idle_fraction):
            assert share([2 * micro_batches] * stages, clocks) == pytest.approx(ideal)


@pytest.mark.parametrize("name", SCHEDULES)
def test_a_slow_stage_adds_idle_time_to_the_others_but_not_to_the_bubble(name):
    for stages, micro_batches in itertools.product(range(2, 5), (4, 8, 16)):
        durations = [1.0] * stages
        durations[stages // 2] = 1.25
        clocks = simulate(name, stages, micro_batches, durations)
        compute = [2 * micro_batches * duration for duration in durations]
        bubble, idle = bubble_fraction(compute, clocks), idle_fraction(compute, clocks)
        # The slow stage idles only while the faster ones fill and drain the pipeline.
        assert bubble <= theoretical_bubble(stages, micro_batches) + 1e-12
        assert idle == pytest.approx(bubble + (max(compute) - np.mean(compute)) / max(clocks))
        assert idle > theoretical_bubble(stages, micro_batches)


def test_replay_follows_the_messages_and_refuses_schedules_that_deadlock():
    one_f_one_b = [stage_schedule("1f1b", 2, stage, 2) for stage in range(2)]
    # Stage 0 runs F0 F1 B0 B1, stage 1 F0 B0 F1 B1. Stage 1: F0 1-2 (after stage 0's F0), B0 2-4,
    # F1 4-5, B1 5-7. Stage 0: F0 0-1, F1 1-2, B0 4-7 (after stage 1's B0), B1 7-10.
    assert replay(one_f_one_b, [[1, 1, 3, 3], [1, 2, 1, 2]]) == [10, 7]
    with pytest.raises(ValueError, match="deadlock"):
        replay([[(BACKWARD, 0), (FORWARD, 0)], [(FORWARD, 0), (BACKWARD, 0)]], [[1, 1], [1, 1]])


def test_one_f_one_b_warms_up_with_p_minus_s_minus_1_forwards():
    assert stage_schedule("1f1b", 4, 1, 5)[:4] == [(FORWARD, 0), (FORWARD, 1), (FORWARD, 2), (BACKWARD, 0)]
    assert stage_schedule("1f1b", 4, 3, 2) == [(FORWARD, 0), (BACKWARD, 0), (FORWARD, 1), (BACKWARD, 1)]
    with pytest.raises(InputError, match="unknown pipeline schedule 'zb'"):
        stage_schedule("zb", 2, 0, 2)


def test_partition_by_layer_count_and_by_parameters():
    layers = mlp([2, 50, 2, 2, 3, 2], seed=0).layers  # parameter counts 150, 0, 102, 0, 6, 0, 9, 0, 8
    assert partition(layers, 4) == [(0, 3), (3, 5), (5, 7), (7, 9)]
    counts = [layer_parameter_count(layer) for layer in layers]
    for stages in range(1, len(layers) + 1):
        bounds = partition(layers, stages, balance="params")
        assert [start for start, _ in bounds] == [0] + [stop for _, stop in bounds[:-1]]
        assert bounds[-1][1] == len(layers) and all(stop > start for start, stop in bounds)
        best = min(max(sum(counts[a:b]) for a, b in zip((0,) + cuts, cuts + (len(layers),)))
                   for cuts in itertools.combinations(range(1, len(layers)), stages - 1))
        assert max(sum(counts[start:stop]) for start, stop in bounds) == best


def test_partition_rejects_more_stages_than_layers_and_unknown_balances():
    layers = mlp([3, 4, 2], seed=0).layers
    with pytest.raises(InputError, match="4 stages needs at least 4 layers"):
        partition(layers, 4)
    with pytest.raises(InputError, match="unknown pipeline balance"):
        partition(layers, 2, balance="flops")


def batches():
    rng = np.random.default_rng(3)
    return [(rng.standard_normal((BATCH, SIZES[0])), rng.integers(0, SIZES[-1], BATCH)) for _ in range(2)]


def build_pipeline(comm, micro_batches, name, balance="layers"):
    layers = mlp(SIZES, seed=1, dtype=np.float64).layers
    start, stop = partition(layers, comm.size, balance)[comm.rank]
    return Pipeline(comm, layers[start:stop], (SIZES[0],), micro_batches, name, np.float64), (start, stop)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("micro_batches, balance", [(1, "layers"), (3, "params"), (4, "layers"), (6, "params")])
def test_training_steps_equal_serial_steps(comm, name, micro_batches, balance):
    pipeline, (start, stop) = build_pipeline(comm, micro_batches, name, balance)
    optimizer = SGD(pipeline.parameters(), lr=0.1, momentum=0.9)
    serial = mlp(SIZES, seed=1, dtype=np.float64)
    serial_optimizer = SGD(serial.parameters(), lr=0.1, momentum=0.9)
    mine = [pair for layer in serial.layers[start:stop] for pair in layer.parameters()]
    for x, y in batches():
        serial_loss = forward_backward(serial, softmax_cross_entropy, x, y)
        loss = comm.allreduce(pipeline.compute_gradients(x, y))
        assert loss == pytest.approx(serial_loss, rel=1e-12)
        grads_match = all(np.allclose(got, want, rtol=1e-11, atol=1e-13)
                          for (_, got), (_, want) in zip(pipeline.parameters(), mine))
        assert all_ranks(comm, grads_match)
        optimizer.step()
        serial_optimizer.step()
        weights_match = all(np.allclose(got, want, rtol=1e-11, atol=1e-13)
                            for (got, _), (want, _) in zip(pipeline.parameters(), mine))
        assert all_ranks(comm, weights_match)


def view_stages(stages):
    """One layer per stage: Linear on even stages, Flatten (whose output views its input) on odd ones."""
    return [Flatten() if stage % 2 else Linear(WIDE, WIDE, rng=stage, dtype=np.float64) for stage in range(stages)]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", SCHEDULES)
def test_stages_that_pass_views_of_received_buffers_on_train_like_the_serial_model(comm, name):
    # Flatten sends (and returns as gradient) views of the buffers it received: those
    # buffers stay out of the receive pool, and the others are reused over three steps.
    layers = view_stages(comm.size)
    pipeline = Pipeline(comm, layers[comm.rank:comm.rank + 1], (WIDE,), 4, name, np.float64)
    serial = Sequential(view_stages(comm.size))
    rng = np.random.default_rng(5)
    for _ in range(3):
        x, y = rng.standard_normal((64, WIDE)), rng.integers(0, WIDE, 64)
        loss = comm.allreduce(pipeline.compute_gradients(x, y))
        assert loss == pytest.approx(forward_backward(serial, softmax_cross_entropy, x, y), rel=1e-12)
        mine = serial.layers[comm.rank].parameters()
        assert all_ranks(comm, all(np.allclose(got, want, rtol=1e-12)
                                   for (_, got), (_, want) in zip(pipeline.parameters(), mine)))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", SCHEDULES)
def test_activations_in_flight_and_timeline(comm, name):
    micro_batches = 4
    pipeline, _ = build_pipeline(comm, micro_batches, name)
    x, y = batches()[0]
    pipeline.compute_gradients(x, y)
    stages, stage = comm.size, comm.rank
    expected = micro_batches if name == "gpipe" else min(stages - stage, micro_batches)
    assert all_ranks(comm, pipeline.peak_in_flight == expected)
    assert all_ranks(comm, pipeline.peak_in_flight <= (micro_batches if name == "gpipe" else stages - stage))
    assert all_ranks(comm, pipeline.peak_activation_bytes > 0)
    timeline = pipeline.timeline
    assert sorted(timeline) == ["allreduce", "compute", "send", "step", "wait"]
    parts = timeline["compute"] + timeline["send"] + timeline["wait"] + timeline["allreduce"]
    assert all_ranks(comm, 0 < parts <= timeline["step"] and timeline["allreduce"] == 0)
    assert all_ranks(comm, timeline["wait"] == 0 or stages > 1)
    seconds = pipeline.action_seconds
    assert all_ranks(comm, len(seconds) == len(pipeline.actions) and 0 < sum(seconds) <= timeline["compute"])


@pytest.mark.mpi(min_size=1)
def test_bad_micro_batch_counts_and_empty_stages_are_input_errors(comm):
    pipeline, _ = build_pipeline(comm, 5, "1f1b")
    x, y = batches()[0]
    with pytest.raises(InputError, match="a batch of 12 samples does not split into 5 equal micro-batches"):
        pipeline.compute_gradients(x, y)
    with pytest.raises(InputError, match="does not split into 5"):
        pipeline.compute_gradients(x[:3], y[:3])
    with pytest.raises(InputError, match="12 samples but 11 labels"):
        pipeline.compute_gradients(x, y[:11])
    layers = mlp(SIZES, seed=1, dtype=np.float64).layers
    with pytest.raises(InputError, match=f"stage {comm.size - 1} of {comm.size} has no layer"):
        Pipeline(comm, [] if comm.rank == comm.size - 1 else layers[:1], (SIZES[0],), 2)
    with pytest.raises(InputError, match="micro_batches must be an integer >= 1"):
        Pipeline(comm, layers, (SIZES[0],), 0)
