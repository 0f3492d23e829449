"""Cost-model terms of collectives (`bench.models`, `predict`): MPI's calls and the hand-written algorithms.

Every function takes the calibration dict ``calib`` first and returns seconds, from the message,
exchange and memory terms of `bench.models.terms`: an allreduce by algorithm (MPI's grown from its
calibrated call on two ranks), MPI's other collectives by their formulas in calibrated messages and
scaled from their calibrated calls (`library`), and a hand-written collective from one rank's steps
(`schedule`, on the busiest sampled rank: `hand_written`).
"""
import bisect

from bench.models.terms import (copy, exchange, exchange_fresh, exchange_wire, interpolate, log2_ceil, message,
                                message_fresh, reduction, wire)
from parallel.collectives.auto import choose


def allreduce(calib, nbytes, ranks, algorithm="mpi", written=False):
    """An allreduce of ``nbytes`` per rank (``written``: of a buffer the caller has just written, as gradients
    after the backward pass: the hand-written algorithms' first exchange of it is fresh too).

    ``mpi``: MPI_Allreduce at the calibrated time of the library's own allreduce on two
    ranks, scaled to ``ranks`` as recursive doubling or Rabenseifner (MPICH's choice: the
    cheaper) scale. The hand-written algorithms pay the calibrated Python path of a call
    (``call_s``) and the steps of their schedules (`parallel.collectives.ALLREDUCE_SCHEDULES`, as
    `hand_written` prices them on the busiest rank, in closed form: a projection to a million ranks stays
    instant), where a send of bytes the call reduced or received before is an `exchange_fresh`: ring one
    exchange of its input and 2p - 3 fresh ones of n/p, p - 1 reductions; recursive doubling log2 p'
    exchanges and reductions of n, the first of its input; Rabenseifner log2 p' exchanges of halving sizes
    (reduce-scatter, the first of its input) and as many fresh ones back (allgather), log2 p' reductions; tree
    ceil(log2 p) one-way messages of n up (each reduced) and as many `message_fresh` of its result down.
    Non-powers of two add a fold (a one-way message of n, a reduction and a `message_fresh` of the result
    back) on the ranks that take one, whose exchanges are then all fresh.
    On 2 ranks the ring at 256 KiB-4 MiB took 2.9-4x two clean exchanges in three of four calibrate + sweep
    pairs here, when the calibration's fresh exchange was 3-3.4x a clean one. ``hierarchical`` is priced as
    its part inside one node, the ring (a calibration measures one node, or one pair across two). One rank:
    the call and a copy.
    """
    p, n = ranks, nbytes
    if algorithm == "mpi":
        if p == 1:
            return calib["overhead_s"] + copy(calib, n)
        library = max(interpolate(calib["allreduce"], max(n, 1)) - calib["overhead_s"], 0.0)
        base = _library_steps(calib, n, 2)
        return calib["overhead_s"] + library * (_library_steps(calib, n, p) / base if base > 0 else 1.0)
    if p == 1:
        return calib["call_s"] - copy(calib, 8) + copy(calib, n)
    algorithm = {"auto": choose(p, n), "hierarchical": "ring"}.get(algorithm, algorithm)
    first = exchange_fresh if written else exchange
    if algorithm == "ring":
        block = n / p
        return calib["call_s"] + first(calib, block) + (2 * p - 3) * exchange_fresh(calib, block) + \
            (p - 1) * reduction(calib, block)
    if algorithm == "tree":  # the root: the first message up its input (fresh if written), each down its result
        levels = log2_ceil(p)
        return calib["call_s"] + (message_fresh if written else message)(calib, n) + (levels - 1) * message(calib, n) \
            + levels * (reduction(calib, n) + message_fresh(calib, n))
    pow2 = 1 << (p.bit_length() - 1)
    rounds = pow2.bit_length() - 1
    if algorithm == "recursive_doubling":
        sizes, back = [n] * rounds, []
    else:  # rabenseifner: recursive halving, then doubling back
        sizes = [n / 2**(r + 1) for r in range(rounds)]
        back = sizes
    reductions = sum(reduction(calib, size) for size in sizes)
    later = sum(exchange_fresh(calib, size) for size in sizes[1:] + back)
    steps = first(calib, sizes[0]) + later + reductions
    if p > pow2:  # a rank that took a fold: every exchange sends what it reduced
        folded = message(calib, n) + message_fresh(calib, n) + reduction(calib, n) + exchange_fresh(calib, sizes[0]) \
            + later + reductions
        steps = max(steps, folded)
    return calib["call_s"] + steps


