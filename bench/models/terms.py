"""Cost-model terms every suite's model (`bench.models`, `predict`) shares, from a calibration (`bench.report.model`).

Every function takes the calibration dict ``calib`` first and returns seconds.
Messages and local memory passes are interpolated in the measured tables (so
latency-bound sizes carry the Python path and cache effects the fits miss);
beyond the largest measured size the last slope continues. Compute uses the
calibrated rates at the point's dtype (``calib["point_dtype"]``, set by the
report; float64 otherwise) and at the BLAS threads the harness gives a rank,
``cores // ranks`` (at least 1), interpolated between the one-thread and
all-cores rates.

A point on two or more ranks (``ranks``, or ``calib["point_ranks"]`` set by the
report where a term has no ranks) shares the node: its rates are scaled by what
sharing cost in the calibration (the ``busy`` rate over the alone rate at the
same threads), and its memory passes use the ``busy`` tables. Steps of
collectives where both ranks of a pair send at once are priced at the
calibrated ``exchange``, not two one-way messages. The collectives' own terms (MPI's calls
and the hand-written algorithms) are `bench.models.collective_terms`'.
"""
import bisect
import math

WORD_TYPES = {"float16": 2, "float32": 4, "float64": 8}
#: Sizes of the ``oneway`` table whose rounds are all latency: the fastest is two empty-ish messages.
ACKNOWLEDGED_BELOW = 1024


def interpolate(table, x):
    """Piecewise-linear value of ``[[x, y], ...]`` (sorted by x) at ``x``; the first y below, the last slope above."""
    xs = [row[0] for row in table]
    if x <= xs[0]:
        return table[0][1]
    index = min(bisect.bisect_left(xs, x), len(xs) - 1)
    (x0, y0), (x1, y1) = table[index - 1], table[index]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def holds(table, x):
    """Whether ``[[x, y], ...]`` has an entry measured at ``x`` (not one `interpolate` draws between two)."""
    return any(row[0] == x for row in table)


def itemsize(calib):
    """Bytes of one element of the point's dtype."""
    return WORD_TYPES.get(calib.get("point_dtype", "float64"), 8)


def _shared(calib, ranks=None):
    """The ``busy`` measurements when the point runs on two or more ranks and the calibration has them."""
    ranks = calib.get("point_ranks", 1) if ranks is None else ranks
    return calib.get("busy") if ranks >= 2 else None


def _memory_table(calib, key):
    return (_shared(calib) or calib)[key]


def pingpong(calib, nbytes):
    """Half a blocking round trip of ``nbytes`` from Python (mpi4py calls included): the ping-pong table."""
    return interpolate(calib["pingpong"], max(nbytes, 1))


def message(calib, nbytes):
    """One blocking message of ``nbytes`` one way from Python (mpi4py call included), as a step of a program
    sends it: the ``oneway`` table (a message and its empty acknowledgement) less the acknowledgement, half its
    fastest entry up to `ACKNOWLEDGED_BELOW`; a `pingpong` in a calibration without that table."""
    table = calib.get("oneway")
    if not table:
        return pingpong(calib, nbytes)
    acknowledgement = min(seconds for n, seconds in table if n <= ACKNOWLEDGED_BELOW or n == table[0][0]) / 2
    return max(interpolate(table, max(nbytes, 1)) - acknowledgement, 0.0)


def wire(calib, nbytes):
    """One message inside an MPI collective (no Python call per message)."""
    return max(message(calib, nbytes) - calib["overhead_s"], 0.0)


def exchange(calib, nbytes):
    """One ``Sendrecv`` from Python of ``nbytes`` each way, the partner sending at the same time."""
    return interpolate(calib["exchange"], max(nbytes, 1))


def exchange_fresh(calib, nbytes):
    """An `exchange` whose send buffer this rank wrote just before (`bench.message_tables`' ``exchange_fresh``:
    what it received the call before); a plain `exchange` for a calibration without the table."""
    table = calib.get("exchange_fresh")
    return interpolate(table, max(nbytes, 1)) if table else exchange(calib, nbytes)


def message_fresh(calib, nbytes):
    """A `message` of bytes the sender wrote just before (what it reduced or received in the same call): the
    message plus what writing cost the calibrated exchange (`exchange_fresh` less `exchange`). Measured here on
    2 ranks: a send of 1 MiB just written took 442 us against 86 us clean, the same 5x as an exchange (437
    against 90 us)."""
    return message(calib, nbytes) + max(exchange_fresh(calib, nbytes) - exchange(calib, nbytes), 0.0)


