"""Pipeline schedules: how layers split into stages, which micro-batch each stage runs when, and the bubble.

Stages (`partition`)
    A model is a list of layers (e.g. ``mlp(...).layers``). Stage ``s`` runs a
    contiguous range of the layers, either ``balance="layers"`` (`block_range` of the
    layer count: stages differ by at most one layer, ReLUs included),
    ``balance="params"`` (the contiguous split that minimises the largest per-stage
    parameter count) or ``balance="time"`` (the same for given per-layer costs, e.g.
    measured seconds: `layer_seconds`). Every stage needs at least one layer.
Schedules (`stage_schedule`)
    ``gpipe``: all ``m`` forwards, then all ``m`` backwards; stage ``s`` keeps the
    activations of ``m`` micro-batches. ``1f1b``: ``w = min(p - s - 1, m)`` warm-up
    forwards, then one forward and one backward in turn, then ``w`` cool-down
    backwards; at most ``min(p - s, m)`` micro-batches in flight on stage ``s``.
    Both have the ideal bubble ``(p - 1) / (m + p - 1)`` (`theoretical_bubble`).
    ``pipedream`` (`pipedream_step`): the 1F1B order continued from step to step
    without a flush (`parallel.pipeline.pipedream`); its steady state has no bubble.
Bubble
    From each stage's compute seconds and step seconds: `bubble_fraction`, the idle
    share of the busiest stage (the schedule's fill and drain), and `idle_fraction`,
    the idle share of all stages (the bubble plus what unequal stages cost).
"""
import time

import numpy as np

from kernels.distribution import block_range
from kernels.errors import InputError

SCHEDULES = ("gpipe", "1f1b")  # the schedules that flush (every step ends with the batch's gradient)
PIPEDREAM = "pipedream"
BALANCES = ("layers", "params", "time")
FORWARD, BACKWARD = "forward", "backward"


def layer_parameter_count(layer):
    """Number of parameter elements of ``layer`` (nested layers included)."""
    return sum(param.size for param, _ in layer.parameters())


def layer_seconds(layers, input_shape, rows, dtype, loss, repeats=3):
    """Seconds of each layer's forward plus backward on ``rows`` random samples, median of ``repeats``.

    The input is ``rows`` standard normal samples of ``input_shape``; the last layer's
    output gradient is that of ``loss`` with random labels. No communication: the
    caller measures on one rank and broadcasts, so that every rank cuts alike.
    """
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows,) + tuple(input_shape)).astype(dtype)
    seconds = np.zeros((repeats, len(layers)))
    for repeat in range(repeats):
        inputs = []
        for index, layer in enumerate(layers):
            inputs.append(x)
            start = time.perf_counter()
            x = layer.forward(x)
            seconds[repeat, index] = time.perf_counter() - start
        _, grad = loss(x, rng.integers(0, x.shape[1], rows))
        for index in reversed(range(len(layers))):
            start = time.perf_counter()
            grad = layers[index].backward(grad)
            seconds[repeat, index] += time.perf_counter() - start
        x = inputs[0]
    return [float(value) for value in np.median(seconds, axis=0)]


def partition(layers, stages, balance="layers", costs=None):
    """Return the ``(start, stop)`` layer range of every stage, in stage order.

    Parameters
    ----------
    layers : sequence of Layer
    stages : int
        Number of stages, ``1 <= stages <= len(layers)``.
    balance : {"layers", "params", "time"}
        ``layers``: `block_range` of the layer count. ``params`` and ``time``: minimise
        the largest stage's cost, the parameter count or ``costs`` (dynamic programming
        over the cut points; on ties, earlier stages get fewer layers).
    costs : sequence of float, optional
        Per-layer costs for ``time`` (e.g. `layer_seconds`).
    """
    n = len(layers)
    if balance not in BALANCES:
        raise InputError(f"unknown pipeline balance {balance!r}; choose from {', '.join(BALANCES)}")
    if not 1 <= stages <= n:
        raise InputError(f"a pipeline of {stages} stages needs at least {stages} layers (one per stage); "
                         f"the model has {n}")
    if balance == "layers":
        return [block_range(n, stages, stage) for stage in range(stages)]
    if balance == "time" and (costs is None or len(costs) != n):
        raise ValueError(f"partition: balance 'time' needs one cost per layer ({n})")
    prefix = np.cumsum([0] + (list(costs) if balance == "time" else [layer_parameter_count(layer) for layer in layers]))
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


