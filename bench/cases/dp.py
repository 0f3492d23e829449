"""Suite ``dp``: data-parallel training steps (parallel.data.data_parallel) on real images.

One run is one training step (forward, backward, gradient allreduce, SGD update)
on the next global batch of ``size`` samples, each rank taking its `block_range`
shard. Batches walk through the shuffled training split (80 % of the data,
wrapping around); the other 20 % is the test set.

Variants: ``keras`` (the framework reference, on 1 rank: the same model, initial weights, optimiser
and global batches trained by Keras on TensorFlow with the rank's threads, `bench.families.keras`;
needs ``mlscale[keras]``, skipped in a sweep without it or with a setting for the other variants;
the report's ``vs_ref`` compares with it when measured, else with ``mpi``), ``mpi``
(``MPI.Allreduce`` after backward), ``mpi_overlap``
(``MPI.Iallreduce`` on each bucket as soon as backward has produced it), the
hand-written algorithms of `parallel.collectives` (blocking, after backward), and
the sharded ``zero1`` (optimiser state), ``zero2`` (gradients too; buckets of
``ZERO2_BUCKET_BYTES`` by default) and ``zero3`` (parameters too, gathered layer
by layer with a prefetch) of `parallel.data.zero`, their reduce-scatters and
allgathers MPI's or (``DP_ZERO_COLLECTIVES``) the hand-written ones. A 16-bit
exchange (``DP_PRECISION``) and, for ``zero3``, a bucket cap are refused for the
sharded variants (one line, status 2); ``DP_ZERO_COLLECTIVES`` is ignored by the others.

Settings (`bench.models.dp.SETTINGS`): the model, ``mlp`` (784-256-128-10 on MNIST, 64-256-128-10
on digits), ``cnn`` (`parallel.nn.models.mnist_cnn`) or ``keras_cnn`` (the lecture's
TensorFlow example, `parallel.nn.models.keras_cnn`; both 28x28 images only); the
optimiser, ``sgd`` (lr 0.01, momentum 0.9) or ``adam`` (lr 1e-3, the Keras
default; moments replicated on every rank); the compute format, ``full`` (the
point's dtype) or mixed precision in ``float16`` / ``bfloat16`` (emulated by
rounding float32; `parallel.data.mixed_precision`) with master weights in the
point's dtype; the data
set, ``mnist`` (the 5,000-image sample of `kernels.datasets.load_mnist_sample`),
``digits`` (1,797 8x8 images) or a directory holding the standard MNIST IDX files
(train and t10k, .gz or not); the gradient bucket cap (0: one flat buffer; by
default 64K for ``mpi_overlap``, which needs buckets, else 0); the exchange
precision (``full``: the model dtype, see `parallel.data.gradient_wire`); and the
micro-batches accumulated per step.

Recorded: items_per_s (global samples per second); gflops, the step's flops (`bench.models.flops`:
the model's dense layers and convolutions on the global batch, forward and backward) per second over
every rank, and ``gflops_per_rank`` in params (gflops / ranks); metric ``comm_share``: the
time rank 0 spent in the MPI calls of the gradient exchange (waits for slower
ranks included) over its step time, summed over every step of the point; in
``params`` the settings, ``buckets``, ``steps``, ``epoch_s_estimate`` (rank 0's
mean step time times the steps per epoch of the training split),
``samples_per_epoch`` (the training split) and ``epochs`` (samples trained over it),
``peak_memory_mib`` (the busiest rank's host RSS high-water mark over the point's
warm-up and timed steps, `bench.families.memory`), ``loss_scale`` and
``skipped_steps`` (mixed precision: the final loss scale and the steps skipped for
an overflow), ``model_state_bytes`` (the parameters, gradients and optimiser state
the busiest rank holds between steps, counted from its arrays: `parallel.data.zero.held_bytes`),
``peak_model_state_bytes`` (the same at its peak within a step: gathered layers and
buckets included) and ``test_accuracy`` (rank 0's replica on the test split after the
point's steps).

On ``--backend cupy`` the model (moved with ``Layer.to``), the flat vectors, the
optimiser state and the data set live on the device from set-up on; each step
indexes the device data with the batch's (host) row numbers, and the gradient
exchange goes through ``backend.comm(comm)`` (staged without a CUDA-aware MPI).

The check trains a serial model from the same seed on the same global batches
with the same optimiser in the point's dtype (as many steps as the point ran, on
rank 0, skipping the steps mixed precision skipped), counts the parameters outside
``rtol`` of it (atol ``rtol * max |w|``: float64 1e-9, float32 1e-3, 16-bit
exchange or compute 5e-2, since sums in other orders drift apart over the steps; ``keras`` in float32
2e-2: another library's kernels sum in other orders, and Adam's normalised steps turn that into up to
lr per step on weights whose gradients are near zero: 0.3 % of max |w| after 22 steps of keras_cnn),
and adds the parameters that differ from rank 0's replica on each rank. For the
sharded variants the parameters compared are the shards put together (an
allgather), and each rank's model (whole after ``sync_model``) must equal them.
"""
import functools
import math
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from bench.case import Case, Metrics
from bench.families.keras import KerasTrainer, harness_threads, to_channels_last
from bench.families.keras import unavailable_reason as keras_unavailable_reason
from bench.families.memory import peak_rss_mib, reset_peak_rss
from bench.models import flops
from bench.models.dp import OPTIMIZERS, DataParallelModel, keras_conflict, read_settings
from kernels.datasets import load_digits, load_mnist_idx, load_mnist_sample, train_test_split
from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.collectives import release_plans
from parallel.data.data_parallel import DataParallelTrainer
from parallel.data.zero import ZERO_STAGES, held_bytes
from parallel.nn.layers import softmax_cross_entropy
from parallel.nn.models import accuracy, keras_cnn, mnist_cnn, mnist_mlp, train_step