def exchange_wire(calib, nbytes):
    """One step of an MPI collective where both ranks of a pair send ``nbytes`` at once."""
    return max(exchange(calib, nbytes) - calib["overhead_s"], 0.0)


def stream(calib, nbytes):
    """One message of ``nbytes`` in a window of non-blocking sends (the gap between messages)."""
    return interpolate(calib["stream"], max(nbytes, 1))


def reduction(calib, nbytes):
    """One in-place NumPy addition of ``nbytes`` (a call of a few microseconds at small sizes)."""
    return interpolate(_memory_table(calib, "reduce"), max(nbytes, 1))


def copy(calib, nbytes):
    """One NumPy copy of ``nbytes``."""
    return interpolate(_memory_table(calib, "copy"), max(nbytes, 1))


def threads(calib, ranks):
    """BLAS threads per rank under the harness's default: the cores shared out, at least 1."""
    return max(1, int(calib["cores"]) // max(ranks, 1))


def _rate(calib, pair, ranks, busy=None, count=None):
    """A ``[one thread, all cores]`` rate (or time) at ``count`` threads (default: those of one of ``ranks``
    ranks; at most the cores), scaled by ``busy / (the pair at the busy measurement's threads)`` when ``ranks``
    share the node."""
    one, every = pair
    cores = int(calib["cores"])

    def at(count):
        return one if cores == 1 else one + (every - one) * (count - 1) / (cores - 1)
    shared = _shared(calib, ranks)
    count = threads(calib, ranks) if count is None else min(max(count, 1), cores)
    return at(count) * (busy / at(shared["threads"]) if shared and busy is not None else 1.0)


def _at_dtype(calib, table):
    """The entry of ``table`` (a dict by dtype name) at the point's dtype, float64 when it has none."""
    return table.get(calib.get("point_dtype", "float64")) or table["float64"]


def gemm(calib, m, n, k, ranks):
    """A product of (m, k) by (k, n) on one of ``ranks`` ranks, at the rate of the square size of equal work
    (the largest calibrated size's rate beyond it: a rate extrapolated along a slope could turn negative),
    times the efficiency of a product as thin as this one (`thin_efficiency`)."""
    if min(m, n, k) <= 0:
        return 0.0
    side = (m * n * k) ** (1 / 3)
    return 2 * m * n * k / (_square_rate(calib, side, ranks) * thin_efficiency(calib, min(m, n, k) / side, ranks))


def _square_rate(calib, side, ranks):
    """Flop/s of a square product of ``side`` on one of ``ranks`` ranks (interpolated in the calibrated sizes)."""
    table = _at_dtype(calib, calib["gemm"])
    busy = _at_dtype(calib, _shared(calib, ranks)["gemm"]) if _shared(calib, ranks) else [None] * len(table[0])
    rates = [[size, _rate(calib, [table[0][i], table[-1][i]], ranks, busy[i])]
             for i, size in enumerate(calib["gemm_sizes"])]
    return interpolate(rates, min(side, calib["gemm_sizes"][-1]))  # no slope beyond the table


def kernel_rows(calib, ranks):
    """RBF kernel entries per second (784 features, one row at a time) on one of ``ranks`` ranks: the
    calibrated ``[one thread, all cores]`` pair at the rank's threads (an older file's one number as it is),
    scaled by what sharing the node cost (``busy``) on two or more ranks."""
    rate, shared = calib["kernel_rows"], _shared(calib, ranks)
    if not isinstance(rate, list):
        return rate
    return _rate(calib, rate, ranks, shared.get("kernel_rows") if shared else None)


def thin_efficiency(calib, aspect, ranks):
    """The rate of a product whose smallest side is ``aspect`` times the cube root of its work, over the square
    rate of equal work: piecewise linear in ``aspect`` through the calibrated thin products
    (``gemm_thin``: ``(d, S) @ (S, S)``, aspect ``d / (d S^2)^(1/3)``, at most 1) and 1 at aspect 1; the
    thinnest one's below it; 1 for a calibration without them (written before they were measured)."""
    if "gemm_thin" not in calib or aspect >= 1:
        return 1.0
    table, shared, square = _at_dtype(calib, calib["gemm_thin"]), _shared(calib, ranks), calib["thin_side"] ** 2
    busy = _at_dtype(calib, shared["gemm_thin"]) if shared and "gemm_thin" in shared else [None] * len(table[0])
    points = [[1.0, 1.0]]
    for i, rows in enumerate(calib["thin_rows"]):
        side = (rows * square) ** (1 / 3)
        rate = _rate(calib, [table[0][i], table[-1][i]], ranks, busy[i])
        points.append([rows / side, min(rate / _square_rate(calib, side, ranks), 1.0)])
    return interpolate(sorted(points), aspect)


def gemm_peak(calib, ranks, count=None):
    """Flop/s of the largest calibrated GEMM at the point's dtype on one of ``ranks`` ranks with ``count``
    BLAS threads (default: the harness's share of the cores), scaled by the calibrated cost of sharing the node
    (``busy``) on two or more ranks: the peak a rank's compute is measured against."""
    table = _at_dtype(calib, calib["gemm"])
    shared = _shared(calib, ranks)
    return _rate(calib, [table[0][-1], table[-1][-1]], ranks,
                 _at_dtype(calib, shared["gemm"])[-1] if shared else None, count)


def suite_rate(calib, suite, variant, ranks):
    """Flop/s of ``suite``'s calibrated kernel ``variant`` (`bench.local_rates.SUITE_POINTS`) on one rank."""
    shared = _shared(calib, ranks)
    return _rate(calib, _at_dtype(calib, calib[suite])[variant], ranks,
                 _at_dtype(calib, shared[suite])[variant] if shared else None)


def _paired_table(calib, key, ranks):
    """``[(x, seconds), ...]`` of the table ``calib[key]`` (by dtype, ``[[x, [one thread, all cores]], ...]``,
    `bench.local_rates`) at the point's dtype and the threads and sharing of one of ``ranks`` ranks (the
    ``busy`` table's entries where the ranks share the node and it has them)."""
    shared = _shared(calib, ranks)
    alone = _at_dtype(calib, calib[key])
    busy = [seconds for _, seconds in _at_dtype(calib, shared[key])] if shared and key in shared else \
        [None] * len(alone)
    return [(x, _rate(calib, pair, ranks, value)) for (x, pair), value in zip(alone, busy)]


def gemv(calib, nbytes, ranks):
    """A local ``A @ x`` reading ``nbytes`` of matrix, in the calibrated GEMVs by matrix bytes (`bench.local_rates`)
    at the threads and sharing of one of ``ranks`` ranks; None for a calibration without them (older files)."""
    if "gemv" not in calib:
        return None
    return interpolate(_paired_table(calib, "gemv", ranks), max(nbytes, 1))


def read(calib, nbytes, ranks):
    """One NumPy pass reading ``nbytes`` (a max, a min, a dot product) on one of ``ranks`` ranks: the calibrated
    GEMV of a matrix of those bytes (`gemv`: a read from the cache or from memory), or, for a calibration
    without GEMVs, half a copy of them (a copy reads and writes)."""
    seconds = gemv(calib, nbytes, ranks)
    return copy(calib, nbytes / 2) if seconds is None else seconds


def fitted_step(calib, key, modelled, ranks, rows):
    """``(a, b)``: the line ``seconds = a + b modelled(rows)`` through the two calibrated steps ``calib[key]``
    (by dtype, ``[[rows, [one thread, all cores]], ...]``, `bench.local_rates`) around ``rows``
    (the first or last two beyond them) at the threads and sharing of one of ``ranks`` ranks. ``a``: the
    fixed seconds of a step (Python calls the model does not count); ``b``: the scale of the modelled
    seconds (1 when they do not grow)."""
    steps = _paired_table(calib, key, ranks)
    upper = min(max(bisect.bisect_left([count for count, _ in steps], rows), 1), len(steps) - 1)
    (r0, t0), (r1, t1) = steps[upper - 1:upper + 1]
    m0, m1 = modelled(r0), modelled(r1)
    scale = (t1 - t0) / (m1 - m0) if m1 > m0 * (1 + 1e-9) else 1.0
    return t0 - scale * m0, scale


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


def log2_ceil(p):
    """Rounds of a binomial tree over ``p`` ranks."""
    return max(0, (p - 1).bit_length())
