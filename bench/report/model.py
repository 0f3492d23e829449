"""Cost-model constants: loading (and combining) the files ``mlscale calibrate`` writes.

`bench.calibrate` measures the constants; suites declare their cost in these
terms (`bench.models`: each suite's `predict`, helpers in `bench.models.terms`); ``mlscale
report --model calib.json`` puts the prediction beside each measurement and
``--project 64,256,1024`` extrapolates to rank counts this machine cannot run.

Several files may be given: at most one per ``scope`` (``intra-node``, ``inter-node``).
The intra-node file (else the only one) gives every constant; an inter-node file
adds its message constants under ``inter`` (`MESSAGE_KEYS`), which projections use
(`for_projection`). A file written before the per-message overhead, tables and
compute rates (and the exchange, window and ``dp`` step tables) existed lacks `KEYS` and is refused in one line asking to re-run
``mlscale calibrate`` (its constants could not model the suites honestly).
"""
import json
import math
from datetime import datetime

from bench.load import PROBE_BYTES
from bench.models import terms
from bench.stability import MAX_SPREAD, shared_cores_warning, unstable_tables
from kernels.errors import InputError

#: Positive numbers every calibration holds.
NUMBERS = ("alpha_s", "beta_s_per_byte", "overhead_s", "call_s", "gamma_s_per_byte", "memcpy_bytes_per_s",
           "gemm_flops_per_s", "cores")
#: Rates a calibration holds as ``[one thread, all cores]``, or as one number (one thread: older files).
RATES = ("kernel_rows",)
#: Tables and rate maps (see `bench.calibrate`).
TABLES = ("pingpong", "exchange", "stream", "allreduce", "reduce", "copy", "gemm", "gemm_sizes", "conv", "attention",
          "dp_step")
KEYS = NUMBERS + RATES + TABLES
#: Numbers and tables a calibration holds when its mlscale measured them (checked as `NUMBERS` and `TABLES`
#: when present).
OPTIONAL_NUMBERS, OPTIONAL_TABLES = ("thin_side",), ("gemm_thin", "thin_rows")
#: Tables checked when present, each needing no other key: MPI's collective calls timed on two ranks
#: (`bench.library_tables`; an inter-node file's replace the intra-node ones in projections), the local
#: GEMVs, the moe steps and the Dis-SMO iterations (`bench.local_rates`; without them the gemv model prices the
#: matrix read as a copy, the moe and svm models their terms alone).
LIBRARY, LATER_TABLES = "library", ("gemv", "moe_step", "smo_iteration", "exchange_fresh", "oneway")
#: The constants of messages, which an inter-node calibration replaces in projections.
MESSAGE_KEYS = ("alpha_s", "beta_s_per_byte", "overhead_s", "pingpong", "oneway", "exchange", "exchange_fresh",
                "stream", "allreduce")
SCOPES = ("intra-node", "inter-node")
#: Seconds between a calibration and the farthest point it prices beyond which the report names the gap: ten
#: minutes (here two calibrations 18 minutes apart differed by a median 4-23 % per table, and the ps sweep's
#: model error was 24 % against a calibration 50 minutes old, 9-10 % against one made just before it).
APART_SECONDS = 600


