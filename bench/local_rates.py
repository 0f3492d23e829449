"""Local rates of the cost models (`bench.calibrate`): compute and memory on one rank.

Every quantity is a median over `ROUNDS` rounds that visit all of them in turn
(so a burst of load on a shared machine spreads over many sizes instead of
spoiling one), each sample looping until it lasts `LEAST_S` seconds. Measured
with a given number of BLAS threads, on one rank alone or on every rank of a node
at once (``comm``: the ranks agree on the loop counts and start each sample
together, so they share the cores and the memory bandwidth as the ranks of a
sweep do).

- ``gemm``: flop/s of square products by size (`GEMM_SIZES`) and dtype;
- ``gemm_thin``: flop/s of thin products ``(d, S) @ (S, S)``, ``S`` = `THIN_SIDE` (``thin_side``), by
  ``d`` of `THIN_ROWS` (``thin_rows``) and dtype, each call with the next of `THIN_OPERANDS` distinct
  ``S x S`` operands (64 MiB in float64: from memory, as the layers of a network each bring their
  weights): BLAS packs a whole ``S x S`` operand for few rows, so a product whose smallest side is
  far below the cube root of its work runs well below the square rate of equal work
  (`bench.models.terms.gemm`);
- ``conv``, ``attention``: flop/s of the suites' own kernels at a reference size
  (`SUITE_POINTS`), by dtype and variant;
- ``dp_step``: seconds of a ``dp`` training step (the MLP, one rank) at the batch
  sizes of `DP_ROWS`, by dtype; ``moe_step``: of a ``moe`` layer's step (variant ``top1``, forward and
  backward, one rank) at the token counts of `MOE_TOKENS` (the Python calls, routing passes and
  element-wise steps around its GEMMs, which the terms of its model miss: 25-35 % of a step here);
- ``reduce``, ``copy``: seconds of an in-place float64 addition and of a copy at
  8 B .. 32 MiB (`LOCAL_SIZES`);
- ``gemv``: seconds of ``A @ x`` for square ``A`` of the sides `GEMV_SIDES` by dtype, keyed by the bytes of
  ``A`` (float64: 32 KiB .. 128 MiB), the same matrix each call as a point of suite ``gemv`` repeats its own:
  reading a matrix held in the cache is not a copy of half its bytes (a 4 MiB block on each of two ranks
  took 1.6-2x the copy rule's time here, a 128 MiB one on one rank with two threads 0.6-0.8x); each sample
  after as many untimed products as it times, as a sweep's point repeats its own: part of a matrix larger
  than the cache stays there from one call to the next (timed right after the other tables, a 32 MiB GEMV on
  each of two ranks took 1.05-1.25x as long as in a row of them, median 1.11x over ten tries; after one
  untimed call 1.08-1.19x; after a sample's worth 0.99-1.07x);
- ``kernel_rows``: RBF Gram entries per second at the MNIST dimension (784), float64, one row of
  `KERNEL_COLUMNS` entries at a time, as Dis-SMO computes them (one row per working-set index; a
  block of rows runs several times faster per entry: a GEMM, not a GEMV), `KERNEL_ROWS` rows in turn
  over the same samples, which stay in the cache between rows as they do in a solve (the first
  after the other tables comes from memory; measured cold, a row took 2-2.5x as long here); the
  median of `KERNEL_BLOCKS` entries, each its own rows (a table of several entries, as the others:
  on two ranks at once the samples share the L3 cache and one entry's rounds alone differed by
  1.5-2.4x here);
- ``smo_iteration``: seconds of a Dis-SMO iteration on one rank less the kernel row it computes
  (`svm.distributed.dis_smo_probe.IterationProbe`: a solve's own calls, in the cold caches a row leaves),
  by the samples of the rank's block (`SMO_BLOCKS`), float64; its rounds follow the other tables', each
  sample the mean of `svm.distributed.dis_smo_probe.RESTART` iterations;
- ``spread``: each table's `bench.stability.table_spread` over the rounds (None in one round).

How much is measured is a `RatesPlan`: `FULL` (what ``mlscale calibrate`` measures)
or `QUICK` (``--quick``: fewer sizes, one round, short samples, no search for a handoff state; the same tables,
coarser).
"""
import itertools
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_limits

