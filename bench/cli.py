"""The command line: ``mlscale list | run | sweep | report``.

Exit status: 0 every point measured and valid; 1 a check failed or a rank
failed; 2 bad usage or input. Errors are one line on stderr from rank 0 (an
unexpected error on one rank: one line from that rank, then MPI_Abort; set
MLSCALE_DEBUG=1 for the traceback).
"""
import argparse
import os
import sys

from bench.options import add_measure_options, make_config
from bench.registry import SUITES, get_case
from bench.slurm import add_slurm_options, command_slurm
from bench.units import parse_ranks
from kernels.errors import InputError

EXIT_OK, EXIT_WRONG, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as an `InputError` (one line, status 2)."""

    def error(self, message):
        raise InputError(message)


def build_parser():
    parser = _Parser(prog="mlscale", description="Measure how parallel ML algorithms scale with MPI.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    listing = commands.add_parser("list", help="suites, variants, what size means, metrics")
    listing.add_argument("suite", nargs="?")
    run = commands.add_parser("run", help="inside mpiexec / srun: measure, print a table, append CSV")
    add_measure_options(run)
    sweep = commands.add_parser("sweep", help="from a shell: start the MPI job, then as `run`")
    add_measure_options(sweep)
    sweep.add_argument("--np", type=int, help="ranks to start (default: the largest --ranks, else the cores)")
    sweep.add_argument("--launcher", choices=("auto", "mpiexec", "srun"), default="auto")
    report = commands.add_parser("report", help="speedup and efficiency tables from results CSVs")
    report.add_argument("csv", nargs="+")
    report.add_argument("--out", default="report", help="folder for scaling.csv, fits.csv, summary.md, plots")
    report.add_argument("--model", help="calibration JSON from `mlscale calibrate`: predicted beside measured")
    report.add_argument("--project", help="rank counts to extrapolate to with --model, e.g. 64,256,1024")
    report.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNG plots")
    calibrate = commands.add_parser("calibrate", help="measure alpha, beta, gamma on 2 ranks; write JSON")
    calibrate.add_argument("--out", default="calib.json", help="where to write the constants")
    calibrate.add_argument("--launcher", choices=("auto", "mpiexec", "srun"), default="auto")
    calibrate.add_argument("--in-job", action="store_true", help=argparse.SUPPRESS)
    slurm = commands.add_parser("slurm", help="render (and --submit) sbatch scripts for a sweep over node counts")
    add_measure_options(slurm)
    add_slurm_options(slurm)
    return parser


def command_list(args, out):
    names = [args.suite] if args.suite else list(SUITES)
    for name in names:
        case = get_case(name)
        out(f"{case.name}: variants {', '.join(case.variants)}")
        out(f"    size: {case.size_help} (default {case.default_sizes}); dtypes {', '.join(case.dtypes)}")
        out(f"    metrics: {case.metrics_help}")
    if args.suite:
        import inspect

        out("")
        out(inspect.getdoc(sys.modules[type(get_case(args.suite)).__module__]) or "")
    return EXIT_OK


def command_run(args, out, err):
    from mpi4py import MPI

    from bench.sweep import RankError, run_sweep
    from bench.table import format_header, format_row

    comm = MPI.COMM_WORLD
    say = out if comm.rank == 0 else (lambda line: None)
    case, config = make_config(args, comm.size, comm)
    rows = []

    def emit(row):
        if not rows:
            say(f"# mlscale {case.name}: {comm.size} ranks, {config.scaling} scaling, csv {config.csv_path}")
            say(format_header())
        rows.append(row)
        say(format_row(row))

    try:
        wrong = run_sweep(comm, case, config, emit)
    except RankError as error:
        if comm.rank == 0:
            err(f"mlscale: error: {error}")
        return EXIT_WRONG
    for note in config.skipped:
        say(f"# {note}")
    if comm.rank == 0 and not rows:
        say(f"# nothing measured: every point is already in {config.csv_path}")
    if wrong:
        if comm.rank == 0:
            err(f"mlscale: {wrong} wrong elements: a check against the serial reference failed")
        return EXIT_WRONG
    return EXIT_OK


def command_sweep(args, argv):
    from bench.launch import run_under_mpi

    requested = max(parse_ranks(args.ranks, 1 << 30)) if args.ranks else None
    np_ = args.np if args.np is not None else requested or os.cpu_count() or 1
    if np_ < 1:
        raise InputError(f"--np must be >= 1, got {np_}")
    make_config(args, np_)
    forwarded = _strip_options(argv[1:], {"--np": True, "--launcher": True})
    return run_under_mpi(np_, args.launcher, ["run"] + forwarded)


def _strip_options(argv, options):
    """``argv`` without the named options (and their values)."""
    kept, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        name = item.split("=", 1)[0]
        if name in options:
            skip = options[name] and "=" not in item
            continue
        kept.append(item)
    return kept


def command_report(args, out):
    from bench.model import load_calibration
    from bench.report import write_report

    calib = load_calibration(args.model) if args.model else None
    if args.project and not calib:
        raise InputError("--project needs --model CALIB.json (run mlscale calibrate first)")
    project = parse_ranks(args.project, 1 << 40) if args.project else ()
    for line in write_report(args.csv, args.out, calib, project, args.plots):
        out(line)
    return EXIT_OK


def command_calibrate(args, argv, out):
    """From a shell: start 2 ranks running this command again; inside the job: measure and write JSON."""
    if not args.in_job:
        from bench.launch import run_under_mpi

        forwarded = _strip_options(argv, {"--launcher": True}) + ["--in-job"]
        return run_under_mpi(2, args.launcher, forwarded)
    import json

    from mpi4py import MPI

    from bench.model import calibrate

    comm = MPI.COMM_WORLD
    constants = calibrate(comm)
    if comm.rank == 0:
        try:
            with open(args.out, "w") as handle:
                json.dump(constants, handle, indent=2)
        except OSError as error:
            raise InputError(f"cannot write {args.out}: {error.strerror}") from None
        out(f"calibrate: alpha {constants['alpha_s'] * 1e6:.2f} us, 1/beta {1 / constants['beta_s_per_byte'] / 1e9:.2f}"
            f" GB/s, 1/gamma {1 / constants['gamma_s_per_byte'] / 1e9:.2f} GB/s, memcpy "
            f"{constants['memcpy_bytes_per_s'] / 1e9:.2f} GB/s, GEMM {constants['gemm_flops_per_s'] / 1e9:.1f} "
            f"GFLOP/s per thread -> {args.out}")
    return EXIT_OK


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    out = _line_writer(sys.stdout)
    err = _line_writer(sys.stderr)
    rank = _world_rank()
    try:
        args = build_parser().parse_args(argv)
        if args.command == "list":
            return command_list(args, out)
        if args.command == "sweep":
            return command_sweep(args, argv)
        if args.command == "report":
            return command_report(args, out)
        if args.command == "calibrate":
            return command_calibrate(args, argv, out)
        if args.command == "slurm":
            return command_slurm(args, argv, out)
        return command_run(args, out, err)
    except InputError as error:
        if rank == 0:
            err(f"mlscale: error: {error}")
        return EXIT_USAGE
    except Exception as error:  # noqa: BLE001 - one line, then abort every rank
        err(f"mlscale: rank {rank}: {type(error).__name__}: {error}")
        if os.environ.get("MLSCALE_DEBUG"):
            raise
        _abort_job(EXIT_WRONG)
        return EXIT_WRONG


def _line_writer(stream):
    def write(line):
        stream.write(line + "\n")
        stream.flush()

    return write


def _world_rank():
    """This process's rank when MPI is already running (``mlscale run``), else 0."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized():
        return int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    return mpi.COMM_WORLD.rank


def _abort_job(status):
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and mpi.COMM_WORLD.size > 1:
        mpi.COMM_WORLD.Abort(status)


if __name__ == "__main__":
    sys.exit(main())
