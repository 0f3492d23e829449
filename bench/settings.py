"""Suite settings from ``MLSCALE_*`` environment variables (or ``--set NAME=VALUE`` on the command line).

The command line has no options per suite; each suite documents its settings in
its module docstring and reads them with these helpers, which turn malformed
values into a one-line `InputError` naming the variable. ``mlscale run|sweep|slurm
--set DP_MODEL=cnn`` is the same as exporting ``MLSCALE_DP_MODEL=cnn``.
"""
import json
import os

from bench.units import parse_size
from kernels.errors import InputError

PREFIX = "MLSCALE_"


#: Variables that steer the harness itself rather than what a suite computes.
HARNESS_VARIABLES = ("MLSCALE_MPIEXEC", "MLSCALE_DEBUG", "MLSCALE_CUDA_AWARE")


def suite_settings():
    """The ``MLSCALE_*`` suite settings in effect, as sorted JSON: recorded with every point and part of its key."""
    return json.dumps({name: value for name, value in sorted(os.environ.items())
                       if name.startswith(PREFIX) and name not in HARNESS_VARIABLES})


def apply_overrides(assignments):
    """Export each ``NAME=VALUE`` of ``assignments`` as ``MLSCALE_NAME=VALUE``."""
    for assignment in assignments or ():
        name, sep, value = assignment.partition("=")
        name = name.strip().upper()
        if not sep or not name.replace("_", "").isalnum():
            raise InputError(f"--set {assignment!r}: expected NAME=VALUE, e.g. --set DP_MODEL=cnn")
        os.environ[name if name.startswith(PREFIX) else PREFIX + name] = value.strip()


def _raw(name, default):
    return os.environ.get(name, str(default)).strip()


def env_choice(name, default, choices):
    """The value of ``name``, lower-cased, one of ``choices``."""
    value = _raw(name, default).lower()
    if value not in choices:
        raise InputError(f"{name}={value!r}: choose from {', '.join(choices)}")
    return value


def env_int(name, default, minimum=1):
    """The integer value of ``name``, at least ``minimum``."""
    text = _raw(name, default)
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"{name}={text!r}: expected an integer >= {minimum}") from None
    if value < minimum:
        raise InputError(f"{name}={text!r}: expected an integer >= {minimum}")
    return value


def env_float(name, default, minimum=0.0):
    """The float value of ``name``, greater than ``minimum``."""
    text = _raw(name, default)
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{name}={text!r}: expected a number > {minimum}") from None
    if not value > minimum:
        raise InputError(f"{name}={text!r}: expected a number > {minimum}")
    return value


def env_size(name, default):
    """A byte count with an optional K/M/G suffix (powers of 1024)."""
    text = _raw(name, default)
    try:
        return parse_size(text)
    except InputError as error:
        raise InputError(f"{name}: {error}") from None


def env_flag(name, default):
    """A boolean written 0/1 (also false/true, no/yes, off/on)."""
    value = _raw(name, int(default)).lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise InputError(f"{name}={value!r}: expected 0 or 1")
