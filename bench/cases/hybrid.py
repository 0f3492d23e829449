"""Suite ``hybrid``: data x tensor x pipeline parallel training steps (parallel.hybrid).

The model is a stack of Megatron MLP blocks ``hidden -> ffn -> hidden``, with the
last block's outputs as ``hidden`` class logits. One run is one training step
(schedule, gradient allreduce over the replicas, plain SGD, lr 0.01) on a fixed
synthetic global batch of ``size`` samples (standard normal inputs, uniform labels);
the ``dp`` replicas take `block_range` shards, each a multiple of the micro-batches.

Variants name the axes that share the ranks: ``dp``, ``tp``, ``pp`` put every rank
on that axis; ``dp_tp``, ``dp_pp``, ``tp_pp`` and ``dp_tp_pp`` factor the rank count
with ``MPI_Dims_create`` into one factor per named axis (larger factors first, in
the name's order), each at least 2; ``grid`` reads the shape from the setting
``HYBRID_GRID``. A shape that cannot fit the rank count is an `InputError`
(the sweep skips it when the variants were not named).

Settings (`SETTINGS`): the grid of variant ``grid``, block widths and count
(``blocks >= pp``, ``ffn >= tp``), micro-batches per replica and step, and the
pipeline schedule.

Recorded: items_per_s (samples per second); metric ``comm_share``: ``1 - sum_r
busy_r / (P max_r step_r)`` over all ``P`` ranks, ``busy`` being computation
without the tensor-parallel allreduces (so the share covers tensor, pipeline and
data-parallel communication and the pipeline bubble) of each run, median over the
point's runs; params: ``dp``, ``tp``, ``pp``, the settings, ``theoretical_bubble``
of the pipeline axis, and per rank the mean seconds per step in ``compute_s``
(tensor allreduces included), ``tensor_s``, ``send_s``, ``wait_s`` (pipeline) and
``allreduce_s`` (data parallel).

On ``--backend cupy`` the blocks (moved with ``Layer.to``), the batch, the
pipeline buffers and the optimiser state live on the device; every communicator
of the grid comes from ``backend.comm(comm)`` (staged without a CUDA-aware MPI).

Check: as in suite ``pp``: the weights go back to the seed, one more step runs on
the first ``n'`` samples (``size`` up to 256, else a multiple of ``dp * m``), and
every rank's shard of every weight is compared with one serial SGD step (rank 0,
one ``Bcast``).
"""
import functools
import math
import re
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from bench.case import Case, Metrics
from bench.families import costs
from bench.families.training import (LEARNING_RATE, SEED, check_samples, count_wrong, restore, serial_step_parameters,
                                     synthetic_batch)
from bench.settings import Setting, choice, integer
from kernels.errors import InputError
from parallel.hybrid import AXES, HybridTrainer, check_grid, serial_model
from parallel.nn.models import flat_storage
from parallel.nn.optim import SGD
from parallel.pipeline.schedule import SCHEDULES, theoretical_bubble
from parallel.pipeline.timeline import Timeline

GRID_PATTERN = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*x\s*(\d+)\s*$", re.IGNORECASE)


def parse_grid(text):
    """``(dp, tp, pp)`` from ``DPxTPxPP`` text such as ``2x1x2``."""
    match = GRID_PATTERN.match(text)
    if not match or min(int(value) for value in match.groups()) < 1:
        raise InputError(f"MLSCALE_HYBRID_GRID={text!r}: expected DPxTPxPP with positive integers, e.g. 2x1x2")
    return tuple(int(value) for value in match.groups())


def grid_setting(variable, text, allowed):
    """`parse_grid` of non-empty text; None for empty text."""
    return parse_grid(text) if text else None


SETTINGS = (
    Setting("HYBRID_GRID", grid_setting, None, "DPxTPxPP", "shape of variant grid, e.g. 2x1x2"),
    Setting("HYBRID_HIDDEN", integer, 512, 1, "block width"),
    Setting("HYBRID_FFN", integer, 2048, 1, "block inner width (>= tp)"),
    Setting("HYBRID_BLOCKS", integer, 4, 1, "MLP blocks (>= pp)"),
    Setting("HYBRID_MICROBATCHES", integer, 4, 1, "micro-batches per replica and step"),
    Setting("HYBRID_SCHEDULE", choice, "1f1b", SCHEDULES, "pipeline schedule"),
)


