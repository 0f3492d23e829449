"""The measuring options shared by ``mlscale run``, ``sweep`` and ``slurm``, and their validation.

Short aliases, as OSU and nccl-tests spell them: ``-b/-e/-f`` (begin, end, factor:
the sizes b, b f, b f^2, ... up to e; instead of ``--sizes``), ``-n`` / ``-w`` for
``--iters`` / ``--warmup`` and ``-c 0|1`` for the check (``-c 0`` is ``--no-check``).
"""
import argparse
import os
import sys

from bench.case import parse_variants
from bench.registry import case_class
from bench.resources import check_job, check_local
from bench.settings import resolve
from bench.load import memory_probe_enabled
from bench.stability import (MAX_POINT_SECONDS, MAX_SPREAD, POINT_SECONDS_VARIABLE, SAMPLES_FACTOR, check_max_spread,
                             max_point_seconds)
from bench.progress import parse_duration
from bench.units import parse_ranks, parse_size, parse_sizes
from kernels.backend import BACKENDS
from kernels.errors import InputError


def add_measure_options(parser):
    """Add the options that say what to measure (suite, variants, sizes, ranks...)."""
    parser.add_argument("suite", help="suite name (see `mlscale list`)")
    parser.add_argument("--variants", default="", help="comma list; default: all variants of the suite")
    parser.add_argument("--sizes", help="LO:HI (powers of two) or a comma list; K/M/G suffixes")
    parser.add_argument("-b", dest="begin", metavar="SIZE", help="first size (with -e, -f; instead of --sizes)")
    parser.add_argument("-e", dest="end", metavar="SIZE", help="last size (default: -b)")
    parser.add_argument("-f", dest="factor", type=int, metavar="F", help="factor between sizes (default 2)")
    parser.add_argument("--ranks", help="rank counts, e.g. 1,2,4 or 1:4; default: the job size")
    parser.add_argument("--scaling", choices=("strong", "weak"), default="strong",
                        help="weak: the size is per rank")
    parser.add_argument("--iters", "-n", type=int, help="timed iterations per point")
    parser.add_argument("--warmup", "-w", type=int, help="untimed runs before timing")
    parser.add_argument("--threads", type=int, help="BLAS threads per rank (default: cores / ranks on the node)")
    parser.add_argument("--backend", choices=BACKENDS, default="numpy")
    parser.add_argument("--dtype", help="element type (default: the suite's first)")
    parser.add_argument("--csv", help="results file (default: results/SUITE.csv); finished points are skipped")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip validation against the serial reference")
    parser.add_argument("-c", dest="check", type=_check_flag, choices=(False, True), metavar="0|1",
                        default=argparse.SUPPRESS, help="check against the serial reference: 1 (default) or 0")
    parser.add_argument("--time-limit", metavar="DURATION",
                        help="stop between points before one would end past DURATION (90, 90s, 30m, 2h); exit 3")
    parser.add_argument("--max-spread", type=float, metavar="X", default=MAX_SPREAD,
                        help=f"a point is unstable when its samples' interquartile range over their median exceeds X "
                             f"(default {MAX_SPREAD}; column stable); each is named as it is measured")
    parser.add_argument("--max-point-seconds", metavar="S",
                        help=f"an unstable point takes more samples (batches of --iters, at most {SAMPLES_FACTOR} "
                             f"times --iters) for at most S more seconds before it is judged (default "
                             f"${POINT_SECONDS_VARIABLE} or {MAX_POINT_SECONDS:g}; 0: never)")
    parser.add_argument("--remeasure-unstable", action="store_true",
                        help="measure again the points of --csv whose rows say stable 0, replacing their rows")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the suite, as MLSCALE_NAME=VALUE would give it (see `mlscale list SUITE`); "
                             "repeatable")
    parser.add_argument("--force", action="store_true",
                        help="measure even when a point needs more memory, or --threads more cores, than a node has")