def hand_written(calib, build, ranks, items, itemsize, counts=None, in_place=False):
    """Modelled seconds of one call of the schedule builder ``build`` (``(rank, p, n, itemsize, in_place[,
    counts]) -> Schedule``) on ``ranks`` ranks, for ``items`` items (blocks ``counts``): its `schedule` on the
    busiest of a few sampled ranks (rank 0, 1, the middle and the last; the algorithms are symmetric or rooted
    at 0), plus the Python path of one call (``call_s``)."""
    given = () if counts is None else (counts,)
    sampled = sorted({0, 1, ranks // 2, ranks - 1} & set(range(ranks)))
    return calib["call_s"] + max(schedule(calib, build(rank, ranks, items, itemsize, in_place, *given), itemsize)
                                 for rank in sampled)


def _library_steps(calib, n, p):
    """Seconds of the cheaper of recursive doubling and Rabenseifner inside MPI (no Python per step) on ``p``
    ranks: how the library's allreduce grows with ``p``."""
    pow2 = 1 << (p.bit_length() - 1)
    rounds = pow2.bit_length() - 1
    fold = 0.0 if p == pow2 else 2 * wire(calib, n) + reduction(calib, n)
    halves = sum(exchange_wire(calib, n / 2**(r + 1)) * 2 + reduction(calib, n / 2**(r + 1)) for r in range(rounds))
    return fold + min(rounds * (exchange_wire(calib, n) + reduction(calib, n)), halves)


def library(calib, suite, nbytes, ranks, formula):
    """MPI's call of collective ``suite`` (`bench.library_tables.SUITES`) of ``nbytes`` on ``ranks`` ranks: its
    calibrated time on two ranks (``library``), scaled to ``ranks`` as ``formula`` (MPI's algorithm in
    calibrated messages, ``formula(calib, nbytes, p)``) grows from two ranks; ``formula`` itself on one rank
    and for a calibration without the table."""
    table = calib.get("library", {}).get(suite)
    if not table or ranks == 1:
        return formula(calib, nbytes, ranks)
    measured = max(interpolate(table, max(nbytes, 1)) - calib["overhead_s"], 0.0)
    base = formula(calib, nbytes, 2) - calib["overhead_s"]
    growth = (formula(calib, nbytes, ranks) - calib["overhead_s"]) / base if base > 0 else 1.0
    return calib["overhead_s"] + measured * growth


def allgather(calib, nbytes, ranks):
    """MPI_Allgather of ``nbytes`` in all (n / p from each rank): p - 1 ring steps."""
    return calib["overhead_s"] + (ranks - 1) * exchange_wire(calib, nbytes / ranks) + (
        copy(calib, nbytes / ranks) if ranks > 1 else 0.0)


def reduce_scatter(calib, nbytes, ranks):
    """MPI_Reduce_scatter of ``nbytes`` in all: p - 1 ring steps, each an exchange and a reduction of n / p."""
    return calib["overhead_s"] + (ranks - 1) * (exchange_wire(calib, nbytes / ranks) + reduction(calib, nbytes / ranks))


def alltoall(calib, nbytes, ranks):
    """MPI_Alltoall(v) of ``nbytes`` per rank in all: p - 1 pairwise exchanges of n / p."""
    return calib["overhead_s"] + (ranks - 1) * exchange_wire(calib, nbytes / ranks)


def schedule(calib, steps, itemsize):
    """One rank's steps of a hand-written collective (a `parallel.collectives.schedule.Schedule`) on
    items of ``itemsize`` bytes: a step sending and receiving pays an `exchange` per pair of its
    messages (the larger of the two; an `exchange_fresh` when the send is of bytes the call wrote before:
    received, or an op's output), a step one way a `message` each (a `message_fresh` for a send of bytes
    the call wrote); its reductions and copies a `reduction` or a `copy` of their bytes, its early copies
    too: MPICH moves a message between ranks of a node only inside an MPI call, so a copy made while the
    messages are posted does not hide behind them (an allgather ring of 1 MiB on 2 ranks here: 77 us,
    against 59 us for its exchange alone and 74 us for the exchange, then the copy). The Python path of the
    call is the caller's (`hand_written`)."""
    total, written = 0.0, _Written()
    for sends, recvs, ops in steps.steps:
        sent, received = ([(part.stop - part.start) * itemsize for (_, part), _ in side] for side in (sends, recvs))
        if sent and received:
            pairs = max(len(sent), len(received))
            fresh = [written.overlaps(view) for view, _ in sends] + [False] * (pairs - len(sent))
            sent, received = sent + [0] * (pairs - len(sent)), received + [0] * (pairs - len(received))
            total += sum((exchange_fresh if new else exchange)(calib, max(a, b))
                         for a, b, new in zip(sent, received, fresh))
        else:
            total += sum((message_fresh if written.overlaps(view) else message)(calib, nbytes)
                         for (view, _), nbytes in zip(sends, sent)) + sum(message(calib, n) for n in received)
        for kind, *views in ops:
            part = views[-1][1]
            total += (reduction if kind == "reduce" else copy)(calib, (part.stop - part.start) * itemsize)
        for view in [view for view, _ in recvs] + [views[-1] for _, *views in ops]:
            written.add(view)
    return total


class _Written:
    """The parts of a call's buffers it has written, per buffer as sorted disjoint ``[start, stop)`` ranges
    (touching ones merged): a ring on p ranks writes 2p blocks, checked at every step in O(log p)."""

    def __init__(self):
        self.ranges = {}

    def add(self, view):
        """Record the ``(buffer, slice)`` ``view`` as written (an empty one writes nothing)."""
        name, part = view
        if part.start >= part.stop:
            return
        starts, stops = self.ranges.setdefault(name, ([], []))
        first = bisect.bisect_left(stops, part.start)     # the first range ending at or after its start
        last = bisect.bisect_right(starts, part.stop)     # past the last range starting at or before its stop
        start, stop = part.start, part.stop
        if first < last:
            start, stop = min(start, starts[first]), max(stop, stops[last - 1])
        starts[first:last], stops[first:last] = [start], [stop]

    def overlaps(self, view):
        """Whether the ``(buffer, slice)`` ``view`` overlaps a part written (an empty one sends nothing written)."""
        name, part = view
        if part.start >= part.stop:
            return False
        starts, stops = self.ranges.get(name, ((), ()))
        index = bisect.bisect_right(starts, part.start) - 1  # the last range starting at or before it
        return (index >= 0 and stops[index] > part.start) or \
            (index + 1 < len(starts) and starts[index + 1] < part.stop)


def bcast(calib, nbytes, ranks):
    """MPI_Bcast of ``nbytes``: the cheaper of a binomial tree (``ceil(log2 p)`` messages of n on the
    critical path) and a scatter then ring allgather (``ceil(log2 p)`` messages and ``p - 1`` exchanges of
    n / p), as MPICH chooses by size."""
    if ranks == 1:
        return calib["overhead_s"]
    tree = log2_ceil(ranks) * wire(calib, nbytes)
    block = nbytes / ranks
    return calib["overhead_s"] + min(tree, log2_ceil(ranks) * wire(calib, block)
                                     + (ranks - 1) * exchange_wire(calib, block))


def reduce(calib, nbytes, ranks):
    """MPI_Reduce of ``nbytes``: the cheaper of a binomial tree (``ceil(log2 p)`` messages and reductions
    of n) and a reduce-scatter then gather (``p - 1`` exchanges and reductions of n / p, then
    ``ceil(log2 p)`` messages of n / p), as MPICH chooses by size."""
    if ranks == 1:
        return calib["overhead_s"] + copy(calib, nbytes)
    tree = log2_ceil(ranks) * (wire(calib, nbytes) + reduction(calib, nbytes))
    block = nbytes / ranks
    scatter_gather = (ranks - 1) * (exchange_wire(calib, block) + reduction(calib, block)) + log2_ceil(ranks) * wire(
        calib, block)
    return calib["overhead_s"] + min(tree, scatter_gather)