SEED = 2024
IMAGE_MODELS = {"cnn": mnist_cnn, "keras_cnn": keras_cnn}
DATASETS = {"mnist": load_mnist_sample, "digits": load_digits}
TOLERANCES = {"float64": 1e-9, "float32": 1e-3}
SIXTEEN_BIT_TOLERANCE = 5e-2
KERAS_FLOAT32_TOLERANCE = 2e-2


@functools.lru_cache(maxsize=4)
def _split_data(dataset, flat, dtype):
    """(train_x, test_x, train_y, test_y) of ``dataset``, loaded once per process.

    A bundled set is split 80 / 20; a directory of MNIST IDX files keeps its own
    train and t10k splits.
    """
    if dataset in DATASETS:
        images, labels = DATASETS[dataset](flat=flat, dtype=np.dtype(dtype))
        return train_test_split(images, labels, test_fraction=0.2, seed=SEED)
    train_x, train_y = load_mnist_idx(dataset, "train", flat=flat, dtype=np.dtype(dtype))
    test_x, test_y = load_mnist_idx(dataset, "test", flat=flat, dtype=np.dtype(dtype))
    return train_x, test_x, train_y, test_y


def _build_model(name, inputs, dtype):
    return IMAGE_MODELS[name](SEED, dtype) if name in IMAGE_MODELS else mnist_mlp(SEED, dtype, inputs)


def _build_optimizer(name, pairs):
    optimizer, hyper_parameters = OPTIMIZERS[name]
    return optimizer(pairs, **hyper_parameters)


@dataclass
class _State:
    comm: object
    backend: object
    dtype: str
    size: int
    settings: dict
    trainer: object
    optimizer: object
    data: tuple
    local_offsets: np.ndarray
    steps: int = 0
    run_seconds: float = 0.0
    skipped: list = field(default_factory=list)
    peak_rss_mib: float = None
    peak_memory_mib: float = math.nan
    model_state: tuple = None
    parameters: int = 0
    flops: int = 0
    gflops_per_rank: float = math.nan


def _rows(step, size, offsets, n_train):
    """Training-set rows of the samples ``offsets`` of global batch ``step`` (wrapping around)."""
    return (step * size + offsets) % n_train