from bench.interleaved import LEAST_S, ROUNDS, medians, rounds_of, sampler
from bench.models.svm import KERNEL_COLUMNS
from bench.stability import table_spread
from bench.state_tables import HUNT_ROUNDS, other_state_seconds, state_samples

LOCAL_SIZES = [8 << (2 * k) for k in range(12)]  # 8 B .. 32 MiB, x4
GEMM_SIZES = (32, 64, 128, 256, 512, 1024)
#: Rows d of the thin products (d, THIN_SIDE) @ (THIN_SIDE, THIN_SIDE).
THIN_ROWS, THIN_SIDE = (8, 32, 128), 1024
#: Distinct (THIN_SIDE, THIN_SIDE) operands the thin products take in turn (more than a cache holds).
THIN_OPERANDS = 8
#: Sides of the square matrices of the ``gemv`` table (float64: 32 KiB .. 128 MiB, x4 up to 2 MiB, then x2
#: through the sizes where the blocks of a node's ranks outgrow its last-level cache).
GEMV_SIDES = (64, 128, 256, 512, 724, 1024, 1448, 2048, 2896, 4096)
DTYPES = ("float32", "float64")
#: (suite, variant, size): reference points of the suites whose kernel rate is calibrated.
SUITE_POINTS = (("conv", "forward", 256), ("conv", "forward_backward", 256), ("attention", "full", 1024))
#: Batch sizes of the calibrated ``dp`` steps (variant ``mpi`` on one rank).
DP_ROWS = (16, 64, 256)
#: Token counts of the calibrated ``moe`` steps (variant ``top1`` on one rank).
MOE_TOKENS = (64, 256, 1024)
#: The calibrated steps: table -> (suite, variant, the plan's field of their sizes).
STEPS = {"dp_step": ("dp", "mpi", "dp_rows"), "moe_step": ("moe", "top1", "moe_tokens")}
KERNEL_DIM, KERNEL_ROWS = 784, 16
#: Samples of a rank's block at which the Dis-SMO iteration is timed (`smo_iteration`).
SMO_BLOCKS = (500, 1000, 2000, 4000)
#: Entries of the ``kernel_rows`` table: blocks of `KERNEL_ROWS` distinct rows over the same samples.
KERNEL_BLOCKS = 3


@dataclass(frozen=True)
class RatesPlan:
    """What `local_rates` measures: the table sizes, ``rounds`` per entry, ``least`` seconds per sample and, with a
    probe, at most ``hunt`` rounds' worth of samples seeking each handoff state (`bench.state_tables.state_samples`)."""

    gemm_sizes: tuple = GEMM_SIZES
    thin_rows: tuple = THIN_ROWS
    thin_side: int = THIN_SIDE
    local_sizes: tuple = tuple(LOCAL_SIZES)
    gemv_sides: tuple = GEMV_SIDES
    dp_rows: tuple = DP_ROWS
    moe_tokens: tuple = MOE_TOKENS
    suite_points: tuple = SUITE_POINTS
    smo_blocks: tuple = SMO_BLOCKS
    rounds: int = ROUNDS
    least: float = LEAST_S
    hunt: int = HUNT_ROUNDS