def _check_flag(text):
    if text not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"expected 0 or 1, got {text!r}")
    return text == "1"


def size_range(begin, end, factor):
    """The sizes ``begin, begin * factor, ...`` up to ``end`` (``-b/-e/-f``), as a comma list for ``--sizes``.

    ``begin`` and ``end`` are size texts (K/M/G suffixes); either defaults to the
    other, ``factor`` (an integer >= 2) to 2. Raises `InputError` for a factor
    below 2 or ``begin`` above ``end``.
    """
    if begin is None and end is None:
        raise InputError("-f needs -b and/or -e (the first and last sizes)")
    low, high = parse_size(begin or end), parse_size(end or begin)
    factor = 2 if factor is None else factor
    if factor < 2:
        raise InputError(f"-f must be an integer >= 2, got {factor}")
    if low < 1 or low > high:
        raise InputError(f"-b {begin or end} -e {end or begin}: expected 1 <= begin <= end")
    sizes = [low]
    while sizes[-1] * factor <= high:
        sizes.append(sizes[-1] * factor)
    return ",".join(str(size) for size in sizes)


def resolve_size_options(args):
    """Turn ``-b/-e/-f`` into ``args.sizes`` (so ``slurm`` forwards them as ``--sizes``); mixing them
    with ``--sizes`` is an `InputError`."""
    if all(getattr(args, name, None) is None for name in ("begin", "end", "factor")):
        return
    if args.sizes is not None:
        raise InputError("give the sizes either with --sizes or with -b/-e/-f, not both")
    args.sizes = size_range(args.begin, args.end, args.factor)
    args.begin = args.end = args.factor = None


def make_config(args, job_size, comm=None):
    """Validate the measuring options against the suite and the job size; return ``(case, SweepConfig)``.

    The case gets the suite's settings from ``--set`` and the ``MLSCALE_*`` variables
    (`bench.settings.resolve`); its ``settings.warnings`` are for the caller to print.
    For ``sweep`` the plan (`bench.sweep.plan_points`: a named variant no rank count
    can run) and this node's memory and cores (`bench.resources`) are checked before
    the job starts; for ``run``, memory and cores on every node of the job ``comm``
    when given (collective, its one-line warning printed by rank 0).
    """
    from bench.sweep import SweepConfig, plan_points

    resolve_size_options(args)
    cls = case_class(args.suite)
    case = cls(resolve(cls.declared_settings, args.set, os.environ, cls.name or args.suite))
    variants = parse_variants(case, args.variants)
    for name, value in (("--iters", args.iters), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise InputError(f"{name} must be >= 1, got {value}")
    if args.warmup is not None and args.warmup < 0:
        raise InputError(f"--warmup must be >= 0, got {args.warmup}")
    check_max_spread(args.max_spread)
    config = SweepConfig(
        suite=case.name, variants=variants, sizes=parse_sizes(args.sizes or case.default_sizes),
        ranks=parse_ranks(args.ranks, job_size) if args.ranks else [job_size],
        csv_path=args.csv or os.path.join("results", f"{case.name}.csv"), scaling=args.scaling,
        iters=args.iters, warmup=args.warmup, threads=args.threads, backend=args.backend,
        dtype=args.dtype or case.dtypes[0], check=args.check, variants_named=bool(args.variants),
        time_limit=parse_duration(args.time_limit) if args.time_limit else None, max_spread=args.max_spread,
        max_point_seconds=max_point_seconds(args.max_point_seconds, os.environ),
        remeasure_unstable=args.remeasure_unstable, memory_probe=memory_probe_enabled(os.environ),
    )
    if getattr(args, "command", None) == "sweep":
        plan_points(case, config)  # a variant no rank count can run is refused before the job starts
        check_local(case, config, job_size, args.force)
    elif comm is not None:
        warning = check_job(comm, case, config, args.force)
        if warning and comm.rank == 0:
            sys.stderr.write(f"mlscale: {warning}\n")
    return case, config
