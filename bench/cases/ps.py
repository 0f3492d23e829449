"""Suite ``ps``: parameter-server training steps (parallel.data.param_server) on the MNIST sample.

Ranks ``0 .. S-1`` are servers holding the parameters sharded by key range, the
other W ranks workers. Settings (`bench.models.ps.SETTINGS`): the server count S (at most ranks -
1), the staleness bound s of variant ``ssp``, and the model: ``mlp``
(784-256-128-10 on flat images: the MLP of suite ``dp``, `parallel.nn.models.mnist_mlp`)
or ``cnn`` (`parallel.nn.models.mnist_cnn`, much slower per sample).

Size is the global batch in samples (at least W). Global batch t is rows
``t B .. t B + B - 1`` (wrapping around) of the shuffled 4,000-image training part
of the sample; each worker takes its `block_range` block and computes the gradient
scaled by the global batch size. Servers apply plain SGD (lr 0.05). One run is one
global step: in ``sync``, one SGD step on the global batch; in ``async`` and
``ssp``, one step of every worker, each gradient applied as it arrives. A run ends
when every worker has done its step and told every server so, hence timed runs
compose (clocks and staleness carry over from run to run).

On ``--backend cupy`` the model, the flat vectors, the servers' shards and
optimiser state and the training images live on the device; the messages go
through ``backend.comm(comm)`` (staged without a CUDA-aware MPI).

Check: ``sync`` takes one more step from the current parameters and counts the
elements outside ``rtol = atol = 1e-9`` (float64; 1e-4 for float32) of one serial
SGD step on the same global batch. Every variant also counts gradient shards
applied with a staleness above the bound (0 in sync, s in ssp) and non-finite
parameters.

Metrics: items_per_s = samples per second; gflops = the flops of one global step (`bench.models.flops`:
the model's layers on the global batch, forward and backward; the servers' SGD not counted) per second;
metric ``comm_share`` (sync: the
workers' share of time spent waiting on pulls and pushes) or ``max_staleness``
(async, ssp); params: servers, workers, bound, model, parameters, comm_share,
max_staleness, mean_staleness, ``gflops_per_rank`` (gflops over the workers: the servers compute no
gradient).
"""
import functools
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from bench.case import Case, Metrics
from bench.models import flops
from bench.models.ps import SETTINGS, ParameterServerModel
from kernels.datasets import load_mnist_sample, train_test_split
from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.nn.layers import softmax_cross_entropy
from parallel.nn.models import flat_storage, forward_backward, mnist_cnn, mnist_mlp
from parallel.nn.optim import SGD
from parallel.data.param_server import ParameterServer, Statistics, check_roles

LEARNING_RATE = 0.05
BUILDERS = {"mlp": lambda dtype: mnist_mlp(seed=0, dtype=dtype),
            "cnn": lambda dtype: mnist_cnn(seed=0, dtype=dtype)}
TOLERANCE = {"float64": 1e-9, "float32": 1e-4}


@functools.lru_cache(maxsize=4)
def training_images(model, dtype):
    """The shuffled training part of the MNIST sample, flat for the MLP and NCHW for the CNN."""
    images, labels = load_mnist_sample(flat=model == "mlp", dtype=dtype)
    train_images, _, train_labels, _ = train_test_split(images, labels, test_fraction=0.2, seed=0)
    return train_images, train_labels


@dataclass
class _State:
    comm: object
    backend: object
    variant: str
    dtype: str
    batch: int
    model_name: str
    model: object
    ps: ParameterServer
    images: np.ndarray
    labels: np.ndarray
    steps: int = 0
    statistics: Optional[Statistics] = None
    gflops_per_rank: float = math.nan


def global_rows(step, batch, n):
    """Row indices of global batch ``step``: ``batch`` consecutive rows, wrapping around ``n``."""
    return (step * batch + np.arange(batch)) % n


