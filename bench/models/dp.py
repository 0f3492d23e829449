"""Model of suite ``dp`` (`bench.cases.dp`): a data-parallel training step, its settings and memory.

The MLP's layer widths come from the model the suite trains
(`parallel.nn.models.mnist_mlp`, read from its ``Linear`` weights: `mlp_widths`),
never written out here.
"""
import functools
import math
import os

import numpy as np

from bench.models import collective_terms, terms
from bench.models.base import Model
from bench.settings import Setting, byte_size, choice, integer
from kernels.errors import InputError
from parallel.collectives import ALLREDUCE_ALGORITHMS
from parallel.data.gradient_wire import PRECISIONS, bucket_bounds
from parallel.data.mixed_precision import COMPUTE_FORMATS
from parallel.data.zero import ZERO_COLLECTIVES, ZERO_STAGES
from parallel.nn.layers import Linear
from parallel.nn.models import mnist_mlp
from parallel.nn.optim import SGD, Adam

#: optimiser -> (class, hyper-parameters); Adam's are the Keras defaults of the lecture's example.
OPTIMIZERS = {"sgd": (SGD, dict(lr=0.01, momentum=0.9)), "adam": (Adam, dict(lr=1e-3))}
OVERLAP_BUCKET_BYTES = 64 << 10
#: zero2's default bucket cap: a few buckets for the MLP (each a reduce-scatter), the whole gradient never held.
ZERO2_BUCKET_BYTES = 256 << 10
MODELS = ("mlp", "cnn", "keras_cnn")
#: What TensorFlow's runtime adds to a process's memory (``keras``: its RSS after the first step, about 0.5 GiB).
KERAS_RUNTIME_BYTES = 512 << 20
#: (images, pixels) of the bundled sets; a directory of IDX files is taken as MNIST's 70,000 (memory estimate).
DATA_SHAPES = {"mnist": (5000, 784), "digits": (1797, 64)}


@functools.lru_cache(maxsize=None)
def mlp_widths(inputs=784):
    """``(inputs, hidden..., outputs)`` of the suites' MLP (`parallel.nn.models.mnist_mlp`) on ``inputs``
    features, read from the weight shapes of its ``Linear`` layers."""
    shapes = [layer.params["weight"].shape for layer in mnist_mlp(inputs=inputs).layers if isinstance(layer, Linear)]
    return (shapes[0][0],) + tuple(outputs for _, outputs in shapes)


def dense_parameters(widths):
    """Weights and biases of the dense layers ``widths``."""
    return sum((inputs + 1) * outputs for inputs, outputs in zip(widths, widths[1:]))


#: Parameters of each model (at most: the MLP on MNIST) and array entries held per sample in forward and
#: backward (the CNNs: tracemalloc peak of a float32 step, about 62K and 133K).
PARAMETERS = {"mlp": dense_parameters(mlp_widths()), "cnn": 21840, "keras_cnn": 93322}
ACTIVATIONS = {"mlp": lambda pixels: 2 * (pixels + sum(mlp_widths()[1:])), "cnn": lambda pixels: 65_000,
               "keras_cnn": lambda pixels: 140_000}


def data_source(variable, text, allowed):
    """A bundled data set's name (lower-cased) or a directory of MNIST IDX files."""
    if text.lower() in DATA_SHAPES:
        return text.lower()
    if not os.path.isdir(text):
        raise InputError(f"{variable}={text!r}: choose from {', '.join(DATA_SHAPES)} "
                         "or a directory holding the MNIST IDX files")
    return text


SETTINGS = (
    Setting("DP_MODEL", choice, "mlp", MODELS, "model (cnn, keras_cnn: 28x28 images only)"),
    Setting("DP_OPTIMIZER", choice, "sgd", tuple(OPTIMIZERS), "optimiser (sgd: lr 0.01, momentum 0.9; adam: lr 1e-3)"),
    Setting("DP_COMPUTE", choice, "full", COMPUTE_FORMATS,
            "forward / backward format (float16, bfloat16: mixed precision, master weights in the dtype)"),
    Setting("DP_DATASET", data_source, "mnist", "mnist|digits|IDX directory",
            "data set, or a directory of MNIST IDX files"),
    Setting("DP_BUCKET_BYTES", byte_size, None, None,
            "gradient bucket cap, 0: one flat buffer (default: 64K for mpi_overlap, else 0)"),
    Setting("DP_PRECISION", choice, "full", PRECISIONS, "gradient exchange format (full: the model dtype)"),
    Setting("DP_MICRO_BATCHES", integer, 1, 1, "micro-batches accumulated per step"),
    Setting("DP_ZERO_COLLECTIVES", choice, "mpi", ZERO_COLLECTIVES,
            "reduce-scatter / allgather of the zero variants (mpi: MPI's; else the hand-written pair)"),
)


