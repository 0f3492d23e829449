"""How steady a point's samples were, and what the user is told about the points that were not.

A point's ``spread`` is the interquartile range of the slowest rank's samples over their
median, ``(q75 - q25) / t_med`` (NumPy's linear percentiles; 0 for one sample): a few
outliers do not move it, so it says whether the median itself moved from sample to
sample. A point is stable when its spread is at most ``--max-spread`` (`MAX_SPREAD` by
default); every row records both (CSV columns ``spread`` and ``stable``). No MPI here:
the command line reads `MAX_SPREAD` before any job starts.
"""
import numpy as np

#: The default ``--max-spread``. Measured here (2 cores, ``mlscale sweep allreduce --np 2 --sizes
#: 8,64K,1M,16M``): quiet, 28 points, spread median 0.063, largest 0.14; beside two CPU-bound processes,
#: 12 points, median 1.19, largest 2.25 (4 below 0.25: 8-byte points whose samples average many runs).
MAX_SPREAD = 0.25


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
    return (f"# {unstable} of {total} points unstable (spread > {max_spread:g}): their times moved between "
            f"samples; measure them again on a quieter node, or with more --iters")
