"""Pipeline schedules: how layers split into stages, which micro-batch each stage runs when, and the bubble.

Stages (`partition`)
    A model is a list of layers (e.g. ``mlp(...).layers``). Stage ``s`` runs a
    contiguous range of the layers, either ``balance="layers"`` (`block_range` of the
    layer count: stages differ by at most one layer, ReLUs included) or
    ``balance="params"`` (the contiguous split that minimises the largest per-stage
    parameter count). Every stage needs at least one layer.
Schedules (`stage_schedule`)
    ``gpipe``: all ``m`` forwards, then all ``m`` backwards; stage ``s`` keeps the
    activations of ``m`` micro-batches. ``1f1b``: ``w = min(p - s - 1, m)`` warm-up
    forwards, then one forward and one backward in turn, then ``w`` cool-down
    backwards; at most ``min(p - s, m)`` micro-batches in flight on stage ``s``.
    Both have the ideal bubble ``(p - 1) / (m + p - 1)`` (`theoretical_bubble`).
Bubble
    From each stage's compute seconds and step seconds: `bubble_fraction`, the idle
    share of the busiest stage (the schedule's fill and drain), and `idle_fraction`,
    the idle share of all stages (the bubble plus what unequal stages cost).
"""
import numpy as np

from kernels.distribution import block_range
from kernels.errors import InputError

SCHEDULES = ("gpipe", "1f1b")
BALANCES = ("layers", "params")
FORWARD, BACKWARD = "forward", "backward"


def layer_parameter_count(layer):
    """Number of parameter elements of ``layer`` (nested layers included)."""
    return sum(param.size for param, _ in layer.parameters())


def partition(layers, stages, balance="layers"):
    """Return the ``(start, stop)`` layer range of every stage, in stage order.

    Parameters
    ----------
    layers : sequence of Layer
    stages : int
        Number of stages, ``1 <= stages <= len(layers)``.
    balance : {"layers", "params"}
        ``layers``: `block_range` of the layer count. ``params``: minimise the
        largest stage's parameter count (dynamic programming over the cut points;
        on ties, earlier stages get fewer layers).
    """
    n = len(layers)
    if balance not in BALANCES:
        raise InputError(f"unknown pipeline balance {balance!r}; choose from {', '.join(BALANCES)}")
    if not 1 <= stages <= n:
        raise InputError(f"a pipeline of {stages} stages needs at least {stages} layers (one per stage); "
                         f"the model has {n}")
    if balance == "layers":
        return [block_range(n, stages, stage) for stage in range(stages)]
    prefix = np.cumsum([0] + [layer_parameter_count(layer) for layer in layers])
    # cost[k][j]: smallest largest-stage count when the first j layers form k stages; cut[k][j]: last start.
    cost = np.full((stages + 1, n + 1), np.inf)
    cut = np.zeros((stages + 1, n + 1), dtype=int)
    cost[0][0] = 0
    for k in range(1, stages + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                candidate = max(cost[k - 1][i], prefix[j] - prefix[i])
                if candidate < cost[k][j]:
                    cost[k][j], cut[k][j] = candidate, i
    bounds, stop = [], n
    for k in range(stages, 0, -1):
        bounds.append((int(cut[k][stop]), stop))
        stop = int(cut[k][stop])
    return bounds[::-1]


def stage_schedule(name, stages, stage, micro_batches):
    """Return stage ``stage``'s actions in order: ``("forward" | "backward", micro-batch index)`` pairs.

    ``gpipe``: all forwards, then all backwards. ``1f1b``: ``min(stages - stage - 1,
    micro_batches)`` warm-up forwards, one forward and one backward in turn, then
    the remaining backwards.
    """
    if name not in SCHEDULES:
        raise InputError(f"unknown pipeline schedule {name!r}; choose from {', '.join(SCHEDULES)}")
    m = micro_batches
    if name == "gpipe":
        return [(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in range(m)]
    warmup = min(stages - stage - 1, m)
    actions = [(FORWARD, i) for i in range(warmup)]
    for i in range(m - warmup):
        actions += [(FORWARD, warmup + i), (BACKWARD, i)]
    return actions + [(BACKWARD, i) for i in range(m - warmup, m)]


def theoretical_bubble(stages, micro_batches):
    """The idle fraction ``(p - 1) / (m + p - 1)`` of a pipeline with equal stage times and free messages."""
    return (stages - 1) / (micro_batches + stages - 1)


def bubble_fraction(compute_seconds, step_seconds):
    """Measured bubble: the idle share ``1 - max(compute) / max(step)`` of the busiest stage.

    The busiest stage has no slower neighbour to wait for, so its idle time is the
    schedule's fill and drain: what `theoretical_bubble` predicts for equal stages.
    """
    longest = max(step_seconds)
    return 1.0 - max(compute_seconds) / longest if longest > 0 else 0.0


def idle_fraction(compute_seconds, step_seconds):
    """Idle share of all ``p`` stages, ``1 - sum(compute) / (p max(step))``.

    Equals `bubble_fraction` plus ``(max(compute) - mean(compute)) / max(step)``,
    the time the faster stages lose waiting for the slowest one.
    """
    longest = max(step_seconds)
    return 1.0 - sum(compute_seconds) / (len(compute_seconds) * longest) if longest > 0 else 0.0


def replay(schedules, seconds):
    """Finish time of every stage when each runs its schedule with given action times and free messages.

    Stage ``s`` runs ``schedules[s]`` in order, its ``k``-th action taking
    ``seconds[s][k]``; an action starts once its input exists (a forward after the
    previous stage's forward of that micro-batch, a backward after the next stage's
    backward of it). With the stages' measured compute seconds this gives the step
    a pipeline would take if messages cost nothing: `bubble_fraction` of it is the
    bubble of the measured stage times, the gap to the measured bubble what messages
    and overheads add on the critical path.

    Parameters
    ----------
    schedules : list of list of (str, int)
        Each stage's `stage_schedule`.
    seconds : list of sequence of float
        Each stage's action durations, in schedule order.

    Returns
    -------
    list of float
        Each stage's finish time, from a common start at 0.
    """
    stages = len(schedules)
    done, clocks, positions = {}, [0.0] * stages, [0] * stages
    moved = True
    while moved:
        moved = False
        for stage, schedule in enumerate(schedules):
            while positions[stage] < len(schedule):
                kind, index = schedule[positions[stage]]
                source = stage - 1 if kind == FORWARD else stage + 1
                needed = (kind, index, source) if 0 <= source < stages else None
                if needed is not None and needed not in done:
                    break
                start = max(clocks[stage], done[needed] if needed else 0.0)
                clocks[stage] = done[(kind, index, stage)] = start + seconds[stage][positions[stage]]
                positions[stage] += 1
                moved = True
    if any(position < len(schedule) for position, schedule in zip(positions, schedules)):
        raise ValueError("replay: the schedules deadlock")
    return clocks