def load_calibration(path):
    """Read one calibration JSON written by `calibrate`; record its ``path``.

    Raises `InputError` naming ``path`` when it cannot be read or parsed, is not a
    JSON object, lacks one of `KEYS` (an older file: re-run calibrate), holds a
    constant of `NUMBERS` (or a rate of `RATES`) that is not a finite number > 0, a table (of `TABLES`, also
    under ``busy``) that is not a non-empty list or object of finite numbers (nested
    lists and objects, none empty), some but not all of `OPTIONAL_NUMBERS` and
    `OPTIONAL_TABLES` (checked as those), an ``other_state`` without positive ``handoff_s``, ``alpha_s`` and
    ``beta_s_per_byte``, a ``busy.other_state`` without a positive ``handoff_s``, either with such a table, or names an unknown ``scope``. Records in ``unstable`` the names of its
    tables whose spread is above the ``max_spread`` it was written with (`bench.stability.unstable_tables`).
    """
    try:
        with open(path, encoding="utf-8") as handle:
            calib = json.load(handle)
    except (OSError, ValueError) as error:
        raise InputError(f"cannot read calibration {path}: {error}") from None
    if not isinstance(calib, dict):
        raise InputError(f"{path} is not an mlscale calibration (a JSON object); run mlscale calibrate")
    missing = [key for key in KEYS if key not in calib]
    if missing:
        older = "alpha_s" in calib
        raise InputError(f"{path} " + ("was written by an older mlscale calibrate" if older else
                                       "is not an mlscale calibration") +
                         f" (missing {missing[0]!r}); run mlscale calibrate again")
    optional = [key for key in OPTIONAL_NUMBERS + OPTIONAL_TABLES if key in calib]
    if optional and len(optional) < len(OPTIONAL_NUMBERS + OPTIONAL_TABLES):
        absent = next(key for key in OPTIONAL_NUMBERS + OPTIONAL_TABLES if key not in calib)
        raise InputError(f"{path}: {optional[0]} needs {absent} beside it; run mlscale calibrate")
    for key, value in [(key, calib[key]) for key in NUMBERS + tuple(key for key in OPTIONAL_NUMBERS if key in calib)] + \
            [(key, rate) for key in RATES for rate in (calib[key] if isinstance(calib[key], list) and calib[key] else [calib[key]])]:
        if not _finite(value) or value <= 0:
            raise InputError(f"{path}: {key} must be a number > 0, got {json.dumps(value)}; run mlscale calibrate")
    busy, other = calib.get("busy"), calib.get("other_state")
    busy_other = busy.get("other_state") if isinstance(busy, dict) else None
    for name, state, needed in (("other_state", other, "handoff_s, alpha_s and beta_s_per_byte"),
                                ("busy.other_state", busy_other, "handoff_s")):
        if state is not None and not (isinstance(state, dict) and all(
                _finite(state.get(key)) and state[key] > 0 for key in needed.replace(" and", ",").split(", "))):
            raise InputError(f"{path}: {name} must hold positive {needed}; run mlscale calibrate")
    checked = TABLES + tuple(key for key in OPTIONAL_TABLES + (LIBRARY,) + LATER_TABLES if key in calib)
    for name, table in [(key, calib[key]) for key in checked] + [
            (f"{prefix}.{key}", state[key]) for prefix, state in (("busy", busy), ("other_state", other),
                                                                  ("busy.other_state", busy_other))
            for key in checked if isinstance(state, dict) and key in state]:
        if not isinstance(table, (list, dict)) or not table:
            raise InputError(f"{path}: {name} must be a non-empty table; run mlscale calibrate")
        wrong = _not_a_number(table)
        if wrong:
            raise InputError(f"{path}: {name} must hold numbers only, got {json.dumps(wrong[0])}; "
                             "run mlscale calibrate")
    scope = calib.setdefault("scope", "intra-node")
    if scope not in SCOPES:
        raise InputError(f"{path}: scope must be one of {', '.join(SCOPES)}, got {json.dumps(scope)}")
    calib["path"] = path
    calib["unstable"] = [name for name, _ in unstable_tables(calib, calib.get("max_spread", MAX_SPREAD))]
    return calib


#: A point whose memory probe (`bench.load.MemoryProbe`) ran more than this factor off the calibration's GEMV of
#: its bytes was measured in another state of the node's memory than the calibration's: here the probe took
#: 1.3-1.4 ms in one state and 1.6-1.75 ms in the other, and varied by up to 1.11x within one.
MEMORY_STATE_TOLERANCE = 1.2