def read_settings(settings, variant):
    """The trainer settings of ``variant`` from the suite's ``settings``; `InputError` when they do not fit."""
    model = settings["DP_MODEL"]
    dataset = settings["DP_DATASET"]
    if model != "mlp" and dataset == "digits":
        raise InputError(f"MLSCALE_DP_MODEL={model} needs 28x28 images: set MLSCALE_DP_DATASET=mnist or an IDX "
                         "directory")
    overlap = variant == "mpi_overlap"
    bucket_bytes = settings["DP_BUCKET_BYTES"]
    sharded = variant in ZERO_STAGES
    if sharded and settings["DP_PRECISION"] != "full":
        raise InputError(f"dp {variant} reduce-scatters in the master dtype: MLSCALE_DP_PRECISION="
                         f"{settings['DP_PRECISION']} is for the allreduce variants")
    if variant == "zero3" and bucket_bytes is not None:
        raise InputError("dp zero3 exchanges one layer at a time: MLSCALE_DP_BUCKET_BYTES is for the other variants")
    default_bucket = OVERLAP_BUCKET_BYTES if overlap else ZERO2_BUCKET_BYTES if variant == "zero2" else 0
    exchanged = not (overlap or sharded or variant == "keras")
    return dict(model=model, dataset=dataset, allreduce=variant if exchanged else "mpi", overlap=overlap,
                bucket_bytes=default_bucket if bucket_bytes is None else bucket_bytes,
                micro_batches=settings["DP_MICRO_BATCHES"], precision=settings["DP_PRECISION"],
                optimizer=settings["DP_OPTIMIZER"], compute=settings["DP_COMPUTE"],
                sharding=variant if sharded else None, collectives=settings["DP_ZERO_COLLECTIVES"])


def keras_conflict(settings):
    """Why the ``keras`` variant cannot honour the suite's ``settings`` (one line), or None: it trains in the
    point's dtype, one batch per step, exchanging nothing."""
    unusable = [f"MLSCALE_{name}={settings[name]}" for name, default in (
        ("DP_COMPUTE", "full"), ("DP_PRECISION", "full"), ("DP_MICRO_BATCHES", 1), ("DP_BUCKET_BYTES", None))
        if settings[name] != default]
    return (f"keras trains in the point's dtype, one batch per step, exchanging nothing: {', '.join(unusable)} "
            "is for the other variants") if unusable else None


def model_state_bytes(variant, parameters, item, ranks, optimizer="adam"):
    """Bytes of parameters, gradients and optimiser state a rank holds between steps, full precision, one
    micro-batch (ZeRO's accounting): replicated ``(2 + k) Psi``, ``zero1`` ``2 Psi + k Psi / N``, ``zero2``
    ``Psi + (1 + k) Psi / N``, ``zero3`` ``(2 + k) Psi / N`` items, ``k`` the optimiser's state vectors
    (Adam 2, SGD with momentum 1)."""
    state = 2 if optimizer == "adam" else 1
    whole = {"zero1": 2, "zero2": 1, "zero3": 0}.get(variant, 2 + state)
    return item * parameters * (whole + (2 + state - whole) / ranks)


def _mlp_step(calib, rows, features, ranks, update_share=1):
    """``(forward with the batch gather, backward and SGD update of update_share of the parameters)`` seconds of
    the MLP on ``rows`` samples of ``features`` inputs (`terms.dense_layers`), and its gradient bytes."""
    item = terms.itemsize(calib)
    widths = mlp_widths(features)
    parameters = dense_parameters(widths) * item
    forward, backward = terms.dense_layers(calib, widths, rows, ranks)
    rest = terms.copy(calib, rows * features * item) + 3 * terms.reduction(calib, parameters * update_share)
    return forward + rest, backward, parameters


def fitted_mlp_step(calib, rows, features, ranks, update_share=1):
    """``(fixed, forward, backward)`` seconds of one step of the MLP on one of ``ranks`` ranks: `_mlp_step`
    (forward with the batch gather and the SGD update of ``update_share`` of the parameters; backward) scaled,
    plus the fixed cost of the step's Python calls, on the line through the two calibrated one-rank ``dp``
    steps around ``rows`` (`terms.fitted_step`: the default data set, MNIST, exchanged on one rank)."""
    def calibrated_step(count):
        forward, backward, parameters = _mlp_step(calib, count, DATA_SHAPES["mnist"][1], ranks)
        return forward + backward + collective_terms.allreduce(calib, parameters, 1)

    fixed, scale = terms.fitted_step(calib, "dp_step", calibrated_step, ranks, rows)
    forward, backward, _ = _mlp_step(calib, rows, features, ranks, update_share)
    return fixed, scale * forward, scale * backward


