"""Suite ``pp``: pipeline-parallel training steps (parallel.pipeline), GPipe, 1F1B and PipeDream.

Each rank is one stage of a model split by `parallel.pipeline.schedule.partition`:
``PP_MODEL=mlp``, an MLP of ``L`` linear layers of width ``W`` (``W`` inputs, ``W``
classes, ReLU between layers: ``2 L - 1`` layers, so at most that many ranks) on a
fixed synthetic batch (standard normal inputs, uniform labels); or ``PP_MODEL=cnn``,
the lectures' SimpleCNN (`parallel.nn.models.mnist_cnn`: conv 1->10 k5, pool, ReLU,
conv 10->20 k5, pool, ReLU | flatten, fc 320->50, ReLU, fc 50->10; 10 layers) on
MNIST images (the 5,000-image sample, shuffled). One run is one training step on a
global batch of ``size`` samples cut into ``m`` micro-batches (a multiple of ``m``),
plain SGD, lr 0.01. ``gpipe`` and ``1f1b`` flush: one update per step from the
batch's mean gradient. ``pipedream`` (`parallel.pipeline.pipedream`) never flushes:
``m`` micro-batches enter per run and every stage updates after every backward
micro-batch (the micro-batch's mean gradient) with weight stashing; the first run
fills the pipeline, later runs are its steady state.

Settings (`bench.models.pp.SETTINGS`): micro-batches ``m`` per step (``PP_MICROBATCHES=1`` is the
lecture's naive model parallelism: one stage busy at a time), the model, layer width
``W`` and linear layers ``L`` (mlp), and the balance: ``layers`` (`block_range` of the
layer count), ``params`` (balance the stages' parameter counts), ``time`` (balance the
stages' seconds: each layer's forward plus backward on one micro-batch, measured on
rank 0, median of 3, broadcast, then the contiguous split minimising the largest
stage) or ``parts`` (the lecture's ModelPart1 = the convolutions, ModelPart2 = the
dense layers; cnn on 2 ranks). Default: ``layers`` for mlp; for cnn ``parts`` on 2
ranks, else ``time``.

Recorded: items_per_s (samples per second); gflops, the flops of the whole model's forward and
backward on the batch (`bench.models.flops`) per second, and ``gflops_per_rank`` (over the stages) in
params; metric ``bubble``, the measured bubble
``1 - max_r compute_r / max_r step_r`` (idle share of the busiest stage: the
schedule's fill and drain) of each run, median over the point's runs; params:
``theoretical_bubble`` ``(p - 1) / (m + p - 1)`` (0 for pipedream: its steady state),
``replayed_bubble`` (the bubble of the same schedule replayed with each action's
measured compute seconds and free messages, median over the runs: its gap to
``bubble`` is what messages and overheads add on the critical path; its gap to the
theory, what unequal and varying stage times add), ``idle_fraction`` ``1 - sum_r
compute_r / (p max_r step_r)`` (all stages: the bubble plus what unequal stages cost)
and ``stage_imbalance`` ``max_r compute_r / mean_r compute_r - 1`` from the mean
seconds per step, the settings, ``stage_layers`` and ``stage_params`` (layers and
parameters per stage), ``peak_in_flight`` and ``peak_activation_mib`` per stage
(micro-batches whose activations are held at once, and their bytes; most over the
timed runs), for pipedream ``staleness`` (most weight versions between a
micro-batch's forward and its backward, per stage: ``p - s - 1`` in the steady state)
and ``stash_mib`` (most stashed weight copies at once, per stage), and per rank the
mean seconds per step in ``compute_s``, ``send_s``, ``wait_s`` and ``step_s`` (see
`parallel.pipeline.stage`).

Check: the weights go back to where the point started (the seed; pipedream first
drains), one more step runs on the first ``n'`` samples of the batch (pipedream:
then drains), and every weight is compared with the serial reference on the same
samples (on rank 0, then one ``Bcast``): one serial SGD step for gpipe and 1f1b; for
pipedream `parallel.pipeline.pipedream.serial_pipedream`, which replays the schedule
serially (each micro-batch's gradient at the weight versions its forward used on
each stage, applied as that stage's update). ``n' = size`` up to `CHECK_SAMPLES`
samples; above, ``m * (CHECK_SAMPLES // m)`` samples (at least ``m``), so that the
serial reference stays cheap for big sizes. Tolerance ``rtol`` float64 1e-9, float32
1e-3, ``atol = rtol * max |w|``.

On ``--backend cupy`` each stage's layers (moved with ``Layer.to``), the batch, the
message buffers, PipeDream's weight stashes and the optimiser state live on the
device; the stages talk through ``backend.comm(comm)`` (staged without a
CUDA-aware MPI). The ``time`` balance measures the layers on the host (rank 0).
"""
import math
from dataclasses import dataclass, field