def memory_state(calib, on_node, params):
    """The point's ``memory_probe_s`` (its ``params``' load) over the calibrated GEMV of `PROBE_BYTES` in float64 at
    the threads and sharing of one of ``on_node`` ranks on a node (`bench.models.terms.gemv`); None where the
    point or the calibration lacks it."""
    probe = ((params or {}).get("load") or {}).get("memory_probe_s")
    if not calib or not probe or "gemv" not in calib:
        return None
    return probe / terms.gemv(dict(calib, point_dtype="float64"), PROBE_BYTES, on_node)


#: A point whose handoff probe (`bench.message_tables.handoff_prober`) ran more than this factor off the
#: calibration's ``handoff_s`` was measured in its other handoff state: the two states were 5x apart here (medians
#: 91 and 467 us), one state's probes spanned up to 2.2x.
HANDOFF_STATE_TOLERANCE = 2.0


def handoff_state(calib, params):
    """The point's ``handoff_probe_s`` (its ``params``' load: on two ranks of one node) over the calibration's
    ``handoff_s``; None where either lacks it or the calibration's pair was not on one node (``scope``
    ``inter-node``: its probe crossed the network)."""
    probe = ((params or {}).get("load") or {}).get("handoff_probe_s")
    if not calib or not probe or not calib.get("handoff_s") or calib.get("scope") != "intra-node":
        return None
    return probe / calib["handoff_s"]


def calibration_in_state(calib, params):
    """``(calibration, state)`` to price a point with, by its handoff probe (its ``params``' load): ``calib``
    with the message tables of its ``other_state`` (`bench.state_tables`) where the probe lies nearer by ratio
    that state's ``handoff_s`` than the calibration's (intra-node calibrations only: `handoff_state`), and with
    the ``busy`` rates of ``busy.other_state`` where it lies nearer that state's ``handoff_s`` than ``busy``'s;
    ``state`` is ``"other"`` where either was taken, ``"reference"`` where neither, None where the point has no
    probe or the calibration no probe it could be compared with."""
    probe = ((params or {}).get("load") or {}).get("handoff_probe_s")
    busy = (calib or {}).get("busy") or {}
    if not probe or (handoff_state(calib, params) is None and not busy.get("handoff_s")):
        return calib, None
    priced = calib
    if handoff_state(calib, params) is not None and _nearer_other(probe, calib):
        priced = {**priced, **calib["other_state"]}
    if busy.get("handoff_s") and _nearer_other(probe, busy):
        priced = {**priced, "busy": {**busy, **busy["other_state"]}}
    return priced, "other" if priced is not calib else "reference"


def _nearer_other(probe, measured):
    """Whether the seconds of a ``probe`` lie nearer by ratio the ``handoff_s`` of ``measured``'s
    ``other_state`` than its own."""
    other = measured.get("other_state")
    return bool(other) and abs(math.log(probe / other["handoff_s"])) < abs(math.log(probe / measured["handoff_s"]))


def off_node_state(entry):
    """Whether an entry was measured in another state of the node than its calibration: its ``memory_state``
    more than `MEMORY_STATE_TOLERANCE` off 1 either way, or its ``handoff_state`` more than
    `HANDOFF_STATE_TOLERANCE`."""
    return any(ratio is not None and not 1 / tolerance <= ratio <= tolerance for ratio, tolerance in (
        (entry.get("memory_state"), MEMORY_STATE_TOLERANCE), (entry.get("handoff_state"), HANDOFF_STATE_TOLERANCE)))


def unstable_note(calib):
    """The report's warning line about the unstable tables of the calibrations in ``calib`` (written with
    ``calibrate --force``), or None when none is."""
    parts = [f"{part['path']} ({', '.join(part['unstable'])})" for part in (calib, calib.get("inter") or {})
             if part.get("unstable")]
    if not parts:
        return None
    return (f"report: warning: unstable calibration tables in {'; '.join(parts)}: the predictions resting on them "
            f"are as unsteady (run mlscale calibrate again on a quieter node)")