class DataParallelModel(Model):
    name = "dp"
    variants = ("keras", "mpi", "mpi_overlap") + tuple(ALLREDUCE_ALGORITHMS) + tuple(ZERO_STAGES)
    size_unit = "samples"
    declared_settings = SETTINGS
    host_only_variants = {"keras": "one TensorFlow process on the host (the framework reference of training)"}
    reference_variants = ("keras", "mpi")

    def check_ranks(self, ranks, variant):
        """``keras`` is one process using every core (implicit parallelism): 1 rank only."""
        if variant == "keras" and ranks != 1:
            raise InputError(f"keras is one TensorFlow process using every core (implicit parallelism): it runs "
                             f"on 1 rank, not {ranks}")

    def predict(self, variant, size, ranks, calib):
        """One step of the MLP on this rank's ceil(n / p) samples (`terms.dense_layers`), the gather of
        the batch, the allreduce of the gradients (after backward; ``mpi_overlap``: behind it) and the
        SGD update (3 passes over the parameters); a hand-written allreduce sends gradients the backward pass
        has just written, each exchange at the calibrated fresh time (``written``: at batch 32-256 on 2 ranks its
        step took 1.15-1.9 ms here like MPI's, where clean first exchanges priced it at 0.7-1.1 ms); the compute on the line through the two calibrated
        one-rank steps around this batch (`terms.fitted_step`: a fixed cost of the step's Python calls and a
        scale). The zero variants: per segment (a bucket; zero3: a layer) MPI's reduce-scatter and allgather
        (zero3: two, less the last layer's, no credit for the prefetch), the update on the shard. None for
        the CNNs, 16-bit exchange or compute, accumulation, the hand-written zero collectives and ``keras``
        (not modelled)."""
        settings = read_settings(self.settings, variant)
        sharding = settings["sharding"]
        if (settings["model"], settings["precision"], settings["compute"], settings["micro_batches"]) != \
                ("mlp", "full", "full", 1) or (sharding and settings["collectives"] != "mpi") or variant == "keras":
            return None
        item = terms.itemsize(calib)
        features = DATA_SHAPES.get(settings["dataset"], (0, 784))[1]
        fixed, forward, backward = fitted_mlp_step(calib, math.ceil(size / ranks), features, ranks,
                                                   1 / ranks if sharding else 1)
        parameters = dense_parameters(mlp_widths(features)) * item
        exchange = collective_terms.allreduce(calib, parameters, ranks, settings["allreduce"], written=True) \
            if not sharding else \
            self._sharded_exchange(calib, sharding, settings["bucket_bytes"], mlp_widths(features), item, ranks)
        return fixed + forward + (max(backward, exchange) if settings["overlap"] else backward + exchange)

    @staticmethod
    def _sharded_exchange(calib, sharding, bucket_bytes, widths, item, ranks):
        """Seconds of a zero variant's collectives in one step of the MLP of ``widths``."""
        sizes = [size for inputs, outputs in zip(widths, widths[1:]) for size in (inputs * outputs, outputs)]
        if sharding == "zero3":
            layers = [item * (inputs + 1) * outputs for inputs, outputs in zip(widths, widths[1:])]
            return sum(collective_terms.reduce_scatter(calib, n, ranks) + 2 * collective_terms.allgather(calib, n, ranks) for n in layers) \
                - collective_terms.allgather(calib, layers[-1], ranks)
        return sum(collective_terms.reduce_scatter(calib, item * (stop - start), ranks) +
                   collective_terms.allgather(calib, item * (stop - start), ranks)
                   for start, stop in bucket_bounds(sizes, item, bucket_bytes))

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """The data set on every rank (the bytes read, then scaled and split: 2 copies), the model with its
        flat gradients, optimiser state and buckets (8 vectors; Adam one more; mixed precision the
        16-bit copies of weights and gradients), and the activations of this rank's ``ceil(n / p)``
        samples (`ACTIVATIONS` per sample, in the compute format: float16 halves float32); the
        check trains a serial model on the whole global batch of n samples on rank 0; ``keras`` adds
        `KERAS_RUNTIME_BYTES`. The zero variants hold
        `model_state_bytes`, the update's temporaries of their shard and one gathered vector."""
        settings = read_settings(self.settings, variant)
        samples, pixels = DATA_SHAPES.get(settings["dataset"], (70000, 784))
        item = np.dtype(dtype).itemsize
        compute_item = {"full": item, "float16": 2, "bfloat16": 4}[settings["compute"]]
        parameters = PARAMETERS[settings["model"]]
        vectors = 8 + (settings["optimizer"] == "adam")
        state = vectors * item * parameters
        if settings["sharding"]:  # the model state ZeRO's way, the update's temporaries on the shard, one gathered
            kept = model_state_bytes(variant, parameters, item, ranks, settings["optimizer"])
            state = kept + item * parameters * (1 + (vectors - kept / (item * parameters)) / ranks)
        state += 2 * compute_item * parameters if settings["compute"] != "full" else 0
        state += KERAS_RUNTIME_BYTES if variant == "keras" else 0
        per_sample = ACTIVATIONS[settings["model"]](pixels)
        activations = per_sample * (compute_item * -(-problem // ranks) + (item * problem if check else 0))
        return samples * pixels + item * 2 * samples * pixels + state + activations
