"""How steady a point's samples were, and what the user is told about the points that were not.

A point's ``spread`` is the interquartile range of the slowest rank's samples over their
median, ``(q75 - q25) / t_med`` (NumPy's linear percentiles; 0 for one sample): a few
outliers do not move it, so it says whether the median itself moved from sample to
sample. A point is stable when its spread is at most ``--max-spread`` (`MAX_SPREAD` by
default); every row records both (CSV columns ``spread`` and ``stable``).

An unstable point is sampled again before it is judged (`Resampling`, `bench.timing.measure`):
batches of as many samples as the point's ``--iters`` until the spread of all its samples
is within the threshold, or it holds `SAMPLES_FACTOR` times ``--iters`` samples, or the
extra sampling has taken ``--max-point-seconds`` (`MAX_POINT_SECONDS`; 0: never). No MPI
here: the command line reads these before any job starts.
"""
from dataclasses import dataclass

import numpy as np

from kernels.errors import InputError

#: The default ``--max-spread``. Measured here (2 cores, ``mlscale sweep allreduce --np 2 --sizes
#: 8,64K,1M,16M``): quiet, 28 points, spread median 0.063, largest 0.14; beside two CPU-bound processes,
#: 12 points, median 1.19, largest 2.25 (4 below 0.25: 8-byte points whose samples average many runs).
MAX_SPREAD = 0.25
#: The default ``--max-point-seconds``: extra sampling of one unstable point at most this long.
MAX_POINT_SECONDS = 2.0
#: An unstable point takes at most this many times its ``--iters`` samples in all.
SAMPLES_FACTOR = 10
#: The environment variable giving ``--max-point-seconds`` when the option is not given (a batch job's
#: scripts, or ``make test``, whose tests check results, not stability).
POINT_SECONDS_VARIABLE = "MLSCALE_MAX_POINT_SECONDS"


@dataclass(frozen=True)
class Resampling:
    """How a point whose samples spread more than ``max_spread`` is sampled again (see the module)."""

    max_spread: float = MAX_SPREAD
    max_seconds: float = MAX_POINT_SECONDS
    factor: int = SAMPLES_FACTOR


def max_point_seconds(option, environ):
    """``--max-point-seconds``: the option when given, else `POINT_SECONDS_VARIABLE`, else `MAX_POINT_SECONDS`;
    `kernels.errors.InputError` for a value that is not a number of seconds >= 0."""
    name, text = ("--max-point-seconds", option) if option is not None else (
        POINT_SECONDS_VARIABLE, environ.get(POINT_SECONDS_VARIABLE))
    if text is None:
        return MAX_POINT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 <= seconds < float("inf"):
        raise InputError(f"{name} must be a number of seconds >= 0, got {text!r}")
    return seconds


def spread(samples):
    """``(q75 - q25) / median`` of ``samples`` (seconds; 0 when the median is 0)."""
    median = float(np.median(samples))
    lower, upper = np.percentile(samples, [25, 75])
    return float((upper - lower) / median) if median > 0 else 0.0


def unstable_note(row, max_spread):
    """The ``#`` line naming an unstable point of a sweep's table, or None for a stable one."""
    if row.get("stable", 1):
        return None
    return (f"# unstable: {row['variant']} size={row['size_label']} ranks={row['ranks']}: spread "
            f"{row['spread']:.2f} > {max_spread:g} (the samples' median moved; is the node busy?)")


def unstable_summary(unstable, total, max_spread):
    """The closing line of a sweep with ``unstable`` of its ``total`` points unstable, or None when none was."""
    if not unstable:
        return None
    return (f"# {unstable} of {total} points unstable (spread > {max_spread:g}); run the same command with "
            f"--remeasure-unstable to measure them again (on a quieter node, or with more --iters)")
