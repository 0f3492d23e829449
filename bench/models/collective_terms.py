"""Cost-model terms of collectives (`bench.models`, `predict`): MPI's calls and the hand-written algorithms.

Every function takes the calibration dict ``calib`` first and returns seconds, from the message,
exchange and memory terms of `bench.models.terms`: an allreduce by algorithm (MPI's grown from its
calibrated call on two ranks), MPI's other collectives by their formulas in calibrated messages and
scaled from their calibrated calls (`library`), and a hand-written collective from one rank's steps
(`schedule`, on the busiest sampled rank: `hand_written`).
"""
import math

from bench.models.terms import (copy, exchange, exchange_fresh, exchange_wire, interpolate, log2_ceil, message,
                                reduction, wire)
from parallel.collectives.auto import choose


def allreduce(calib, nbytes, ranks, algorithm="mpi"):
    """An allreduce of ``nbytes`` per rank.

    ``mpi``: MPI_Allreduce at the calibrated time of the library's own allreduce on two
    ranks, scaled to ``ranks`` as recursive doubling or Rabenseifner (MPICH's choice: the
    cheaper) scale. The hand-written algorithms pay the calibrated Python path of a call
    (``call_s``) and, per step, a Python call and a NumPy reduction: ring 2(p-1)
    exchanges of n/p and p-1 reductions, recursive doubling log2 p' exchanges and
    reductions of n, Rabenseifner 2 log2 p' exchanges of halving sizes (reduce-scatter,
    then allgather) and log2 p' reductions, tree ceil(log2 p) one-way messages of n up
    (each reduced) and as many down. Non-powers of two add a fold (two one-way messages
    of n and a reduction). ``hierarchical`` is priced as its part inside one node, the ring (a
    calibration measures one node, or one pair across two). One rank: the call and a copy.
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
    pow2 = 1 << (p.bit_length() - 1)
    rounds = pow2.bit_length() - 1
    fold = 0.0 if p == pow2 else 2 * message(calib, n) + reduction(calib, n)
    halves = sum(exchange(calib, n / 2**(r + 1)) * 2 + reduction(calib, n / 2**(r + 1)) for r in range(rounds))
    costs = dict(
        ring=(p - 1) * (2 * exchange(calib, n / p) + reduction(calib, n / p)),
        recursive_doubling=fold + rounds * (exchange(calib, n) + reduction(calib, n)),
        rabenseifner=fold + halves,
        tree=math.ceil(math.log2(p)) * (2 * message(calib, n) + reduction(calib, n)),
    )
    costs["hierarchical"] = costs["ring"]  # on the calibration's one node: its intra-node ring
    return calib["call_s"] + costs[choose(p, n) if algorithm == "auto" else algorithm]


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
    received, or an op's output), a step one way a `message` each; its reductions and copies a
    `reduction` or a `copy` of their bytes, its early copies a `copy` behind the messages (the larger of
    the two). The Python path of the call is the caller's (`hand_written`)."""
    total, written = 0.0, []
    for sends, recvs, ops in steps.steps:
        sent, received = ([(part.stop - part.start) * itemsize for (_, part), _ in side] for side in (sends, recvs))
        if sent and received:
            pairs = max(len(sent), len(received))
            fresh = [_written(written, view) for view, _ in sends] + [False] * (pairs - len(sent))
            sent, received = sent + [0] * (pairs - len(sent)), received + [0] * (pairs - len(received))
            messages = sum((exchange_fresh if new else exchange)(calib, max(a, b))
                           for a, b, new in zip(sent, received, fresh))
        else:
            messages = sum(message(calib, nbytes) for nbytes in sent + received)
        local = {"early_copy": 0.0, "ops": 0.0}
        for kind, *views in ops:
            part = views[-1][1]
            local["early_copy" if kind == "early_copy" else "ops"] += (reduction if kind == "reduce" else copy)(
                calib, (part.stop - part.start) * itemsize)
        total += max(messages, local["early_copy"]) + local["ops"]
        written += [view for view, _ in recvs] + [views[-1] for _, *views in ops]
    return total


def _written(written, view):
    """Whether the ``(buffer, slice)`` ``view`` overlaps one of the views ``written``."""
    name, part = view
    return any(other == name and done.start < part.stop and part.start < done.stop for other, done in written)


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
