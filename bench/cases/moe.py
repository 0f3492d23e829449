"""Suite ``moe``: an expert-parallel mixture-of-experts layer (parallel.expert.moe), forward + backward.

Size is the global number of tokens ``T`` (weak scaling: per rank); rank ``r``
routes its ``block_range(T, p, r)`` tokens. One run is one forward and one
backward pass of `parallel.expert.moe.ParallelMoE` (all-to-all dispatch and combine).
Variants ``top1`` and ``top2``: the number of experts per token.

The model grows with the rank count, as expert parallelism does: ``E = experts
per rank x p`` experts, each ``hidden -> ffn -> hidden``, so the compute per token
(``k`` experts) does not change with ``p``; capacity per (rank, expert) is
``ceil(k n_r / E * capacity_factor)`` (`parallel.expert.routing.expert_capacity`).

Settings (`bench.models.moe.SETTINGS`, recorded in params): experts per rank, token width, expert
inner width (default ``4 x hidden``), capacity factor, and ``MOE_ALLTOALL``, the algorithm of the
all-to-alls: ``mpi``, or a hand-written one (`parallel.expert.moe`: ``pairwise``, ``scattered``,
``auto``), so a sweep shows what it does to the layer's step; the bytes counted and the check
are the same whichever runs. The auxiliary-loss weight
is fixed at 0.01.

Inputs ``x``, ``dy`` (T, hidden) are standard normal from a seed. Check: on every
rank, `SerialMoE` (same seeds, the run's dtype, so that routing is identical) on
all ``T`` tokens with the ranks' shard sizes; every element of this rank's ``y``,
``dx`` and gradients (gate and owned experts) is compared with ``rtol`` 1e-9
(float64) or 1e-3 (float32), ``atol = rtol * max |reference|``; a different aux
loss or drop count adds one wrong element each.

Metrics: items_per_s = tokens/s; gflops counts the expert GEMMs of the kept rows
(``12 hidden ffn`` flops per row, forward + backward) and the gate (``6 T hidden
E``; `bench.models.flops`) over every rank, ``gflops_per_rank`` (gflops / ranks) in params. Metric
``dropped_fraction``: dropped assignments / ``k T``. Params: settings,
``experts``, ``capacity_per_rank``, ``load_imbalance`` (max kept rows per expert /
mean), ``aux_loss``, and per rank the bytes sent (all-to-all rows exactly,
allreduces as a ring) and comm share per run and the peak memory estimate of
`bench.cases.tp` (params, grads, inputs + tracemalloc peak of the first run).

On ``--backend cupy`` the gate and experts (moved with ``Layer.to``), the tokens
and the dispatched rows live on the device; the ``Alltoallv`` go through
``backend.comm(comm)`` (staged without a CUDA-aware MPI); the routing counts and
statistics are small host arrays; the check moves the results to the host.
"""
import math

import numpy as np

from bench.case import Case, Metrics
from bench.models import flops
from bench.families.layers import MeasuredState, count_wrong, per_rank_summary, run_forward_backward
from bench.models.moe import AUX_LOSS_WEIGHT, TOP_K, MixtureOfExpertsModel
from kernels.distribution import block_counts, block_range
from kernels.errors import InputError
from parallel.collectives import release_plans
from parallel.expert.moe import ParallelMoE
from parallel.expert.routing import expert_capacity

SEED = 2024
TOLERANCES = {"float64": 1e-9, "float32": 1e-3}


class MixtureOfExperts(Case):
    model_class = MixtureOfExpertsModel
    benchmark = "mixture_of_experts"
    size_help = "global tokens T (weak: per rank); one run = MoE layer forward + backward"
    default_sizes = "512:8K"
    metrics_help = ("items_per_s = tokens/s; gflops of the kept expert rows and the gate; metric dropped_fraction; "
                    "params: load_imbalance, aux_loss, bytes sent, comm share and peak MB per rank")

    description = ("An expert-parallel mixture-of-experts layer, forward and backward: a top-1 or top-2 softmax "
                   "gate routes each rank's tokens to experts spread evenly over the ranks, with all-to-all "
                   "dispatch and combine and a capacity per expert; the experts grow with the rank count. "
                   "Every element is checked against a serial layer that routes shard by shard as the ranks do.")

    def __init__(self, settings=None):
        super().__init__(settings)
        self.config = self.model.config

    def iterations(self, size):
        return (10, 2) if size <= 4096 else (5, 1)

    def setup(self, comm, size, variant, backend, dtype):
        if size < 1:
            raise InputError(f"moe: need at least one token, got {size}")
        self.check_ranks(comm.size, variant)
        settings = dict(self.config, experts=self.config["experts_per_rank"] * comm.size, top_k=TOP_K[variant])
        layer = ParallelMoE(backend.comm(comm), settings["hidden"], settings["ffn"], settings["experts"],
                            settings["top_k"], settings["capacity_factor"], SEED, dtype, AUX_LOSS_WEIGHT,
                            settings["alltoall"])
        rng = np.random.default_rng(SEED)
        x, dy = (backend.from_host(rng.standard_normal((size, settings["hidden"])).astype(dtype)) for _ in range(2))
        return MeasuredState(comm, variant, dtype, size, settings, layer.to(backend), x, dy,
                             slice(*block_range(size, comm.size, comm.rank)), backend=backend)

    def run(self, state):
        run_forward_backward(state)

    def check(self, state):
        layer, rtol, host = state.model, TOLERANCES[state.dtype], state.backend.to_host
        reference = layer.serial_reference()
        expected = (reference.forward(host(state.x), block_counts(state.size, state.comm.size))[state.tokens],
                    reference.backward(host(state.dy))[state.tokens])
        wrong = sum(count_wrong(host(actual), wanted, rtol) for actual, wanted in zip(state.result, expected))
        wrong += sum(count_wrong(host(grad), reference.grads[name], rtol) for name, grad in layer.grads.items())
        return wrong + (layer.dropped != reference.dropped) + \
            (not math.isclose(layer.aux_loss, reference.aux_loss, rel_tol=rtol))

    def metrics(self, state, seconds):
        layer, settings = state.model, state.settings
        load = layer.expert_load
        state.summary = dict(
            per_rank_summary(state, layer.comm_seconds, layer.bytes_sent),
            capacity_per_rank=[expert_capacity(n, settings["experts"], settings["top_k"], settings["capacity_factor"])
                               for n in block_counts(state.size, state.comm.size)],
            load_imbalance=round(float(load.max() / load.mean()), 4) if load.sum() else math.nan,
            aux_loss=layer.aux_loss, dropped=layer.dropped)
        hidden = settings["hidden"]
        work = sum(flops.dense_stack(int(load.sum()), (hidden, settings["ffn"], hidden))) + \
            sum(flops.dense(state.size, hidden, settings["experts"]))
        gflops, state.summary["gflops_per_rank"] = flops.per_rank(work, seconds, state.comm.size)
        return Metrics(gflops=gflops, items_per_s=state.size / seconds if seconds > 0 else math.nan,
                       metric="dropped_fraction", metric_value=layer.dropped / (settings["top_k"] * state.size))

    def params(self, state):
        return dict(state.settings, **state.summary)

    def teardown(self, state):
        release_plans(state.comm)
