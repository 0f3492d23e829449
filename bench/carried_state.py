"""The node's other handoff state carried from the calibration a new one replaces (``calibrate --out``).

A calibration holds the tables of the node's other handoff state (`bench.state_tables`) only where its samples
saw that state. On this 2-core VM the states lasted up to minutes: in pass n, 16 of 19 calibrations of about
30 s saw one state only, and the sweeps after 8 of them ran wholly or mostly in the other, priced 20-40 % off
(allreduce 31 %, reduce 40 %, gemv 30 %). When the file at ``--out`` was written on the same host, with the
same MPI library, scope, cores and plan, at most `CARRY_SECONDS` before, and measured the state the new one
lacks (its handoff probe `bench.state_tables.STATE_GAP` or more apart), the new file takes that state's
message tables as its ``other_state`` and that state's busy rates as ``busy.other_state``, each marked
``carried_from`` with the time they were measured. ``calibrate --fresh`` carries nothing.
"""
from datetime import datetime

from bench.state_tables import STATE_GAP
from kernels.errors import InputError

#: How old carried tables may be (they describe the node as it was then).
CARRY_SECONDS = 3600
#: What the other state of the message tables holds (besides ``handoff_s``), as `bench.message_tables` writes it.
MESSAGE_STATE_KEYS = ("alpha_s", "beta_s_per_byte", "pingpong", "oneway", "exchange", "exchange_fresh", "stream",
                      "allreduce", "library")
#: The keys of ``busy`` that are not rates of a state.
BUSY_SETTINGS = ("ranks", "threads", "spread", "handoff_s", "other_state")
#: What must match between the two calibrations.
SAME_NODE = ("host", "mpi_library", "scope", "cores", "quick")


def with_earlier_state(constants, path):
    """``(constants, note)``: ``constants`` (a new calibration) with the other state's tables of the readable
    calibration at ``path`` where it qualifies (see the module), and a ``#`` line naming what was carried (None
    where nothing was)."""
    earlier = _earlier(path)
    if earlier is None or any(earlier.get(key) != constants.get(key) for key in SAME_NODE):
        return constants, None
    carried = []
    times = constants["timestamp"], earlier["timestamp"]
    state = _state_from(constants, earlier, MESSAGE_STATE_KEYS, *times)
    if state is not None:
        constants = dict(constants, other_state=state)
        carried.append(f"message tables ({_described(state)})")
    busy, earlier_busy = constants.get("busy"), earlier.get("busy")
    if isinstance(busy, dict) and isinstance(earlier_busy, dict) and all(
            busy.get(key) == earlier_busy.get(key) for key in ("ranks", "threads")):
        state = _state_from(busy, earlier_busy, [key for key in busy if key not in BUSY_SETTINGS], *times)
        if state is not None:
            constants = dict(constants, busy=dict(busy, other_state=state))
            carried.append(f"busy rates ({_described(state)})")
    if not carried:
        return constants, None
    return constants, (f"# the node's other handoff state carried from the calibration {path} held: "
                       f"{'; '.join(carried)} (--fresh to carry none)")


def _described(state):
    return f"handoff {state['handoff_s'] * 1e6:.0f} us, measured {state['carried_from']}"


def _earlier(path):
    """The calibration at ``path`` as `bench.report.model.load_calibration` accepts it (its tables checked), or
    None: none there, unreadable, refused or without a timestamp."""
    from bench.report.model import load_calibration

    try:
        earlier = load_calibration(path)
    except InputError:
        return None
    return earlier if isinstance(earlier.get("timestamp"), str) else None


def _state_from(current, earlier, keys, now, written):
    """The tables of ``keys`` (and ``handoff_s``, ``carried_from``) of the state of ``earlier`` (its reference,
    measured at ``written``, or its ``other_state``, at its ``carried_from`` if carried, else then too) that
    ``current`` lacks, measured at most `CARRY_SECONDS` before ``now`` (ISO times); None where ``current`` measured its other state itself or no such state qualifies."""
    handoff = current.get("handoff_s")
    if current.get("other_state") or not handoff:
        return None
    for source in (earlier, earlier.get("other_state") or {}):
        seen, measured = source.get("handoff_s"), source.get("carried_from", written)
        if not isinstance(seen, (int, float)) or seen <= 0 or max(seen / handoff, handoff / seen) < STATE_GAP:
            continue
        if all(key in source for key in keys) and _age(measured, now) <= CARRY_SECONDS:
            return dict({key: source[key] for key in keys}, handoff_s=seen, carried_from=measured)
    return None


def _age(then, now):
    try:
        return (datetime.fromisoformat(now) - datetime.fromisoformat(then)).total_seconds()
    except (TypeError, ValueError):
        return float("inf")