class DataParallel(Case):
    model_class = DataParallelModel
    benchmark = "data_parallel"
    size_help = "global batch size in samples (weak: per rank); one run = one training step"
    default_sizes = "32:1K"
    metrics_help = ("items_per_s = samples/s; gflops = step flops / s (params gflops_per_rank); metric comm_share = gradient-exchange time / step time (rank 0); "
                    "params: settings, epoch_s_estimate, samples_per_epoch, peak_memory_mib (host RSS high-water "
                    "mark of the steps, busiest rank), model_state_bytes and peak_model_state_bytes (parameters, "
                    "gradients and optimiser state of the busiest rank between steps / at a step's peak), loss_scale, "
                    "skipped_steps, test_accuracy")
    dtypes = ("float32", "float64")
    description = ("Data-parallel training steps of an MLP or a CNN on MNIST images (SGD or Adam, optionally in "
                   "mixed precision): each rank takes its "
                   "shard of the global batch, and the gradients are summed by MPI_Allreduce, by Iallreduce on "
                   "buckets overlapped with the backward pass, or by the hand-written allreduce algorithms; "
                   "optionally in 16-bit and with gradient accumulation; or sharded as ZeRO stages 1-3 "
                   "(reduce-scatter and allgather), with the model state each rank holds recorded. The check trains "
                   "a serial model on the same batches and compares the parameters.")

    def iterations(self, size):
        return 10, 2

    def setup(self, comm, size, variant, backend, dtype):
        if size < 1:
            raise InputError(f"dp: the global batch needs at least one sample, got {size}")
        settings = read_settings(self.settings, variant)
        smallest = size // comm.size  # block_range: the last shards are the smallest
        if settings["micro_batches"] > max(smallest, 1):
            raise InputError(f"dp: MLSCALE_DP_MICRO_BATCHES={settings['micro_batches']} is more than the {smallest} "
                             f"samples of the smallest shard (global batch {size} on {comm.size} ranks): every "
                             "micro-batch needs a sample")
        data = tuple(backend.from_host(part)
                     for part in _split_data(settings["dataset"], settings["model"] == "mlp", dtype))
        model = _build_model(settings["model"], data[0].shape[-1], dtype).to(backend)
        parameters = sum(param.size for param, _ in model.parameters())
        step_flops = flops.step(model, data[0].shape[1:], size)  # the global batch's, over every rank
        if variant == "keras":  # the same model, weights and optimiser in Keras, on images in its layout
            trainer = KerasTrainer(model, data[0].shape[1:], _build_optimizer(settings["optimizer"],
                                                                              model.parameters()),
                                   dtype, harness_threads())
            data = tuple(map(to_channels_last, data))
        else:
            trainer = _build_trainer(backend.comm(comm), model, settings)
        optimizer = _build_optimizer(settings["optimizer"], trainer.parameters())
        offsets = np.arange(*block_range(size, comm.size, comm.rank))
        reset_peak_rss()
        return _State(comm, backend, dtype, size, settings, trainer, optimizer, data, offsets, parameters=parameters,
                      flops=step_flops)

    def unavailable(self, comm, variant, backend):
        """``keras`` where TensorFlow is missing or a setting is for the other variants (a sweep skips it)."""
        reason = super().unavailable(comm, variant, backend)
        if reason or variant != "keras":
            return reason
        return keras_unavailable_reason() or keras_conflict(self.settings)

    def run(self, state):
        start = MPI.Wtime()
        train_x, _, train_y, _ = state.data
        rows = _rows(state.steps, state.size, state.local_offsets, len(train_x))
        state.trainer.train_step(state.optimizer, train_x[rows], train_y[rows], batch_size=state.size)
        if state.trainer.step_skipped:
            state.skipped.append(state.steps)
        state.steps += 1
        state.run_seconds += MPI.Wtime() - start

    def teardown(self, state):
        """Free the plans (persistent requests) the hand-written allreduce kept for this point's gradients."""
        release_plans(state.comm)

    def check(self, state):
        state.peak_rss_mib = peak_rss_mib()  # the steps' peak, before the serial reference below
        state.model_state = _model_state(state)  # before the check gathers a sharded model
        trainer = state.trainer
        # a sharded trainer's shards put together; the model it computes on is compared with them below
        params = state.backend.to_host(trainer.gather(trainer.param_pieces) if state.settings["sharding"] else
                                       trainer.flat_params)
        expected = np.empty_like(params)
        if state.comm.rank == 0:
            expected[:] = self._serial_parameters(state)
        state.comm.Bcast(expected, root=0)
        full = state.settings["precision"] == state.settings["compute"] == "full"
        rtol = TOLERANCES[state.dtype] if full else SIXTEEN_BIT_TOLERANCE
        if isinstance(trainer, KerasTrainer) and state.dtype == "float32":
            rtol = KERAS_FLOAT32_TOLERANCE
        close = np.isclose(params, expected, rtol=rtol, atol=rtol * np.max(np.abs(expected)))
        return int(np.count_nonzero(~close)) + trainer.replica_mismatches()

    def _serial_parameters(self, state):
        """Parameters of a serial model (host) trained on the same ``state.steps`` global batches."""
        train_x, _, train_y, _ = _split_data(state.settings["dataset"], state.settings["model"] == "mlp",
                                             state.dtype)
        model = _build_model(state.settings["model"], train_x.shape[-1], state.dtype)
        optimizer = _build_optimizer(state.settings["optimizer"], model.parameters())
        everyone = np.arange(state.size)
        skipped = set(state.skipped)
        for step in (step for step in range(state.steps) if step not in skipped):
            rows = _rows(step, state.size, everyone, len(train_x))
            train_step(model, softmax_cross_entropy, optimizer, train_x[rows], train_y[rows])
        return np.concatenate([param.ravel() for param, _ in model.parameters()])

    def metrics(self, state, seconds):
        peak = state.peak_rss_mib if state.peak_rss_mib is not None else peak_rss_mib()
        state.peak_memory_mib = state.comm.allreduce(peak, op=MPI.MAX)
        held = state.model_state or _model_state(state)
        state.model_state = tuple(state.comm.allreduce(count, op=MPI.MAX) for count in held)
        gflops, state.gflops_per_rank = flops.per_rank(state.flops, seconds, state.comm.size)
        return Metrics(gflops=gflops, items_per_s=state.size / seconds if seconds > 0 else math.nan,
                       metric="comm_share", metric_value=_comm_share(state))

    def params(self, state):
        train_x, test_x, _, test_y = state.data
        trainer = state.trainer
        step_seconds = state.run_seconds / state.steps if state.steps else math.nan
        scaler = trainer.loss_scaler
        sharded = state.settings["sharding"]
        summary = dict(state.settings, buckets=len(trainer.layout.segments if sharded else trainer.buckets),
                       parameters=int(state.parameters), model_state_bytes=state.model_state[0],
                       peak_model_state_bytes=state.model_state[1],
                       **OPTIMIZERS[state.settings["optimizer"]][1], steps=state.steps,
                       comm_share=_comm_share(state), samples_per_epoch=len(train_x),
                       epochs=state.steps * state.size / len(train_x),
                       epoch_s_estimate=math.ceil(len(train_x) / state.size) * step_seconds,
                       peak_memory_mib=state.peak_memory_mib, skipped_steps=len(state.skipped),
                       gflops_per_rank=state.gflops_per_rank,
                       loss_scale=scaler.scale if scaler else None)
        if isinstance(trainer, KerasTrainer):
            summary["tensorflow_threads"] = trainer.threads
        if state.steps:
            trainer.sync_model()  # collective for a sharded trainer (an allgather)
        if state.comm.rank == 0 and state.steps:
            summary["test_accuracy"] = accuracy(trainer.model, test_x, test_y)
        return summary


def _build_trainer(comm, model, settings):
    """`DataParallelTrainer`, or the ZeRO stage of the variant (`parallel.data.zero`), with the point's settings."""
    if settings["sharding"] is None:
        return DataParallelTrainer(comm, model, **{key: settings[key] for key in (
            "allreduce", "overlap", "bucket_bytes", "micro_batches", "precision", "compute")})
    buckets = {} if settings["sharding"] == "zero3" else dict(bucket_bytes=settings["bucket_bytes"])
    return ZERO_STAGES[settings["sharding"]](comm, model, collectives=settings["collectives"],
                                             micro_batches=settings["micro_batches"], compute=settings["compute"],
                                             **buckets)


def _model_state(state):
    """(between steps, at the peak of a step) bytes of the parameters, gradients and optimiser state this rank
    holds, from the arrays it holds (a sharded trainer's gathered layers and buckets at the peak)."""
    held = held_bytes(state.trainer.state_arrays() + state.optimizer.state_arrays())
    return held, held + (state.trainer.transient.peak if state.settings["sharding"] else 0)


def _comm_share(state):
    """Fraction of this rank's step time spent in MPI calls of the gradient exchange."""
    return state.trainer.comm_seconds / state.run_seconds if state.run_seconds > 0 else math.nan
