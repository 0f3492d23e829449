"""Suite ``pp``: pipeline-parallel training steps (parallel.pipeline.stage), GPipe and 1F1B.

Each rank is one stage of an MLP of ``L`` linear layers of width ``W`` (``W``
inputs, ``W`` classes, ReLU between layers: ``2 L - 1`` layers, so at most that
many ranks), split by `parallel.pipeline.schedule.partition`. One run is one training step
(the schedule's forwards and backwards, then plain SGD, lr 0.01) on a fixed
synthetic global batch of ``size`` samples (standard normal inputs, uniform
labels) cut into ``m`` micro-batches; ``size`` must be a multiple of ``m``.

Settings (`SETTINGS`): micro-batches ``m`` per step, layer width ``W``, linear
layers ``L``, and the balance: ``layers`` (`block_range` of the layer count) or
``params`` (balance the stages' parameter counts).

Recorded: items_per_s (samples per second); metric ``bubble``, the measured bubble
``1 - max_r compute_r / max_r step_r`` (idle share of the busiest stage: the
schedule's fill and drain) of each run, median over the point's runs; params:
``theoretical_bubble`` ``(p - 1) / (m + p - 1)``, ``replayed_bubble`` (the bubble
of the same schedule replayed with each action's measured compute seconds and free
messages, median over the runs: its gap to ``bubble`` is what messages and
overheads add on the critical path; its gap to the theory, what unequal and
varying stage times add), ``idle_fraction`` ``1 - sum_r compute_r / (p max_r
step_r)`` (all stages: the bubble plus what unequal stages cost) and
``stage_imbalance`` ``max_r compute_r / mean_r compute_r - 1`` from the mean
seconds per step, the settings, ``stage_layers`` (layers per stage),
``peak_in_flight`` and ``peak_activation_mib`` per stage (micro-batches whose
activations are held at once, and their bytes; most over the timed runs), and per rank the mean seconds per
step in ``compute_s``, ``send_s``, ``wait_s`` and ``step_s`` (see `parallel.pipeline.stage`).

Check: the weights go back to where the point started (the seed), one more
pipeline step runs on the first ``n'`` samples of the batch, and every weight is
compared with one serial SGD step on the same samples (on rank 0, then one
``Bcast``). ``n' = size`` up to `CHECK_SAMPLES` samples; above, a sample of the
batch, ``m * (CHECK_SAMPLES // m)`` samples (at least ``m``), so that the serial
reference stays cheap for big sizes. Tolerance ``rtol`` float64 1e-9, float32 1e-3,
``atol = rtol * max |w|``.
"""
import math
from dataclasses import dataclass, field

import numpy as np

from bench.case import Case, Metrics
from bench.families.training import (CHECK_SAMPLES, LEARNING_RATE, SEED, check_samples, count_wrong, restore,
                                     serial_step_parameters, synthetic_batch)
from bench.settings import Setting, choice, integer
from kernels.errors import InputError
from parallel.nn.models import mlp
from parallel.nn.optim import SGD
from parallel.pipeline.stage import Pipeline
from parallel.pipeline.schedule import BALANCES, SCHEDULES, bubble_fraction, idle_fraction, partition, theoretical_bubble
from parallel.pipeline.timeline import Timeline


@dataclass
class _State:
    comm: object
    dtype: str
    size: int
    schedule: str
    pipeline: Pipeline
    optimizer: SGD
    data: tuple
    initial: list
    offset: int
    stage_layers: list
    timeline: Timeline = field(default_factory=Timeline)


SETTINGS = (
    Setting("PP_MICROBATCHES", integer, 8, 1, "micro-batches m per step (the global batch is a multiple of m)"),
    Setting("PP_WIDTH", integer, 1024, 1, "layer width W"),
    Setting("PP_LAYERS", integer, 8, 1, "linear layers L (2 L - 1 layers with the ReLUs: at most that many ranks)"),
    Setting("PP_BALANCE", choice, "layers", BALANCES, "stage split: by layer count or by parameter count"),
)


