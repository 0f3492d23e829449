"""Cost-model constants: loading (and combining) the files ``mlscale calibrate`` writes.

`bench.calibrate` measures the constants; cases declare their cost in these
terms (`bench.case.Case.predict`, helpers in `bench.families.costs`); ``mlscale
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

from kernels.errors import InputError

#: Positive numbers every calibration holds.
NUMBERS = ("alpha_s", "beta_s_per_byte", "overhead_s", "call_s", "gamma_s_per_byte", "memcpy_bytes_per_s",
           "gemm_flops_per_s", "kernel_rows", "cores")
#: Tables and rate maps (see `bench.calibrate`).
TABLES = ("pingpong", "exchange", "stream", "allreduce", "reduce", "copy", "gemm", "gemm_sizes", "conv", "attention",
          "dp_step")
KEYS = NUMBERS + TABLES
#: The constants of messages, which an inter-node calibration replaces in projections.
MESSAGE_KEYS = ("alpha_s", "beta_s_per_byte", "overhead_s", "pingpong", "exchange", "stream", "allreduce")
SCOPES = ("intra-node", "inter-node")


def load_calibration(path):
    """Read one calibration JSON written by `calibrate`; record its ``path``.

    Raises `InputError` naming ``path`` when it cannot be read or parsed, is not a
    JSON object, lacks one of `KEYS` (an older file: re-run calibrate), holds a
    constant of `NUMBERS` that is not a finite number > 0 or a table that is not a
    list or object, or names an unknown ``scope``.
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
    for key in NUMBERS:
        value = calib[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise InputError(f"{path}: {key} must be a number > 0, got {json.dumps(value)}; run mlscale calibrate")
    for key in TABLES:
        if not isinstance(calib[key], (list, dict)) or not calib[key]:
            raise InputError(f"{path}: {key} must be a non-empty table; run mlscale calibrate")
    scope = calib.setdefault("scope", "intra-node")
    if scope not in SCOPES:
        raise InputError(f"{path}: scope must be one of {', '.join(SCOPES)}, got {json.dumps(scope)}")
    calib["path"] = path
    return calib


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
        combined["inter"] = dict({key: inter[key] for key in MESSAGE_KEYS}, path=inter["path"])
    return combined


def for_projection(calib):
    """``(constants, note)``: the constants a projection uses (inter-node messages when given) and which."""
    if "inter" in calib:
        return dict(calib, **{key: calib["inter"][key] for key in MESSAGE_KEYS}), \
            f"inter-node message constants of {calib['inter']['path']}, compute rates of {_source(calib)}"
    return calib, f"{calib.get('scope', 'intra-node')} constants of {_source(calib)} (no inter-node calibration given)"


def _source(calib):
    return calib.get("path", "the calibration given")


def log2_ceil(p):
    """Rounds of a binomial tree over ``p`` ranks."""
    return max(0, (p - 1).bit_length())
