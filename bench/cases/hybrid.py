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

Settings (`bench.models.hybrid.SETTINGS`): the grid of variant ``grid``, block widths and count
(``blocks >= pp``, ``ffn >= tp``), micro-batches per replica and step, the
pipeline schedule, and the algorithm of the tp blocks' allreduce (``HYBRID_COLLECTIVES``: MPI's or a
hand-written family of `parallel.tensor.exchange`).

Recorded: items_per_s (samples per second); gflops, the serial model's forward and backward on the
batch (`bench.models.flops`) per second over every rank, and ``gflops_per_rank`` in params; metric
``comm_share``: ``1 - sum_r
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
from dataclasses import dataclass, field

import numpy as np

from bench.case import Case, Metrics
from bench.models import flops
from bench.families.training import (LEARNING_RATE, SEED, check_samples, count_wrong, restore, serial_step_parameters,
                                     synthetic_batch)
from bench.models.hybrid import HybridModel, grid_for
from parallel.hybrid import HybridTrainer, serial_model
from parallel.nn.models import flat_storage
from parallel.nn.optim import SGD
from parallel.pipeline.schedule import theoretical_bubble
from parallel.pipeline.timeline import Timeline


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
    flops: int
    timeline: Timeline = field(default_factory=Timeline)
    gflops_per_rank: float = math.nan


class Hybrid(Case):
    model_class = HybridModel
    benchmark = "hybrid"
    size_help = "global batch in samples (weak: per rank); each replica's shard a multiple of the micro-batches"
    default_sizes = "64:512"
    metrics_help = ("items_per_s = samples/s; gflops (params gflops_per_rank); metric comm_share (communication and bubble share of the step); "
                    "params: dp, tp, pp, compute_s / tensor_s / send_s / wait_s / allreduce_s per rank")
    dtypes = ("float32", "float64")

    description = ("Training steps of a stack of Megatron MLP blocks on a dp x tp x pp grid of the ranks: tensor "
                   "parallelism inside each block, a pipeline between stages of blocks, and a gradient allreduce "
                   "over the data-parallel replicas. The variants put every rank on one axis, factor the ranks "
                   "over two or three axes, or take an explicit grid; the check compares with serial SGD.")

    def __init__(self, settings=None):
        super().__init__(settings)
        model = self.model
        self.grid, self.hidden, self.ffn, self.blocks, self.micro_batches, self.schedule, self.collectives = (
            model.grid, model.hidden, model.ffn, model.blocks, model.micro_batches, model.schedule,
            model.collectives)

    def iterations(self, size):
        return 5, 1

    def teardown(self, state):
        state.trainer.free()

    def setup(self, comm, size, variant, backend, dtype):
        dp, tp, pp = grid_for(variant, comm.size, self.grid)
        trainer = HybridTrainer(backend.comm(comm), dp, tp, pp, self.hidden, self.ffn, self.blocks,
                                self.micro_batches, self.schedule, SEED, dtype, backend, self.collectives)
        trainer.check_batch(size)
        optimizer = SGD(trainer.parameters(), lr=LEARNING_RATE)
        data = tuple(backend.from_host(part) for part in synthetic_batch(size, self.hidden, self.hidden, dtype))
        model = serial_model(self.hidden, self.ffn, self.blocks, SEED, np.dtype(dtype))  # the layers' shapes
        return _State(comm, backend, dtype, size, trainer, optimizer, data,
                      [param.copy() for param, _ in trainer.parameters()], flops.step(model, (self.hidden,), size))

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
        gflops, state.gflops_per_rank = flops.per_rank(state.flops, seconds, state.comm.size)
        return Metrics(gflops=gflops, items_per_s=state.size / seconds if seconds > 0 else math.nan,
                       metric="comm_share", metric_value=share)

    def params(self, state):
        """Grid, settings and per-rank seconds per step (collective: one allgather)."""
        dp, tp, pp = state.trainer.shape
        kinds = ("compute", "tensor", "send", "wait", "allreduce")
        per_rank = state.comm.allgather([round(state.timeline.per_step(kind), 6) for kind in kinds])
        summary = {"dp": dp, "tp": tp, "pp": pp, "hidden": self.hidden, "ffn": self.ffn, "blocks": self.blocks,
                   "micro_batches": self.micro_batches, "schedule": self.schedule, "steps": state.timeline.steps,
                   "theoretical_bubble": round(theoretical_bubble(pp, self.micro_batches), 4),
                   "gflops_per_rank": state.gflops_per_rank}
        summary.update({f"{kind}_s": list(column) for kind, column in zip(kinds, zip(*per_rank))})
        return summary