class PipelineSuite(Case):
    name = "pp"
    benchmark = "pipeline"
    variants = SCHEDULES
    size_unit = "samples"
    size_help = "global batch in samples (weak: per rank), a multiple of PP_MICROBATCHES; one run = one training step"
    default_sizes = "64:512"
    metrics_help = ("items_per_s = samples/s; metric bubble (measured: idle share of the busiest stage); params: "
                    "theoretical_bubble, replayed_bubble (free messages), idle_fraction (all stages), stage_imbalance, "
                    "peak_in_flight and peak_activation_mib per stage, compute_s / send_s / wait_s / step_s per rank")
    dtypes = ("float32", "float64")

    description = ("Pipeline-parallel training steps of a deep MLP, one stage per rank, under the GPipe and 1F1B "
                   "schedules with point-to-point messages between stages. The metric is the measured bubble (the "
                   "idle share of the busiest stage), beside the theoretical (p - 1) / (m + p - 1) and a replay of "
                   "the schedule with free messages; the check compares the weights after a step with serial SGD.")
    declared_settings = SETTINGS

    def __init__(self, settings=None):
        super().__init__(settings)
        self.micro_batches, self.width, self.layers, self.balance = (self.settings[s.name] for s in SETTINGS)

    def check_ranks(self, ranks, variant):
        if ranks > 2 * self.layers - 1:
            raise InputError(f"pp: {ranks} stages need at least {ranks} layers; MLSCALE_PP_LAYERS="
                             f"{self.layers} gives {2 * self.layers - 1} (linear and ReLU)")

    def iterations(self, size):
        return 5, 1

    def setup(self, comm, size, variant, backend, dtype):
        if backend.name != "numpy":
            raise InputError("suite 'pp' runs on the numpy backend only")
        self.check_ranks(comm.size, variant)
        m = self.micro_batches
        if size < m or size % m:
            raise InputError(f"pp: the global batch ({size}) must be a multiple of MLSCALE_PP_MICROBATCHES={m}")
        layers = self._build(dtype).layers
        bounds = partition(layers, comm.size, self.balance)
        start, stop = bounds[comm.rank]
        stage = Pipeline(comm, layers[start:stop], (self.width,), m, variant, dtype)
        optimizer = SGD(stage.parameters(), lr=LEARNING_RATE)
        offset = sum(param.size for layer in layers[:start] for param, _ in layer.parameters())
        return _State(comm, dtype, size, variant, stage, optimizer,
                      synthetic_batch(size, self.width, self.width, dtype),
                      [param.copy() for param, _ in stage.parameters()], offset,
                      [stop - start for start, stop in bounds])

    def _build(self, dtype):
        return mlp([self.width] * (self.layers + 1), SEED, np.dtype(dtype))

    def run(self, state):
        state.pipeline.train_step(state.optimizer, *state.data)
        stage = state.pipeline
        state.timeline.add(stage.timeline, peak_in_flight=stage.peak_in_flight,
                           peak_activation_bytes=stage.peak_activation_bytes, actions=list(stage.action_seconds))

    def check(self, state):
        stage = state.pipeline
        restore(stage.parameters(), state.initial)
        n = check_samples(state.size, self.micro_batches)
        x, y = state.data[0][:n], state.data[1][:n]
        stage.train_step(state.optimizer, x, y)
        expected = serial_step_parameters(state.comm, lambda: self._build(state.dtype), x, y, state.dtype)
        mine = [param for param, _ in stage.parameters()]
        count = sum(param.size for param in mine)
        return count_wrong(mine, [expected[state.offset:state.offset + count]], state.dtype)

    def metrics(self, state, seconds):
        """Rates of the point; collective (one allgather), as the harness calls it on every rank."""
        return Metrics(items_per_s=state.size / seconds if seconds > 0 else math.nan, metric="bubble",
                       metric_value=state.timeline.idle_share(state.comm, bubble_fraction))

    def params(self, state):
        """Settings and per-stage figures (collective: one allgather)."""
        timeline = state.timeline
        per_rank = state.comm.allgather((timeline.largest("peak_in_flight"),
                                         timeline.largest("peak_activation_bytes") / 2 ** 20,
                                         timeline.per_step("compute"), timeline.per_step("send"),
                                         timeline.per_step("wait"), timeline.per_step("step")))
        columns = list(zip(*per_rank))
        compute, steps = columns[2], columns[5]
        return {"schedule": state.schedule, "micro_batches": self.micro_batches, "width": self.width,
                "layers": self.layers, "balance": self.balance, "stage_layers": state.stage_layers,
                "theoretical_bubble": round(theoretical_bubble(state.comm.size, self.micro_batches), 4),
                "peak_in_flight": list(columns[0]),
                "peak_activation_mib": [round(value, 3) for value in columns[1]],
                "compute_s": [round(value, 6) for value in columns[2]],
                "send_s": [round(value, 6) for value in columns[3]],
                "wait_s": [round(value, 6) for value in columns[4]],
                "step_s": [round(value, 6) for value in steps], "steps": timeline.steps,
                "idle_fraction": round(idle_fraction(compute, steps), 4),
                "replayed_bubble": round(timeline.replayed_bubble(state.comm, state.pipeline.actions), 4),
                "stage_imbalance": round(max(compute) * len(compute) / sum(compute) - 1, 4)}

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """The whole model with gradients (every rank builds it, then keeps its stage and a copy of
        it), the batch (``n x W``, drawn in float64) and the stage's activations of every
        micro-batch; the check's serial step (rank 0) builds the model again and runs at most
        `CHECK_SAMPLES` samples."""
        width, layers = self.width, self.layers
        stage_layers = -(-(2 * layers - 1) // ranks)
        run = 4 * layers * width * width + problem * width * (1 + 2 * stage_layers)
        reference = 6 * layers * width * width + 4 * layers * CHECK_SAMPLES * width
        return np.dtype(dtype).itemsize * (run + (reference if check else 0)) + 8 * problem * width