def grid_for(variant, ranks, grid=None):
    """The ``(dp, tp, pp)`` shape of ``variant`` on ``ranks`` ranks (``grid``: the shape of variant ``grid``)."""
    if variant == "grid":
        if grid is None:
            raise InputError("hybrid variant 'grid' needs MLSCALE_HYBRID_GRID=DPxTPxPP, e.g. 2x1x2")
        return grid
    named = variant.split("_")
    factors = MPI.Compute_dims(ranks, len(named))
    if len(named) > 1 and min(factors) < 2:
        raise InputError(f"hybrid {variant}: {ranks} ranks do not split over {len(named)} axes with at least "
                         f"2 ranks each")
    shape = dict(zip(named, factors))
    return tuple(shape.get(axis, 1) for axis in AXES)


@dataclass
class _State:
    comm: object
    backend: object
    dtype: str
    size: int
    trainer: HybridTrainer
    optimizer: SGD
    data: tuple
    initial: list
    timeline: Timeline = field(default_factory=Timeline)


class Hybrid(Case):
    name = "hybrid"
    benchmark = "hybrid"
    variants = ("dp", "tp", "pp", "dp_tp", "dp_pp", "tp_pp", "dp_tp_pp", "grid")
    size_unit = "samples"
    size_help = "global batch in samples (weak: per rank); each replica's shard a multiple of the micro-batches"
    default_sizes = "64:512"
    metrics_help = ("items_per_s = samples/s; metric comm_share (communication and bubble share of the step); "
                    "params: dp, tp, pp, compute_s / tensor_s / send_s / wait_s / allreduce_s per rank")
    dtypes = ("float32", "float64")

    description = ("Training steps of a stack of Megatron MLP blocks on a dp x tp x pp grid of the ranks: tensor "
                   "parallelism inside each block, a pipeline between stages of blocks, and a gradient allreduce "
                   "over the data-parallel replicas. The variants put every rank on one axis, factor the ranks "
                   "over two or three axes, or take an explicit grid; the check compares with serial SGD.")
    declared_settings = SETTINGS

    def __init__(self, settings=None):
        super().__init__(settings)
        (self.grid, self.hidden, self.ffn, self.blocks, self.micro_batches,
         self.schedule) = (self.settings[s.name] for s in SETTINGS)

    def check_ranks(self, ranks, variant):
        check_grid(ranks, *grid_for(variant, ranks, self.grid), self.hidden, self.ffn, self.blocks)

    def iterations(self, size):
        return 5, 1

    def predict(self, variant, size, ranks, calib):
        """A (dp, tp, pp) step: per micro-batch of ceil(n / dp) / m samples a stage runs its ceil(blocks / pp)
        blocks (six GEMMs of the ffn / tp shard, `costs.dense_layers`, and two tensor ``Allreduce`` of
        the block's activations); `costs.pipeline` over the stages; then the gradient allreduce over dp
        and the SGD update."""
        try:
            self.check_ranks(ranks, variant)
        except InputError:
            return None
        dp, tp, pp = grid_for(variant, ranks, self.grid)
        item, m = costs.itemsize(calib), self.micro_batches
        rows = math.ceil(math.ceil(size / dp) / m)
        blocks = math.ceil(self.blocks / pp)
        forward, backward = costs.dense_layers(calib, (self.hidden, self.ffn, self.hidden), rows, ranks, split=tp)
        tensor = 2 * costs.allreduce(calib, rows * self.hidden * item, tp) if tp > 1 else 0.0
        stage = blocks * (forward + backward + tensor)
        gradients = blocks * (2 * self.hidden * math.ceil(self.ffn / tp) + self.ffn + self.hidden) * item
        exchange = costs.allreduce(calib, gradients, dp) if dp > 1 else 0.0
        return (costs.pipeline(calib, stage, rows * self.hidden * item, m, pp) + exchange
                + costs.reduction(calib, gradients))

    def teardown(self, state):
        state.trainer.free()

    def setup(self, comm, size, variant, backend, dtype):
        dp, tp, pp = grid_for(variant, comm.size, self.grid)
        trainer = HybridTrainer(backend.comm(comm), dp, tp, pp, self.hidden, self.ffn, self.blocks,
                                self.micro_batches, self.schedule, SEED, dtype, backend)
        trainer.check_batch(size)
        optimizer = SGD(trainer.parameters(), lr=LEARNING_RATE)
        data = tuple(backend.from_host(part) for part in synthetic_batch(size, self.hidden, self.hidden, dtype))
        return _State(comm, backend, dtype, size, trainer, optimizer, data,
                      [param.copy() for param, _ in trainer.parameters()])

    def run(self, state):
        tensor_before = state.trainer.tensor_seconds()
        state.trainer.train_step(state.optimizer, *state.data)
        state.timeline.add(state.trainer.pipeline.timeline, tensor=state.trainer.tensor_seconds() - tensor_before)

    def check(self, state):
        trainer = state.trainer
        restore(trainer.parameters(), state.initial)
        n = check_samples(state.size, trainer.shape[0] * self.micro_batches)
        trainer.train_step(state.optimizer, state.data[0][:n], state.data[1][:n])
        x, y = (part[:n] for part in synthetic_batch(state.size, self.hidden, self.hidden, state.dtype))
        build = functools.partial(serial_model, self.hidden, self.ffn, self.blocks, SEED, np.dtype(state.dtype))
        expected = build()
        flat_storage(expected)[0][:] = serial_step_parameters(state.comm, build, x, y, state.dtype)
        return count_wrong([state.backend.to_host(param) for param, _ in trainer.parameters()],
                           trainer.shard_of(expected), state.dtype)

    def metrics(self, state, seconds):
        """Rates of the point; collective (one allgather), as the harness calls it on every rank."""
        share = state.timeline.idle_share(state.comm, busy=lambda run: run["compute"] - run.get("tensor", 0.0))
        return Metrics(items_per_s=state.size / seconds if seconds > 0 else math.nan, metric="comm_share",
                       metric_value=share)

    def params(self, state):
        """Grid, settings and per-rank seconds per step (collective: one allgather)."""
        dp, tp, pp = state.trainer.shape
        kinds = ("compute", "tensor", "send", "wait", "allreduce")
        per_rank = state.comm.allgather([round(state.timeline.per_step(kind), 6) for kind in kinds])
        summary = {"dp": dp, "tp": tp, "pp": pp, "hidden": self.hidden, "ffn": self.ffn, "blocks": self.blocks,
                   "micro_batches": self.micro_batches, "schedule": self.schedule, "steps": state.timeline.steps,
                   "theoretical_bubble": round(theoretical_bubble(pp, self.micro_batches), 4)}
        summary.update({f"{kind}_s": list(column) for kind, column in zip(kinds, zip(*per_rank))})
        return summary

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """This rank's shard of its stage's blocks (``blocks / pp`` blocks of ``2 hidden ffn / tp``
        weights) with gradients and copies, the batch (``n x hidden``, drawn in float64), and
        the activations of its replica's ``n / dp`` samples; the check (rank 0) builds the whole
        serial model twice (with flat copies) and steps at most 256 samples."""
        dp, tp, pp = grid_for(variant, ranks, self.grid)
        hidden, ffn = self.hidden, self.ffn
        blocks = -(-self.blocks // pp)
        run = 4 * blocks * 2 * hidden * -(-ffn // tp) + problem * hidden
        run += 2 * -(-problem // dp) * (hidden + -(-ffn // tp)) * blocks
        reference = 7 * self.blocks * 2 * hidden * ffn + 2 * 256 * (hidden + ffn) * self.blocks
        return np.dtype(dtype).itemsize * (run + (reference if check else 0)) + 8 * problem * hidden
