"""Suite ``tp``: the tensor-parallel Megatron MLP block (parallel.tensor.tensor_parallel), forward + backward.

Size is the number of tokens ``T`` (batch x sequence; weak scaling: per rank).
One run is one forward and one backward pass of the block ``hidden -> ffn -> hidden``
(Linear, ReLU, Linear) on ``T`` tokens. Variants:

- ``allreduce``: `ParallelMLP` (Megatron): tokens replicated, one allreduce per pass.
- ``sequence``: `ParallelMLP` with ``sequence_parallel=True``: each rank holds
  ``block_range(T, p, rank)`` tokens; allgather + reduce-scatter per pass (any ``T``).
- ``serial``: the serial block (`serial_mlp`) on one process, the reference. It
  runs on one rank only: other rank counts are an `InputError` (a sweep skips them).

Both parallel variants split ``ffn`` over the ranks (any remainder; ``ffn >= p``).

Settings (`bench.models.tp.SETTINGS`, recorded in params): model width ``h``, inner width ``f``
(default ``4 h``), and ``TP_COLLECTIVES``, the algorithms of the exchanges: ``mpi`` (MPI's
calls), or a family of hand-written ones (`parallel.tensor.exchange`: ``ring``, ``recursive``,
``auto``), so a sweep shows what the algorithm does to a training step; the bytes counted are
MPI's calls' whatever runs, and the check is the same.

Inputs ``x`` and ``dy`` (T, h) are standard normal from a seed, the same on every
rank (each keeps its token shard in ``sequence``). Check: on every rank, the full
serial block in the run's dtype (same seeds) on the same ``x`` and ``dy``; every
element of this rank's ``y``, ``dx`` and parameter gradients is compared, with
``rtol`` 1e-9 (float64) or 1e-3 (float32) and ``atol = rtol * max |reference|``.
The reference is not sampled: it has to run in the run's dtype on the whole
matrices so that its ReLU masks agree bit for bit with the parallel block's (a
float64 reference flips masks where the float32 ``h`` is within rounding of 0,
and one flipped token moves a weight-gradient column by ~1/sqrt(T)).

On ``--backend cupy`` the block (moved with ``Layer.to``), ``x`` and ``dy`` live on
the device and the collectives go through ``backend.comm(comm)`` (staged without
a CUDA-aware MPI); the check moves the results to the host. Peak memory then
counts the device arrays' bytes plus the host ``tracemalloc`` peak.

Metrics: items_per_s = tokens/s; gflops counts ``12 T h f`` flops per run (forward:
2 GEMMs of ``2 T h f``; backward: 4 GEMMs of the same size; `bench.models.flops`) over every
rank, ``gflops_per_rank`` (gflops / ranks) in params. Metric ``comm_share``:
the largest over ranks of (seconds in the block's MPI calls / run seconds).
Params: settings, per rank and run the nominal ring bytes sent and comm share,
and peak memory per rank in MB (1e6 bytes), an estimate: parameter, gradient and
input arrays plus the ``tracemalloc`` peak (NumPy reports its buffers to it) of
the point's first run, which the harness never times; MPI's own buffers excluded.
"""
import math

import numpy as np

from bench.case import Case, Metrics
from bench.models import flops
from bench.families.layers import MeasuredState, count_wrong, per_rank_summary, run_forward_backward
from bench.models.tp import TensorParallelModel
from kernels.errors import InputError
from parallel.collectives import release_plans
from parallel.tensor.tensor_parallel import ParallelMLP, serial_mlp, token_shard

SEED = 2024
TOLERANCES = {"float64": 1e-9, "float32": 1e-3}


class TensorParallel(Case):
    model_class = TensorParallelModel
    benchmark = "tensor_parallel_mlp"
    size_help = "tokens T (batch x sequence; weak: per rank); one run = MLP block forward + backward"
    default_sizes = "256:4K"
    metrics_help = ("items_per_s = tokens/s; gflops = 12 T h f / s; metric comm_share (largest rank); "
                    "params: bytes sent, comm share and peak MB per rank")

    description = ("A Megatron-style MLP block (column-parallel then row-parallel Linear, forward and backward) "
                   "split over the ranks: one allreduce per pass, or sequence parallelism with an allgather and a "
                   "reduce-scatter, against the serial block on one rank. Every output and gradient element is "
                   "checked against the serial block in the run's dtype.")

    def __init__(self, settings=None):
        super().__init__(settings)
        self.config = self.model.config

    def iterations(self, size):
        return (10, 2) if size <= 2048 else (5, 1)

    def setup(self, comm, size, variant, backend, dtype):
        if size < 1:
            raise InputError(f"tp: need at least one token, got {size}")
        self.check_ranks(comm.size, variant)
        hidden, ffn = self.config["hidden"], self.config["ffn"]
        if variant == "serial":
            model = serial_mlp(hidden, ffn, SEED, dtype)
        else:
            model = ParallelMLP(backend.comm(comm), hidden, ffn, SEED, dtype,
                                sequence_parallel=variant == "sequence", collectives=self.config["collectives"])
        rng = np.random.default_rng(SEED)
        x, dy = (backend.from_host(rng.standard_normal((size, hidden)).astype(dtype)) for _ in range(2))
        tokens = token_shard(comm, size) if variant == "sequence" else slice(None)
        return MeasuredState(comm, variant, dtype, size, dict(self.config), model.to(backend), x, dy, tokens,
                             backend=backend)

    def run(self, state):
        run_forward_backward(state)

    def check(self, state):
        host = state.backend.to_host
        reference = serial_mlp(state.settings["hidden"], state.settings["ffn"], SEED, state.dtype)
        expected = (reference.forward(host(state.x))[state.tokens], reference.backward(host(state.dy))[state.tokens])
        slices = getattr(state.model, "serial_slices", {name: slice(None) for name in reference.params})
        rtol = TOLERANCES[state.dtype]
        wrong = sum(count_wrong(host(actual), wanted, rtol) for actual, wanted in zip(state.result, expected))
        return wrong + sum(count_wrong(host(state.model.grads[name]), reference.grads[name][index], rtol)
                           for name, index in slices.items())

    def metrics(self, state, seconds):
        model = state.model
        state.summary = per_rank_summary(state, getattr(model, "comm_seconds", 0.0), getattr(model, "bytes_sent", 0))
        hidden = state.settings["hidden"]
        gflops, state.summary["gflops_per_rank"] = flops.per_rank(
            sum(flops.dense_stack(state.size, (hidden, state.settings["ffn"], hidden))), seconds, state.comm.size)
        return Metrics(gflops=gflops, items_per_s=state.size / seconds if seconds > 0 else math.nan,
                       metric="comm_share", metric_value=max(state.summary["comm_share_per_rank"]))

    def params(self, state):
        return dict(state.settings, **state.summary)

    def teardown(self, state):
        release_plans(state.comm)