class ParameterServerSuite(Case):
    model_class = ParameterServerModel
    benchmark = "param_server"
    size_help = "global batch size in samples (>= workers); one run = one global step"
    default_sizes = "64:1024"
    metrics_help = ("items_per_s = samples/s; gflops (params gflops_per_rank: per worker); metric comm_share (sync) "
                    "or max_staleness (async, ssp)")
    dtypes = ("float32", "float64")  # float32 first, as in suite dp: their default rates compare

    description = ("Parameter-server training of an MLP or CNN on the MNIST sample: server ranks hold the "
                   "parameters sharded by key range, worker ranks pull them, compute gradients on their shard of "
                   "the global batch and push them back, synchronously, asynchronously, or with bounded "
                   "staleness (ssp). The check compares a synchronous step with serial SGD and counts updates "
                   "applied beyond the staleness bound.")

    def __init__(self, settings=None):
        super().__init__(settings)
        self.servers, self.staleness, self.model_name = (self.settings[s.name] for s in SETTINGS)

    def check_ranks(self, ranks, variant):
        check_roles(ranks, self.servers)

    def iterations(self, size):
        return (5, 1) if self.model_name == "cnn" else (20, 3)

    def setup(self, comm, size, variant, backend, dtype):
        check_roles(comm.size, self.servers)
        workers = comm.size - self.servers
        if size < workers:
            raise InputError(f"ps: the global batch ({size}) must give each of the {workers} workers a sample")
        model = BUILDERS[self.model_name](np.dtype(dtype)).to(backend)
        flat_params, flat_grads = flat_storage(model)
        ps = ParameterServer(backend.comm(comm), flat_params, flat_grads, LEARNING_RATE, mode=variant,
                             servers=self.servers, staleness=self.staleness)
        images, labels = (backend.from_host(part) for part in training_images(self.model_name, dtype))
        return _State(comm, backend, variant, dtype, size, self.model_name, model, ps, images, labels)

    def run(self, state):
        ps = state.ps
        compute = None if ps.is_server else functools.partial(_worker_gradient, state)
        ps.train(1, compute)
        state.steps += 1

    def check(self, state):
        host = state.backend.to_host
        before = host(state.ps.gather_parameters()) if state.variant == "sync" else None
        step = state.steps
        self.run(state)
        after = host(state.ps.gather_parameters())
        bound = state.ps.bound
        wrong = int(np.sum(state.ps.staleness_counts[bound + 1:])) if bound is not None else 0
        if state.comm.rank != 0:
            return wrong
        wrong += int(np.count_nonzero(~np.isfinite(after)))
        if before is not None:
            expected = serial_step(state, before, step)
            tolerance = TOLERANCE[state.dtype]
            wrong += int(np.count_nonzero(~np.isclose(after, expected, rtol=tolerance, atol=tolerance)))
        return wrong

    def metrics(self, state, seconds):
        """Rates of the point; collective (three small allreduces), as the harness calls it on every rank."""
        stats = _statistics(state)
        if state.variant == "sync":
            metric, value = "comm_share", stats.comm_share
        else:
            metric, value = "max_staleness", float(stats.max_staleness)
        step_flops = flops.step(state.model, state.images.shape[1:], state.batch)
        gflops, state.gflops_per_rank = flops.per_rank(step_flops, seconds, state.ps.workers)
        return Metrics(gflops=gflops, items_per_s=state.batch / seconds if seconds > 0 else None, metric=metric,
                       metric_value=value)

    def params(self, state):
        stats = _statistics(state)
        ps = state.ps
        return {"servers": ps.servers, "workers": ps.workers, "bound": ps.bound, "model": state.model_name,
                "parameters": int(ps.flat_params.size), "comm_share": round(stats.comm_share, 4),
                "max_staleness": stats.max_staleness, "mean_staleness": round(stats.mean_staleness, 4),
                "gflops_per_rank": state.gflops_per_rank}

def _worker_gradient(state, clock):
    """Fill the worker's gradient for its block of global batch ``clock`` (scaled by the global batch)."""
    ps = state.ps
    start, stop = block_range(state.batch, ps.workers, ps.worker_index)
    rows = global_rows(clock, state.batch, len(state.images))[start:stop]
    loss = functools.partial(softmax_cross_entropy, batch_size=state.batch)
    forward_backward(state.model, loss, state.images[rows], state.labels[rows])


def serial_step(state, params, step):
    """Return ``params`` after one serial SGD step on global batch ``step`` (a fresh model, on the host)."""
    model = BUILDERS[state.model_name](np.dtype(state.dtype))
    flat_params, flat_grads = flat_storage(model)
    flat_params[:] = params
    images, labels = training_images(state.model_name, state.dtype)
    rows = global_rows(step, state.batch, len(images))
    forward_backward(model, softmax_cross_entropy, images[rows], labels[rows])
    SGD([(flat_params, flat_grads)], LEARNING_RATE).step()
    return flat_params


def _statistics(state):
    """The parameter server's `Statistics`, computed once per point (collective: every rank calls it)."""
    if state.statistics is None:
        state.statistics = state.ps.statistics()
    return state.statistics
