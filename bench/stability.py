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
#: Below this fraction of a GEMM's rate alone, the node's ranks computing at once were sharing cores
#: (`shared_cores_warning`). Measured here: 0.93-1.02 in 17 calibrations, 0.55 in one (a host lending the VM's
#: two virtual cores one physical core for a while: the sweeps after it ran at the alone rate).
SHARED_CORES_RATIO = 0.75
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


def check_max_spread(value):
    """`kernels.errors.InputError` unless ``--max-spread`` ``value`` is a number > 0."""
    if not 0 < value < float("inf"):
        raise InputError(f"--max-spread must be a number > 0, got {value}")


def spread(samples):
    """``(q75 - q25) / median`` of ``samples`` (seconds; 0 when the median is 0)."""
    median = float(np.median(samples))
    lower, upper = np.percentile(samples, [25, 75])
    return float((upper - lower) / median) if median > 0 else 0.0


def table_spread(samples_by_entry):
    """The spread of a calibrated table: the median over its entries of two samples or more of each entry's
    `spread` (its samples over the rounds: an entry may keep one, the others in the node's other handoff state,
    `bench.state_tables`); None where no entry has two (``calibrate --quick``: one round)."""
    lists = [samples for samples in samples_by_entry if len(samples) >= 2]
    return float(np.median([spread(samples) for samples in lists])) if lists else None


def unstable_tables(constants, max_spread):
    """``(name, spread)`` of each table of a calibration whose spread (`table_spread`) is above
    ``max_spread``: the message tables by name, the local rates as ``one_thread.gemm``, ``all_cores.gemm``,
    ``busy.gemm``...; none in a quick one (one round: no spread)."""
    found = []

    def visit(prefix, spreads):
        for name, value in (spreads or {}).items():
            if isinstance(value, dict):
                visit(f"{prefix}{name}.", value)
            elif value is not None and value > max_spread:
                found.append((prefix + name, value))
    visit("", constants.get("spread"))
    visit("busy.", constants.get("busy", {}).get("spread"))
    return found


def judge_calibration(constants, max_spread, force, path):
    """The ``#`` lines naming each unstable table of a calibration (`unstable_tables`) for ``calibrate`` to print
    before it writes ``path``, and the warning of `shared_cores_warning`; `kernels.errors.InputError` (nothing
    written) when a table is unstable and not ``force``."""
    unstable = unstable_tables(constants, max_spread)
    if unstable and not force:
        raise InputError(f"{len(unstable)} calibration table(s) unstable (spread > {max_spread:g}): "
                         f"{', '.join(name for name, _ in unstable)}; {path} not written: run again on a quieter "
                         f"node, or give --force to write it")
    shared = shared_cores_warning(constants)
    return [f"# unstable: calibration table {name}: spread {value:.2f} > {max_spread:g} (its rounds disagree; "
            f"is the node busy?)" for name, value in unstable] + ([shared] if shared else [])


def shared_cores_warning(constants):
    """A ``#`` line when the node's ranks, all computing at once (``busy``), ran the largest float64 GEMM below
    `SHARED_CORES_RATIO` of its rate on one rank alone at the same threads: they did not each have their
    own cores (hyperthreads of one core, another job, a host that lends the virtual cores one physical
    core), and the models of points on 2+ ranks take that sharing as the node's. None otherwise, or
    without ``busy`` rates."""
    busy = constants.get("busy")
    if not busy or "gemm" not in busy or "gemm" not in constants:
        return None
    one, every = (rates[-1] for rates in constants["gemm"]["float64"])
    cores, threads = int(constants.get("cores", 1)), busy["threads"]
    alone = one if cores == 1 else one + (every - one) * (min(threads, cores) - 1) / (cores - 1)
    shared = busy["gemm"]["float64"][-1]
    if shared >= SHARED_CORES_RATIO * alone:
        return None
    return (f"# warning: with all {busy['ranks']} ranks of the node computing at once, GEMM ran at "
            f"{shared / alone:.0%} of its rate alone ({shared / 1e9:.1f} against {alone / 1e9:.1f} GFLOP/s per "
            f"rank, {threads} thread(s) each): the ranks did not each have their own cores (hyperthreads, another "
            f"job, a virtual machine's host); models of points on 2+ ranks assume that sharing (calibrate again "
            f"if it was passing)")


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
