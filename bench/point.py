"""One point of a sweep (`bench.sweep`): set up, time, check and tear down on every rank of its communicator.

Set-up, check, metrics and teardown go through `bench.faults.agree`; an error inside the timed work raised on
every rank is agreed (`bench.faults.failing_together`), on some ranks alone it aborts the job.
"""
import contextlib
import functools

from mpi4py import MPI

from bench.faults import AGREED, agree, failing_together
from bench.load import PointLoad
from bench.provenance import DevicePeak
from bench.stability import Resampling
from bench.timing import measure
from bench.units import format_size

#: Fewest untimed runs on a device backend: the first runs compile kernels and create cuBLAS handles.
DEVICE_WARMUP = 2


def measure_point(sub, node, threads, case, config, backend, variant, size, probe=None):
    """Set up, time, check and tear down one point (``variant`` at ``size``) on every rank of ``sub`` (``node``:
    this rank's ranks on its node, ``threads``: BLAS threads per rank, ``probe``: a `bench.load.MemoryProbe` on
    ``node`` to run right before the timed runs); return its row, less the columns the sweep adds (the point's
    identity, provenance, timestamp)."""
    peak = DevicePeak(backend)
    problem, iters, warmup, state = agree(sub, _prepare, sub, case, config, backend, variant, size)
    with _torn_down(sub, case, state):
        load = PointLoad(sub, node, threads, probe)
        with failing_together(sub):  # the same error on every rank: one line; on some ranks alone: abort
            timing = measure(sub, functools.partial(case.run, state), iters, warmup, backend.synchronize,
                             resampling=Resampling(config.max_spread, config.max_point_seconds))
        load = load.finish()
        wrong, metrics, params = agree(sub, _conclude, case, state, problem, timing, config.check)
        params["load"] = load
        wrong = sub.allreduce(wrong) if config.check else None
    if peak.on_device:
        params["device_peak_bytes"] = sub.allreduce(peak.bytes(), op=MPI.MAX)
    return dict(
        iters=iters, warmup=warmup, t_min_s=timing.t_min, t_med_s=timing.t_med, t_max_s=timing.t_max,
        spread=round(timing.spread, 4), stable=int(timing.stable(config.max_spread)),
        gflops=metrics.gflops, algbw_gbs=metrics.algbw_gbs, busbw_gbs=metrics.busbw_gbs,
        items_per_s=metrics.items_per_s, metric=metrics.metric, metric_value=metrics.metric_value,
        wrong=wrong, params=params, size_label=format_size(size),
    )


@contextlib.contextmanager
def _torn_down(sub, case, state):
    """Tear the point's ``state`` down on every rank of ``sub`` when the block ends, also by an
    `AGREED` error; any other error is one rank's alone and ends the job (no collective here)."""
    try:
        yield
    except AGREED:
        agree(sub, case.teardown, state)
        raise
    agree(sub, case.teardown, state)


def _prepare(sub, case, config, backend, variant, size):
    """The point's problem size (the suite's model), iterations, warm-up runs (>= `DEVICE_WARMUP` on a device),
    `case.setup`'s state."""
    problem = case.model.problem_size(size, sub.size, config.scaling)
    default_iters, default_warmup = case.iterations(problem)
    iters = config.iters or default_iters
    warmup = default_warmup if config.warmup is None else config.warmup
    if backend.name != "numpy":
        warmup = max(warmup, DEVICE_WARMUP)
    return problem, iters, warmup, case.setup(sub, problem, variant, backend, config.dtype)


def _conclude(case, state, problem, timing, check):
    """This rank's wrong elements (None unchecked), the point's metrics and params."""
    wrong = case.check(state) if check else None
    metrics = case.metrics(state, timing.t_med)  # before params: cases may gather figures there
    extra = {"samples": timing.samples} if timing.samples > timing.iters else {}  # sampled again: it was unstable
    return wrong, metrics, dict(case.params(state), problem_size=problem, repeats=timing.repeats, **extra)
