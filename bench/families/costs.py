"""Cost-model terms the suites' `predict` methods share, from a calibration (`bench.report.model`).

Every function takes the calibration dict ``calib`` first and returns seconds.
Messages and local memory passes are interpolated in the measured tables (so
latency-bound sizes carry the Python path and cache effects the fits miss);
beyond the largest measured size the last slope continues. Compute uses the
calibrated rates at the point's dtype (``calib["point_dtype"]``, set by the
report; float64 otherwise) and at the BLAS threads the harness gives a rank,
``cores // ranks`` (at least 1), interpolated between the one-thread and
all-cores rates.
"""
import bisect
import math

from parallel.collectives.auto import choose

WORD_TYPES = {"float16": 2, "float32": 4, "float64": 8}


def interpolate(table, x):
    """Piecewise-linear value of ``[[x, y], ...]`` (sorted by x) at ``x``; the first y below, the last slope above."""
    xs = [row[0] for row in table]
    if x <= xs[0]:
        return table[0][1]
    index = min(bisect.bisect_left(xs, x), len(xs) - 1)
    (x0, y0), (x1, y1) = table[index - 1], table[index]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def itemsize(calib):
    """Bytes of one element of the point's dtype."""
    return WORD_TYPES.get(calib.get("point_dtype", "float64"), 8)


def message(calib, nbytes):
    """One blocking message of ``nbytes`` from Python (mpi4py call included): the one-way ping-pong time."""
    return interpolate(calib["pingpong"], max(nbytes, 1))


def wire(calib, nbytes):
    """One message inside an MPI collective (no Python call per message)."""
    return max(message(calib, nbytes) - calib["overhead_s"], 0.0)


def reduction(calib, nbytes):
    """One in-place NumPy addition of ``nbytes`` (a call of a few microseconds at small sizes)."""
    return interpolate(calib["reduce"], max(nbytes, 1))


def copy(calib, nbytes):
    """One NumPy copy of ``nbytes``."""
    return interpolate(calib["copy"], max(nbytes, 1))


def threads(calib, ranks):
    """BLAS threads per rank under the harness's default: the cores shared out, at least 1."""
    return max(1, int(calib["cores"]) // max(ranks, 1))


def _rate(calib, pair, ranks):
    """A ``[one thread, all cores]`` rate at the threads of one of ``ranks`` ranks."""
    one, every = pair
    cores = int(calib["cores"])
    return one if cores == 1 else one + (every - one) * (threads(calib, ranks) - 1) / (cores - 1)


def gemm(calib, m, n, k, ranks):
    """A product of (m, k) by (k, n) on one of ``ranks`` ranks, at the rate of the square size of equal work."""
    if min(m, n, k) <= 0:
        return 0.0
    table = calib["gemm"][calib.get("point_dtype", "float64") if calib.get("point_dtype") in calib["gemm"]
                          else "float64"]
    side = (m * n * k) ** (1 / 3)
    rates = [[size, _rate(calib, [table[0][i], table[-1][i]], ranks)] for i, size in enumerate(calib["gemm_sizes"])]
    return 2 * m * n * k / interpolate(rates, side)


def suite_rate(calib, suite, variant, ranks):
    """Flop/s of ``suite``'s calibrated kernel ``variant`` (`bench.report.calibrate.SUITE_POINTS`) on one rank."""
    by_dtype = calib[suite]
    table = by_dtype.get(calib.get("point_dtype", "float64")) or by_dtype["float64"]
    return _rate(calib, table[variant], ranks)


def allreduce(calib, nbytes, ranks, algorithm="mpi"):
    """An allreduce of ``nbytes`` per rank.

    ``mpi``: MPI_Allreduce, one Python call, then recursive doubling or Rabenseifner
    (MPICH's choice: the cheaper); the hand-written algorithms pay a Python message
    and a NumPy reduction per step: ring 2(p-1) steps of n/p, recursive doubling
    log2 p' steps of n, Rabenseifner 2 log2 p' steps of halving sizes, tree ceil(log2 p)
    reduce and broadcast steps of n. Non-powers of two add a fold (two messages of n
    and a reduction). One rank: a copy.
    """
    p, n = ranks, nbytes
    if p == 1:
        return calib["overhead_s"] + copy(calib, n)
    pow2 = 1 << (p.bit_length() - 1)
    rounds = pow2.bit_length() - 1
    python = algorithm != "mpi"
    send = message if python else wire
    fold = 0.0 if p == pow2 else 2 * send(calib, n) + reduction(calib, n)
    halves = sum(send(calib, n / 2**(r + 1)) * 2 + reduction(calib, n / 2**(r + 1)) for r in range(rounds))
    costs = dict(
        ring=(p - 1) * (2 * message(calib, n / p) + reduction(calib, n / p)),
        recursive_doubling=fold + rounds * (send(calib, n) + reduction(calib, n)),
        rabenseifner=fold + halves,
        tree=math.ceil(math.log2(p)) * (2 * message(calib, n) + reduction(calib, n)),
    )
    if not python:
        return calib["overhead_s"] + min(costs["recursive_doubling"], costs["rabenseifner"])
    return costs[choose(p, n) if algorithm == "auto" else algorithm]


def allgather(calib, nbytes, ranks):
    """MPI_Allgather of ``nbytes`` in all (n / p from each rank): p - 1 ring steps."""
    return calib["overhead_s"] + (ranks - 1) * wire(calib, nbytes / ranks) + (copy(calib, nbytes / ranks)
                                                                             if ranks > 1 else 0.0)


def reduce_scatter(calib, nbytes, ranks):
    """MPI_Reduce_scatter of ``nbytes`` in all: p - 1 ring steps, each a message and a reduction of n / p."""
    return calib["overhead_s"] + (ranks - 1) * (wire(calib, nbytes / ranks) + reduction(calib, nbytes / ranks))


def alltoall(calib, nbytes, ranks):
    """MPI_Alltoall(v) of ``nbytes`` per rank in all: p - 1 pairwise messages of n / p."""
    return calib["overhead_s"] + (ranks - 1) * wire(calib, nbytes / ranks)


def calls(calib, count):
    """``count`` small NumPy calls (the Python path of element-wise steps), at the 8-byte reduction's time."""
    return count * reduction(calib, 8)


def dense_layers(calib, widths, rows, ranks, split=1):
    """``(forward, backward)`` seconds of Linear layers ``widths[i] -> widths[i + 1]`` (each followed by an
    element-wise step) on ``rows`` rows, output widths split ``split`` ways: per layer one GEMM forward,
    two backward, and a few element-wise calls."""
    item = itemsize(calib)
    layers = [(inputs, math.ceil(outputs / split)) for inputs, outputs in zip(widths, widths[1:])]
    forward = sum(gemm(calib, rows, o, i, ranks) + copy(calib, rows * o * item) + calls(calib, 4) for i, o in layers)
    backward = sum(2 * gemm(calib, rows, o, i, ranks) + 2 * copy(calib, rows * o * item) + calls(calib, 6)
                   for i, o in layers)
    return forward, backward


def pipeline(calib, stage_s, activation_bytes, micro_batches, stages, flush=True):
    """A pipeline step: ``m + p - 1`` slots of the busiest stage's micro-batch time (``m`` without a flush:
    PipeDream's steady state) and, on several stages, a forward and a backward message per micro-batch."""
    slots = micro_batches + (stages - 1 if flush else 0)
    sends = 2 * micro_batches * message(calib, activation_bytes) if stages > 1 else 0.0
    return slots * stage_s + sends