def pipedream_actions(stages, stage, begin, end):
    """Positions ``begin .. end - 1`` of stage ``stage``'s endless PipeDream order (1F1B without a flush).

    ``w = stages - stage - 1`` warm-up forwards, then the forward of micro-batch ``j``
    and the backward of ``j - w`` in turn: position ``q < w`` is forward ``q``; then
    even offsets ``2 i`` from ``w`` are forward ``w + i``, odd ones backward ``i``.
    """
    warmup = stages - stage - 1
    actions = []
    for position in range(max(0, begin), end):
        offset = position - warmup
        if offset < 0:
            actions.append((FORWARD, position))
        else:
            actions.append((FORWARD, warmup + offset // 2) if offset % 2 == 0 else (BACKWARD, offset // 2))
    return actions


def _step_start(stages, stage, step, micro_batches):
    """Position in stage ``stage``'s order where step ``step`` starts: ``s`` actions before the forward of
    micro-batch ``step * m``, so that all stages' steps cover the same time window of the ideal schedule."""
    forwards = step * micro_batches
    return max(0, forwards + max(0, forwards - (stages - stage - 1)) - stage)


def pipedream_step(stages, stage, step, micro_batches):
    """Stage ``stage``'s actions in step ``step`` of a PipeDream stream of ``micro_batches`` per step.

    Steps cut the endless order (`pipedream_actions`) so that every stage's step
    covers the same time window of the ideal schedule (stage ``s`` starts ``s``
    actions before the forward of micro-batch ``step * m``): no stage waits at a step's
    start for a neighbour's action of the same step, and the steady state has no
    fill. A step forwards only micro-batches fed in so far (``< (step + 1) m``).
    """
    return pipedream_actions(stages, stage, _step_start(stages, stage, step, micro_batches),
                             _step_start(stages, stage, step + 1, micro_batches))


def pipedream_drain(stages, stage, steps, micro_batches):
    """The actions left on stage ``stage`` after ``steps`` steps of `pipedream_step`: the end of the order
    up to the last forward, then the backwards still in flight (the cool-down)."""
    total = steps * micro_batches
    warmup = stages - stage - 1
    actions = pipedream_actions(stages, stage, _step_start(stages, stage, steps, micro_batches),
                                total + max(0, total - warmup))
    return actions + [(BACKWARD, index) for index in range(max(0, total - warmup), total)]


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
    backward of it; an input made before the replayed window, i.e. by an action in
    no schedule, as PipeDream's steady state has, exists at 0). With the stages' measured compute seconds this gives the step
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
    present = {(kind, index, stage) for stage, schedule in enumerate(schedules) for kind, index in schedule}
    done, clocks, positions = {}, [0.0] * stages, [0] * stages
    moved = True
    while moved:
        moved = False
        for stage, schedule in enumerate(schedules):
            while positions[stage] < len(schedule):
                kind, index = schedule[positions[stage]]
                source = stage - 1 if kind == FORWARD else stage + 1
                needed = (kind, index, source) if (kind, index, source) in present else None
                if needed is not None and needed not in done:
                    break
                start = max(clocks[stage], done[needed] if needed else 0.0)
                clocks[stage] = done[(kind, index, stage)] = start + seconds[stage][positions[stage]]
                positions[stage] += 1
                moved = True
    if any(position < len(schedule) for position, schedule in zip(positions, schedules)):
        raise ValueError("replay: the schedules deadlock")
    return clocks