import numpy as np

from bench.case import Case, Metrics
from bench.models import flops
from bench.families.training import (LEARNING_RATE, SEED, check_samples, count_wrong, mnist_batch,
                                     restore, serial_step_parameters, synthetic_batch)
from bench.models.pp import PipelineModel
from kernels.errors import InputError
from parallel.nn.layers import softmax_cross_entropy
from parallel.nn.models import flat_storage, mlp, mnist_cnn
from parallel.nn.optim import SGD
from parallel.pipeline.pipedream import PipeDream, serial_pipedream
from parallel.pipeline.stage import Pipeline
from parallel.pipeline.schedule import (PIPEDREAM, bubble_fraction, idle_fraction, layer_parameter_count,
                                        layer_seconds, partition, theoretical_bubble)
from parallel.pipeline.timeline import Timeline

#: The lecture's split of the SimpleCNN: ModelPart1 (convolutions, pools, ReLUs) | ModelPart2 (dense layers).
CNN_PARTS = [(0, 6), (6, 10)]


@dataclass
class _State:
    comm: object
    backend: object
    dtype: str
    size: int
    schedule: str
    pipeline: Pipeline
    optimizer: SGD
    data: tuple
    initial: list
    offset: int
    bounds: list
    stage_params: list
    flops: int
    timeline: Timeline = field(default_factory=Timeline)
    gflops_per_rank: float = math.nan