FULL = RatesPlan()
#: A rough calibration in a few seconds (tests, a first look): the ends and middle of each table, one round.
#: The suites' kernels at a quarter of their reference work.
QUICK = RatesPlan(gemm_sizes=(32, 128, 512), thin_rows=(8, 128), local_sizes=tuple(LOCAL_SIZES[::3]) + (LOCAL_SIZES[-1],),
                  gemv_sides=(64, 256, 1024, 2048), dp_rows=(16, 256), moe_tokens=(64, 256),
                  suite_points=tuple((suite, variant, size // 2) for suite, variant, size in SUITE_POINTS),
                  smo_blocks=(500, 1000),
                  rounds=1, least=0.002, hunt=0)


def local_rates(threads, comm=None, plan=FULL, probe=None):
    """The rates of the module with ``threads`` BLAS threads; ``comm``: measure on all its ranks at once;
    ``plan``: the sizes and rounds (`RatesPlan`); ``probe``: a callable giving every rank of ``comm`` the node's
    handoff probe (`bench.message_tables.node_handoff_prober`), timed before each sample: the rates keep the
    samples of the reference state (`bench.state_tables.state_samples`) and record ``handoff_s``, and
    ``other_state`` holds the rates of the other state where its samples cover enough entries
    (`bench.state_tables.other_state_seconds`; the Dis-SMO iterations, sampled apart, are the reference's)."""
    with threadpool_limits(limits=threads), ExitStack() as stack:
        items = _items(stack, plan)
        sample = sampler(items, comm, plan.least, warm={key for key in items if key[0] == "gemv"})
        if probe is None:
            kept, states = rounds_of(items, sample, plan.rounds), None
        else:
            states = state_samples(list(items), probe, sample, plan.rounds, plan.hunt)
            kept = states.kept()
        smo = _smo_samples(plan, comm)
        seconds = {**medians(kept), **medians(smo)}
        rates = dict(_rates(items, plan, seconds), spread=_table_spreads({**kept, **smo}))
        if states is not None:
            rates["handoff_s"] = states.handoff()
            other = other_state_seconds(seconds, medians({key: values for key, values in states.others().items()
                                                           if values}))
            if other is not None:
                rates["other_state"] = dict(_rates(items, plan, other), handoff_s=states.handoff(reference=False))
    return rates


def _rates(items, plan, seconds):
    """The tables of `local_rates` from the median ``seconds`` of each key (the suites' cases alive)."""
    suites = {"conv": {}, "attention": {}}
    for (suite, variant, dtype), (case, state) in items.points.items():
        metrics = case.metrics(state, seconds["suite", suite, variant, dtype])
        suites[suite].setdefault(dtype, {})[variant] = metrics.gflops * 1e9
    gemm = {dtype: [2 * n**3 / seconds["gemm", dtype, n] for n in plan.gemm_sizes] for dtype in DTYPES}
    thin = {dtype: [2 * d * plan.thin_side**2 / seconds["gemm_thin", dtype, d] for d in plan.thin_rows]
            for dtype in DTYPES}
    return dict(gemm=gemm, gemm_thin=thin, **suites,
                **{table: {dtype: [[size, seconds[table, dtype, size]] for size in getattr(plan, field)]
                           for dtype in DTYPES} for table, (_, _, field) in STEPS.items()},
                reduce=[[n, seconds["reduce", n]] for n in plan.local_sizes],
                copy=[[n, seconds["copy", n]] for n in plan.local_sizes],
                gemv={dtype: [[side * side * np.dtype(dtype).itemsize, seconds["gemv", dtype, side]]
                              for side in plan.gemv_sides] for dtype in DTYPES},
                smo_iteration={"float64": [[block, seconds["smo_iteration", block]] for block in plan.smo_blocks]},
                kernel_rows=KERNEL_ROWS * KERNEL_COLUMNS / float(np.median(
                    [seconds["kernel", KERNEL_DIM, block] for block in range(KERNEL_BLOCKS)])))


def _table_spreads(samples):
    """`bench.stability.table_spread` of each table (its name: the key's first part, a suite's name for the
    suites' kernels), or None for a one-round plan."""
    tables = {}
    for key, values in samples.items():
        name = key[1] if key[0] == "suite" else {"kernel": "kernel_rows"}.get(key[0], key[0])
        tables.setdefault(name, []).append(values)
    spreads = {name: table_spread(lists) for name, lists in tables.items()}
    return None if None in spreads.values() else spreads


def _smo_samples(plan, comm=None):
    """``{("smo_iteration", block): [seconds, ...]}``: per round and block of ``plan.smo_blocks``, the mean over
    `RESTART` iterations of an `IterationProbe` of that block (the ranks of ``comm`` starting each together)."""
    from svm.distributed.dis_smo_probe import RESTART, IterationProbe

    probes = {block: IterationProbe(block, KERNEL_DIM) for block in plan.smo_blocks}
    samples = {("smo_iteration", block): [] for block in plan.smo_blocks}
    for _ in range(plan.rounds):
        for block, probe in probes.items():
            if comm is not None:
                comm.Barrier()
            samples["smo_iteration", block].append(float(np.mean([probe() for _ in range(RESTART)])))
    return samples


class _Items(dict):
    """The timed callables by key, and the ``(case, state)`` of the suites' points by (suite, variant, dtype)."""
    points = None


def _items(stack, plan):
    items = _Items()
    items.points = {}
    rng = np.random.default_rng(0)
    for dtype in DTYPES:
        for n in plan.gemm_sizes:
            a, b = rng.random((n, n)).astype(dtype), rng.random((n, n)).astype(dtype)
            items["gemm", dtype, n] = _product(a, b)  # two operands: a @ a reads half the memory
        squares = [rng.random((plan.thin_side,) * 2).astype(dtype) for _ in range(THIN_OPERANDS)]
        for d in plan.thin_rows:
            items["gemm_thin", dtype, d] = _rotating_product(rng.random((d, plan.thin_side)).astype(dtype), squares)
        for side in plan.gemv_sides:
            a, x = np.full((side, side), 0.5, dtype), np.full(side, 0.5, dtype)  # any values: a GEMV's time
            items["gemv", dtype, side] = _product(a, x)
    for (kind, suite, variant, dtype, size), (case, state) in _suite_states(stack, plan):
        if kind in STEPS:
            items[kind, dtype, size] = _runner(case, state)
        else:
            items["suite", suite, variant, dtype] = _runner(case, state)
            items.points[suite, variant, dtype] = case, state
    for nbytes in plan.local_sizes:
        vector, other = np.ones(max(1, nbytes // 8)), np.ones(max(1, nbytes // 8))
        items["reduce", nbytes] = _adder(vector, other)
        items["copy", nbytes] = _copier(other, vector)
    items.update(_kernel_blocks())
    return items


def _product(a, b):
    return lambda: a @ b


def _rotating_product(a, operands):
    turn = itertools.cycle(operands)
    return lambda: a @ next(turn)


def _adder(vector, other):
    return lambda: np.add(vector, other, out=vector)


def _copier(target, source):
    return lambda: np.copyto(target, source)


def _runner(case, state):
    return lambda: case.run(state)


def check_suites(plan=FULL):
    """Set up (and tear down) every suite point `local_rates` times with ``plan`` on this rank alone: a suite
    setting of the environment it cannot use fails here, in a moment, before anything is measured."""
    with ExitStack() as stack:
        for _ in _suite_states(stack, plan):
            pass


def _suite_states(stack, plan):
    """``((kind, suite, variant, dtype, size), (case, state))`` of the suites' points (kind ``"suite"``) and the
    calibrated steps (kind: their table, `STEPS`)."""
    for dtype in DTYPES:
        for suite, variant, size in plan.suite_points:
            yield ("suite", suite, variant, dtype, size), _suite_state(stack, suite, variant, size, dtype)
        for table, (suite, variant, field) in STEPS.items():
            for size in getattr(plan, field):
                yield (table, suite, variant, dtype, size), _suite_state(stack, suite, variant, size, dtype)


def _suite_state(stack, suite, variant, size, dtype):
    """``(case, state)`` of ``suite``'s point on one rank (its settings as the environment gives them),
    torn down when ``stack`` closes."""
    from bench.registry import get_case
    from kernels.backend import get_backend

    case, comm = get_case(suite), MPI.COMM_SELF
    state = case.setup(comm, size, variant, get_backend("numpy", comm), dtype)
    stack.callback(case.teardown, state)
    return case, state


def _kernel_blocks():
    """``{("kernel", KERNEL_DIM, block): run}``: each run computes the RBF rows of its own `KERNEL_ROWS`
    samples against all `KERNEL_COLUMNS`, one row at a time."""
    from svm.solver.gram import make_kernel, squared_norms

    X = np.random.default_rng(0).random((KERNEL_COLUMNS, KERNEL_DIM))
    kernel = make_kernel("rbf", X)
    norms = squared_norms(X)

    def rows(block):
        chosen = [X[i:i + 1] for i in range(block * KERNEL_ROWS, (block + 1) * KERNEL_ROWS)]
        return lambda: [kernel.block(row, X, norms) for row in chosen]
    return {("kernel", KERNEL_DIM, block): rows(block) for block in range(KERNEL_BLOCKS)}
