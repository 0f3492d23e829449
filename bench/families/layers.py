"""What the layer-parallel suites (tp, moe) share: their point state, the timed pass, checks, per-rank summaries."""
import math
import tracemalloc
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from mpi4py import MPI

from kernels.backend import array_module


def _on_host(array):
    """``array`` as a NumPy array (a copy of a device array; host arrays and scalars as they are)."""
    xp = array_module(array)
    return array if xp is np else xp.asnumpy(array)


def count_wrong(actual, expected, rtol):
    """Elements of ``actual`` outside ``rtol`` of ``expected`` (atol ``rtol * max |expected|``); a shape mismatch
    counts every element. Either may be a device array (compared on the host)."""
    actual, expected = _on_host(actual), _on_host(expected)
    if np.shape(actual) != np.shape(expected):
        return int(max(np.size(actual), np.size(expected)))
    atol = rtol * float(np.max(np.abs(expected), initial=0.0))
    return int(np.count_nonzero(~np.isclose(actual, expected, rtol=rtol, atol=atol)))


@dataclass
class MeasuredState:
    """A point of the tp or moe suite: the layer, its inputs, this rank's tokens, run counters and peak memory."""

    comm: object
    variant: str
    dtype: str
    size: int
    settings: dict
    model: object
    x: np.ndarray
    dy: np.ndarray
    tokens: slice
    runs: int = 0
    run_seconds: float = 0.0
    peak_bytes: Optional[int] = None
    result: tuple = ()
    summary: dict = field(default_factory=dict)
    #: The point's `kernels.backend.Backend` (None: NumPy); a timed pass ends with its ``synchronize``
    #: and the check moves device results to the host (``to_host``).
    backend: object = None


def run_forward_backward(state):
    """One forward and backward pass of ``state.model`` on this rank's tokens, results in ``state.result``.

    The first call (never timed by the harness) measures peak memory: parameter,
    gradient and input bytes plus the tracemalloc peak (host allocations only); then the model's
    communication counter (if any) restarts, so that per-run figures cover the later runs.
    """
    model = state.model

    def work():
        y = model.forward(state.x[state.tokens])
        state.result = (y, model.backward(state.dy[state.tokens]))

    if state.peak_bytes is None:
        tracemalloc.start()
        work()
        resident = sum(p.nbytes + g.nbytes for p, g in model.parameters()) + state.x.nbytes + state.dy.nbytes
        state.peak_bytes = resident + tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        if hasattr(model, "counter"):
            model.counter.reset()
        return
    start = MPI.Wtime()
    work()
    if state.backend is not None:
        state.backend.synchronize()
    state.run_seconds += MPI.Wtime() - start
    state.runs += 1


def per_rank_summary(state, comm_seconds, bytes_sent):
    """Per-rank bytes sent and comm share per run, and peak MB, gathered on every rank (collective)."""
    runs = max(state.runs, 1)
    share = comm_seconds / state.run_seconds if state.run_seconds > 0 else math.nan
    rows = state.comm.allgather((bytes_sent // runs, round(share, 4), round(state.peak_bytes / 1e6, 3)))
    sent, shares, peaks = (list(column) for column in zip(*rows))
    return dict(bytes_sent_per_rank=sent, comm_share_per_rank=shares, peak_mem_mb_per_rank=peaks,
                memory="estimate: params, grads and inputs + tracemalloc peak of the first run")