class PipelineSuite(Case):
    model_class = PipelineModel
    benchmark = "pipeline"
    size_help = "global batch in samples (weak: per rank), a multiple of PP_MICROBATCHES; one run = one training step"
    default_sizes = "64:512"
    metrics_help = ("items_per_s = samples/s; gflops (params gflops_per_rank); metric bubble (measured: idle share of the busiest stage); params: "
                    "theoretical_bubble, replayed_bubble (free messages), idle_fraction (all stages), stage_imbalance, "
                    "stage_params, peak_in_flight and peak_activation_mib per stage, staleness and stash_mib per stage "
                    "(pipedream), compute_s / send_s / wait_s / step_s per rank")
    dtypes = ("float32", "float64")

    description = ("Pipeline-parallel training steps of a deep MLP or the lecture's SimpleCNN on MNIST, one stage "
                   "per rank, under the GPipe, 1F1B and PipeDream (no flush, weight stashing) schedules with "
                   "point-to-point messages between stages. The metric is the measured bubble (the idle share of the "
                   "busiest stage), beside the theoretical (p - 1) / (m + p - 1) and a replay of the schedule with free "
                   "messages; the check compares the weights after a step with serial SGD (PipeDream: with a serial "
                   "replay of its schedule).")

    def __init__(self, settings=None):
        super().__init__(settings)
        self.micro_batches, self.network, self.width, self.layers = (
            self.model.micro_batches, self.model.network, self.model.width, self.model.layers)

    def iterations(self, size):
        return 5, 1

    def setup(self, comm, size, variant, backend, dtype):
        self.check_ranks(comm.size, variant)
        m = self.micro_batches
        if size < m or size % m:
            raise InputError(f"pp: the global batch ({size}) must be a multiple of MLSCALE_PP_MICROBATCHES={m}")
        layers = self._build(dtype).layers
        bounds = self._partition(comm, layers, size // m, dtype)
        start, stop = bounds[comm.rank]
        shape = (1, 28, 28) if self.network == "cnn" else (self.width,)
        step_flops = flops.step(layers, shape, size)  # every stage's layers on the whole batch
        mine = [layer.to(backend) for layer in layers[start:stop]]
        stage_comm = backend.comm(comm)
        stage = (PipeDream(stage_comm, mine, shape, m, dtype) if variant == PIPEDREAM
                 else Pipeline(stage_comm, mine, shape, m, variant, dtype))
        optimizer = SGD(stage.parameters(), lr=LEARNING_RATE)
        offset = sum(param.size for layer in layers[:start] for param, _ in layer.parameters())
        data = tuple(backend.from_host(part) for part in self._data(size, dtype))
        return _State(comm, backend, dtype, size, variant, stage, optimizer, data,
                      [param.copy() for param, _ in stage.parameters()], offset, bounds,
                      [sum(layer_parameter_count(layer) for layer in layers[a:b]) for a, b in bounds], step_flops)

    def _partition(self, comm, layers, rows, dtype):
        balance = self.model.balance_on(comm.size)
        if balance == "parts":
            return list(CNN_PARTS)
        costs = None
        if balance == "time":
            shape = (1, 28, 28) if self.network == "cnn" else (self.width,)
            costs = comm.bcast(layer_seconds(layers, shape, rows, dtype, softmax_cross_entropy)
                               if comm.rank == 0 else None, root=0)
        return partition(layers, comm.size, balance, costs)

    def _data(self, size, dtype):
        """The batch of ``size`` samples (host arrays, the same on every rank)."""
        if self.network == "cnn":
            return mnist_batch(size, dtype)
        return synthetic_batch(size, self.width, self.width, dtype)

    def _build(self, dtype):
        if self.network == "cnn":
            return mnist_cnn(SEED, np.dtype(dtype))
        return mlp([self.width] * (self.layers + 1), SEED, np.dtype(dtype))

    def run(self, state):
        stage = state.pipeline
        stage.train_step(state.optimizer, *state.data)
        extra = {}
        if state.schedule == PIPEDREAM:
            extra = dict(schedule=list(stage.actions), staleness=max(stage.staleness, default=0),
                         stash_bytes=stage.peak_stash_bytes)
        state.timeline.add(stage.timeline, peak_in_flight=stage.peak_in_flight,
                           peak_activation_bytes=stage.peak_activation_bytes, actions=list(stage.action_seconds),
                           **extra)

    def check(self, state):
        stage, comm = state.pipeline, state.comm
        pipedream = state.schedule == PIPEDREAM
        if pipedream:
            stage.drain()
        restore(stage.parameters(), state.initial)
        n = check_samples(state.size, self.micro_batches)
        stage.train_step(state.optimizer, state.data[0][:n], state.data[1][:n])
        x, y = (part[:n] for part in self._data(state.size, state.dtype))
        if pipedream:
            stage.drain()
            expected = self._serial_pipedream(comm, state, x, y)
        else:
            expected = serial_step_parameters(comm, lambda: self._build(state.dtype), x, y, state.dtype)
        mine = [state.backend.to_host(param) for param, _ in stage.parameters()]
        count = sum(param.size for param in mine)
        return count_wrong(mine, [expected[state.offset:state.offset + count]], state.dtype)

    def _serial_pipedream(self, comm, state, x, y):
        """The flat parameters after `serial_pipedream` of the check's stream, on every rank (rank 0, Bcast)."""
        flat = None
        if comm.rank == 0:
            model = self._build(state.dtype)
            flat, _ = flat_storage(model)
            serial_pipedream(model.layers, state.bounds, x, y, self.micro_batches, LEARNING_RATE)
        count = comm.bcast(None if flat is None else flat.size, root=0)
        flat = np.empty(count, state.dtype) if flat is None else flat
        comm.Bcast(flat, root=0)
        return flat

    def metrics(self, state, seconds):
        """Rates of the point; collective (one allgather), as the harness calls it on every rank."""
        gflops, state.gflops_per_rank = flops.per_rank(state.flops, seconds, state.comm.size)
        return Metrics(gflops=gflops, items_per_s=state.size / seconds if seconds > 0 else math.nan, metric="bubble",
                       metric_value=state.timeline.idle_share(state.comm, bubble_fraction))

    def params(self, state):
        """Settings and per-stage figures (collective: one or two allgathers)."""
        timeline, comm = state.timeline, state.comm
        per_rank = comm.allgather((timeline.largest("peak_in_flight"),
                                   timeline.largest("peak_activation_bytes") / 2 ** 20,
                                   timeline.per_step("compute"), timeline.per_step("send"),
                                   timeline.per_step("wait"), timeline.per_step("step")))
        columns = list(zip(*per_rank))
        compute, steps = columns[2], columns[5]
        pipedream = state.schedule == PIPEDREAM
        result = {"schedule": state.schedule, "micro_batches": self.micro_batches, "model": self.network,
                  "balance": self.model.balance_on(comm.size), "stage_layers": [b - a for a, b in state.bounds],
                  "stage_params": state.stage_params, "gflops_per_rank": state.gflops_per_rank,
                  "theoretical_bubble":
                      0.0 if pipedream else round(theoretical_bubble(comm.size, self.micro_batches), 4),
                  "peak_in_flight": list(columns[0]),
                  "peak_activation_mib": [round(value, 3) for value in columns[1]],
                  "compute_s": [round(value, 6) for value in columns[2]],
                  "send_s": [round(value, 6) for value in columns[3]],
                  "wait_s": [round(value, 6) for value in columns[4]],
                  "step_s": [round(value, 6) for value in steps], "steps": timeline.steps,
                  "idle_fraction": round(idle_fraction(compute, steps), 4),
                  "replayed_bubble": round(timeline.replayed_bubble(comm, state.pipeline.actions), 4),
                  "stage_imbalance": round(max(compute) * len(compute) / sum(compute) - 1, 4)}
        if self.network == "mlp":
            result.update(width=self.width, layers=self.layers)
        if pipedream:
            stash = comm.allgather((timeline.largest("staleness"), timeline.largest("stash_bytes") / 2 ** 20))
            result.update(staleness=[value for value, _ in stash], stash_mib=[round(value, 3) for _, value in stash])
        return result
