"""The measuring options shared by ``mlscale run``, ``sweep`` and ``slurm``, and their validation."""
import os
import sys

from bench.case import parse_variants
from bench.registry import case_class
from bench.resources import check_job, check_local
from bench.settings import resolve
from bench.units import parse_ranks, parse_sizes
from kernels.backend import BACKENDS
from kernels.errors import InputError


def add_measure_options(parser):
    """Add the options that say what to measure (suite, variants, sizes, ranks...)."""
    parser.add_argument("suite", help="suite name (see `mlscale list`)")
    parser.add_argument("--variants", default="", help="comma list; default: all variants of the suite")
    parser.add_argument("--sizes", help="LO:HI (powers of two) or a comma list; K/M/G suffixes")
    parser.add_argument("--ranks", help="rank counts, e.g. 1,2,4 or 1:4; default: the job size")
    parser.add_argument("--scaling", choices=("strong", "weak"), default="strong",
                        help="weak: the size is per rank")
    parser.add_argument("--iters", type=int, help="timed iterations per point")
    parser.add_argument("--warmup", type=int, help="untimed runs before timing")
    parser.add_argument("--threads", type=int, help="BLAS threads per rank (default: cores / ranks on the node)")
    parser.add_argument("--backend", choices=BACKENDS, default="numpy")
    parser.add_argument("--dtype", help="element type (default: the suite's first)")
    parser.add_argument("--csv", help="results file (default: results/SUITE.csv); finished points are skipped")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip validation against the serial reference")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the suite, as MLSCALE_NAME=VALUE would give it (see `mlscale list SUITE`); "
                             "repeatable")
    parser.add_argument("--force", action="store_true",
                        help="measure even when a point needs more memory, or --threads more cores, than a node has")


def make_config(args, job_size, comm=None):
    """Validate the measuring options against the suite and the job size; return ``(case, SweepConfig)``.

    The case gets the suite's settings from ``--set`` and the ``MLSCALE_*`` variables
    (`bench.settings.resolve`); its ``settings.warnings`` are for the caller to print.
    Memory and cores (`bench.resources`) are checked on this node for ``sweep``
    (before the job starts) and on every node of the job ``comm`` when given
    (``run``; collective, its one-line warning printed by rank 0).
    """
    from bench.sweep import SweepConfig

    cls = case_class(args.suite)
    case = cls(resolve(cls.declared_settings, args.set, os.environ, cls.name or args.suite))
    variants = parse_variants(case, args.variants)
    for name, value in (("--iters", args.iters), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise InputError(f"{name} must be >= 1, got {value}")
    if args.warmup is not None and args.warmup < 0:
        raise InputError(f"--warmup must be >= 0, got {args.warmup}")
    config = SweepConfig(
        suite=case.name, variants=variants, sizes=parse_sizes(args.sizes or case.default_sizes),
        ranks=parse_ranks(args.ranks, job_size) if args.ranks else [job_size],
        csv_path=args.csv or os.path.join("results", f"{case.name}.csv"), scaling=args.scaling,
        iters=args.iters, warmup=args.warmup, threads=args.threads, backend=args.backend,
        dtype=args.dtype or case.dtypes[0], check=args.check, variants_named=bool(args.variants),
    )
    if getattr(args, "command", None) == "sweep":
        check_local(case, config, job_size, args.force)
    elif comm is not None:
        warning = check_job(comm, case, config, args.force)
        if warning and comm.rank == 0:
            sys.stderr.write(f"mlscale: {warning}\n")
    return case, config