def shared_cores_note(calib):
    """The report's warning when the ranks of the calibration's node shared their cores while it measured
    (`bench.stability.shared_cores_warning`), or None."""
    warning = shared_cores_warning(calib)
    return warning and f"report: warning: {calib['path']}: {warning[len('# warning: '):]}"


def provenance_note(calib, rows):
    """The report's note when the calibration ``calib`` (its intra-node file, else its only one) was measured on
    a host none of the results ``rows`` ran on (their ``host``), or more than `APART_SECONDS` from the farthest
    of them (their ``timestamp``): its model errors then also measure how the machine differs or changed (on a
    shared node rates drift: four calibrations a minute apart here gave ping-pongs of 2.1-3.1 us at 8 B).
    None otherwise, or where the file or the rows do not say."""
    hosts = sorted({row.get("host") for row in rows} - {None, ""})
    found = []
    if calib.get("host") and hosts and calib["host"] not in hosts:
        found.append(f"on host {calib['host']} (the points: {', '.join(hosts)})")
    measured = _moment(calib.get("timestamp"))
    moments = [moment for moment in (_moment(row.get("timestamp")) for row in rows) if moment]
    if measured and moments:
        apart = max(abs((moment - measured).total_seconds()) for moment in moments)
        if apart > APART_SECONDS:
            found.append(f"{apart / 3600:.1f} h" if apart >= 3600 else f"{apart / 60:.0f} min")
            found[-1] += " from the farthest point"
    if not found:
        return None
    return (f"report: note: {_source(calib)} was measured {' and '.join(found)}: its model errors also measure "
            f"that difference (run mlscale calibrate beside the sweep, on its nodes)")


def _moment(text):
    """The ISO time ``text`` as a datetime (with its zone), or None when it is not one."""
    try:
        moment = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo else None


def load_calibrations(paths):
    """One calibration from one or two files (`load_calibration` each, one per scope); see the module.

    Raises `InputError` when two files have the same scope.
    """
    by_scope = {}
    for path in paths:
        calib = load_calibration(path)
        if calib["scope"] in by_scope:
            raise InputError(f"--model {by_scope[calib['scope']]['path']} and {path} are both {calib['scope']} "
                             "calibrations; give one intra-node and one inter-node file")
        by_scope[calib["scope"]] = calib
    combined = dict(by_scope.get("intra-node") or by_scope["inter-node"])
    if "inter-node" in by_scope:
        inter = by_scope["inter-node"]
        combined["inter"] = dict({key: inter[key] for key in MESSAGE_KEYS + (LIBRARY,) if key in inter},
                                 path=inter["path"], unstable=inter["unstable"])
    return combined


def for_projection(calib):
    """``(constants, note)``: the constants a projection uses (inter-node messages when given) and which."""
    if "inter" in calib:    # MPI's calls measured inside the node do not project across nodes
        later_messages = set(LATER_TABLES) & set(MESSAGE_KEYS)  # an older inter-node file lacks them: none here
        constants = {key: value for key, value in calib.items()
                     if key != LIBRARY and (key not in later_messages or key in calib["inter"])}
        return dict(constants, **{key: calib["inter"][key] for key in MESSAGE_KEYS + (LIBRARY,)
                                  if key in calib["inter"]}), \
            f"inter-node message constants of {calib['inter']['path']}, compute rates of {_source(calib)}"
    return calib, f"{calib.get('scope', 'intra-node')} constants of {_source(calib)} (no inter-node calibration given)"


def _finite(value):
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _not_a_number(table):
    """``(entry,)``: the first entry of the nested lists and objects ``table`` that is not a finite number
    (an empty list or object counts as one), or ``()`` when every entry is."""
    if isinstance(table, (list, dict)):
        entries = list(table.values() if isinstance(table, dict) else table)
        if not entries:
            return (table,)
        return next((wrong for wrong in map(_not_a_number, entries) if wrong), ())
    return () if _finite(table) else (table,)


def _source(calib):
    return calib.get("path", "the calibration given")
