"""The command line: ``mlscale list | run | sweep | report``.

Exit status: 0 every point measured and valid; 1 a check failed or a rank
failed; 2 bad usage or input; 3 ``--time-limit`` stopped the sweep early (the
measured points valid); 128 + N after signal N (130 for Ctrl-C); 141 when
the reader of stdout went away (``mlscale list | head -1``). Errors are one line
on stderr: from rank 0 when every rank raised it, else from the failing rank,
which then ends the job with MPI_Abort (`bench.faults`); MLSCALE_DEBUG=1 adds
the traceback.
"""
import argparse
import os
import signal
import sys
import textwrap

from bench.faults import (EXIT_OK, EXIT_USAGE, EXIT_WRONG, RankError, abort_job, error_line, stop_on_signals,
                          world_rank)
from bench.models.base import MAX_PROJECTED_RANKS
from bench.options import add_measure_options, make_config
from bench.registry import SUITES, case_class
from bench.settings import canonical
from bench.slurm import add_slurm_options, command_slurm
from bench.stability import MAX_SPREAD, check_max_spread, judge_calibration
from bench.units import parse_ranks
from kernels.errors import InputError


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as an `InputError` (one line, status 2)."""

    def error(self, message):
        raise InputError(message)


def build_parser():
    parser = _Parser(prog="mlscale", description="Measure how parallel ML algorithms scale with MPI.")
    parser.add_argument("--version", action="version", version=f"mlscale {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    listing = commands.add_parser("list", help="suites, variants, what size means, metrics")
    listing.add_argument("suite", nargs="?")
    run = commands.add_parser("run", help="inside mpiexec / srun: measure, print a table, append CSV")
    add_measure_options(run)
    run.add_argument("--tty", action="store_true", help=argparse.SUPPRESS)  # `sweep` runs on a terminal
    sweep = commands.add_parser("sweep", help="from a shell: start the MPI job, then as `run`")
    add_measure_options(sweep)
    sweep.add_argument("--np", type=int, help="ranks to start (default: the largest --ranks, else the cores)")
    sweep.add_argument("--launcher", choices=("auto", "mpiexec", "srun"), default="auto")
    report = commands.add_parser("report", help="summary.md (bandwidth or scaling by suite kind), CSV, plots, JSON")
    report.add_argument("csv", nargs="+")
    report.add_argument("--out", default="report", help="folder for scaling.csv, fits.csv, summary.md, plots")
    report.add_argument("--format", choices=("text", "json"), default="text",
                        help="stdout: the notes (text) or the report as one JSON document (json; notes on stderr)")
    report.add_argument("--json", metavar="PATH", help="also write the report as a JSON document to PATH")
    report.add_argument("--model", action="append", help="calibration JSON from `mlscale calibrate`: predicted "
                        "beside measured; twice for an intra-node and an inter-node file (projections use the latter)")
    report.add_argument("--project", help="rank counts to extrapolate to with --model, e.g. 64,256,1024 (at most "
                        f"{MAX_PROJECTED_RANKS})")
    report.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNG plots")
    calibrate = commands.add_parser("calibrate", help="measure the cost models' constants on 2 ranks "
                                      "(inside a two-node allocation: between the nodes); write JSON")
    calibrate.add_argument("--out", default="calib.json", help="where to write the constants (checked before "
                           "measuring; written whole or not at all)")
    calibrate.add_argument("--quick", action="store_true", help="the same tables at fewer sizes, in one round "
                           "(a few seconds): rough figures for tests and a first look")
    calibrate.add_argument("--max-spread", type=float, metavar="X", default=MAX_SPREAD,
                           help=f"a table is unstable when the median over its entries of their rounds' "
                                f"interquartile range over their median exceeds X (default {MAX_SPREAD})")
    calibrate.add_argument("--force", action="store_true",
                           help="write the file even when a table is unstable (each is named; reports warn)")
    calibrate.add_argument("--fresh", action="store_true",
                           help="carry no handoff state from the calibration at --out (see bench/carried_state.py)")
    calibrate.add_argument("--launcher", choices=("auto", "mpiexec", "srun"), default="auto")
    calibrate.add_argument("--in-job", action="store_true", help=argparse.SUPPRESS)
    slurm = commands.add_parser("slurm", help="render (and --submit) sbatch scripts for a sweep over node counts")
    add_measure_options(slurm)
    add_slurm_options(slurm)
    return parser


def _version():
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mlscale")
    except PackageNotFoundError:
        return "(not installed)"


def _mpi_world():
    """``COMM_WORLD`` of the running job, with SIGINT / SIGTERM set to end every rank (`stop_on_signals`)."""
    from mpi4py import MPI

    stop_on_signals()
    return MPI.COMM_WORLD


def command_list(args, out):
    """Every suite in two lines (variants and backends, first sentence of its description), or one suite in full."""
    if not args.suite:
        for name in SUITES:
            try:
                case = case_class(name)
            except InputError as error:
                out(f"{name}: {error}")
                continue
            out(_first_line(case))
            if case.description:
                out(textwrap.fill(case.description.split(". ")[0].rstrip(".") + ".", 100, initial_indent="    ",
                                  subsequent_indent="    "))
        return EXIT_OK
    case = case_class(args.suite)
    out(_first_line(case))
    if case.description:
        out(textwrap.fill(case.description, 100, initial_indent="    ", subsequent_indent="    "))
    out(f"    size: {case.size_help} (default {case.default_sizes}); dtypes {', '.join(case.dtypes)}")
    out(f"    metrics: {case.metrics_help}")
    if not case.declared_settings:
        out("    settings: none")
        return EXIT_OK
    out("    settings (MLSCALE_NAME=VALUE in the environment, or --set NAME=VALUE):")
    rows = [(s.name, "derived" if s.default is None else canonical(s.default), s.describe_allowed(), s.help)
            for s in case.declared_settings]
    rows.insert(0, ("name", "default", "allowed", "what"))
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    for row in rows:
        out("      " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    return EXIT_OK


def _first_line(case):
    """``NAME: variants A, B; backends numpy, cupy`` for `mlscale list`."""
    return f"{case.name}: variants {', '.join(case.variants)}; backends {', '.join(case.backends)}"


def command_run(args, out, err):
    from bench.progress import EXIT_TIME_LIMIT, Console
    from bench.load import busy, busy_summary
    from bench.stability import unstable_note, unstable_summary
    from bench.sweep import run_sweep
    from bench.table import format_header, format_row

    comm = _mpi_world()
    console = Console(sys.stdout, args.tty or sys.stdout.isatty())
    say = console.line if comm.rank == 0 else (lambda line: None)
    say_error = err if comm.rank == 0 else (lambda line: None)
    case, config = make_config(args, comm.size, comm)
    for warning in case.settings.warnings:
        say_error(f"mlscale: warning: {warning}")
    say(f"# mlscale {case.name}: {comm.size} ranks, {config.scaling} scaling, csv {config.csv_path}")
    say(format_header())
    rows = []

    def emit(row):
        rows.append(row)
        say(format_row(row))
        note = unstable_note(row, config.max_spread)
        if note:
            say(note)

    try:
        result = run_sweep(comm, case, config, emit, console.status)
    except RankError as error:
        if comm.rank == 0:
            err(f"mlscale: error: {error}")
        return EXIT_WRONG
    for note in result.skipped:
        say(f"# {note}")
    for summary in (unstable_summary(sum(not row["stable"] for row in rows), len(rows), config.max_spread),
                    busy_summary(sum(busy(row["params"].get("load")) for row in rows), len(rows))):
        if summary:
            say(summary)
    if comm.rank == 0 and not rows and not result.not_measured:
        say(f"# nothing measured: every point is already in {config.csv_path}")
    if result.not_measured:
        say(f"# time limit {args.time_limit}: stopped before the next point; {result.not_measured} point(s) "
            f"not measured (run the same command again to measure them)")
    if result.wrong:
        if comm.rank == 0:
            err(f"mlscale: {result.wrong} wrong elements: a check against the serial reference failed")
        return EXIT_WRONG
    return EXIT_TIME_LIMIT if result.not_measured else EXIT_OK


def command_sweep(args, argv):
    from bench.launch import run_under_mpi, strip_options

    requested = max(parse_ranks(args.ranks, 1 << 30)) if args.ranks else None
    np_ = args.np if args.np is not None else requested or os.cpu_count() or 1
    if np_ < 1:
        raise InputError(f"--np must be >= 1, got {np_}")
    make_config(args, np_)
    forwarded = strip_options(argv[1:], {"--np": True, "--launcher": True})
    terminal = ["--tty"] if sys.stdout.isatty() else []  # the ranks' stdout is a pipe of the launcher
    return run_under_mpi(np_, args.launcher, ["run"] + forwarded + terminal)


def command_report(args, out, err):
    """Write the report's files; print its notes, or (``--format json``) the JSON document with notes on stderr."""
    from bench.report.model import load_calibrations
    from bench.report.output import dumps, write_report

    calib = load_calibrations(args.model) if args.model else None
    if args.project and not calib:
        raise InputError("--project needs --model CALIB.json (run mlscale calibrate first)")
    project = parse_ranks(args.project, sys.maxsize) if args.project else ()
    notes, document = write_report(args.csv, args.out, calib, project, args.plots, args.json)
    for line in notes:  # warnings go to stderr always; the other notes there only beside JSON on stdout
        (err if args.format == "json" or line.startswith("report: warning") else out)(line)
    if args.format == "json":
        out(dumps(document))
    return EXIT_OK


def command_calibrate(args, argv, out):
    """From a shell: check ``--out``, start 2 ranks running this command again; inside the job: measure
    and write JSON (`bench.calibrate.write_calibration`)."""
    from bench.calibrate import check_output_path

    check_output_path(args.out)
    check_max_spread(args.max_spread)
    if not args.in_job:
        from bench.launch import run_under_mpi, strip_options

        forwarded = strip_options(argv, {"--launcher": True}) + ["--in-job"]
        return run_under_mpi(2, args.launcher, forwarded)
    from bench.calibrate import calibrate, summary_line, write_calibration
    from bench.carried_state import with_earlier_state

    comm = _mpi_world()
    try:
        constants = calibrate(comm, quick=args.quick)
    except RankError as error:  # raised on every rank together
        if comm.rank == 0:
            _line_writer(sys.stderr)(f"mlscale: error: {error}")
        return EXIT_WRONG
    if comm.rank == 0:
        for line in judge_calibration(constants, args.max_spread, args.force, args.out):
            out(line)
        if not args.fresh:
            constants, note = with_earlier_state(constants, args.out)
            if note:
                out(note)
        write_calibration(args.out, dict(constants, max_spread=args.max_spread))
        out(summary_line(constants, args.out))
    return EXIT_OK


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    out = _line_writer(sys.stdout)
    err = _line_writer(sys.stderr)
    try:
        args = build_parser().parse_args(argv)
        if not (args.command == "run" or getattr(args, "in_job", False)):
            _without_mpi()
        if args.command == "list":
            return command_list(args, out)
        if args.command == "sweep":
            return command_sweep(args, argv)
        if args.command == "report":
            return command_report(args, out, err)
        if args.command == "calibrate":
            return command_calibrate(args, argv, out)
        if args.command == "slurm":
            return command_slurm(args, argv, out)
        return command_run(args, out, err)
    except InputError as error:  # raised on every rank: options are the same, the sweep agrees on errors
        if world_rank() == 0:
            err(error_line(error, 0))
        return EXIT_USAGE
    except BrokenPipeError:  # the reader of stdout went away (`mlscale list | head -1`): end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:  # Ctrl-C outside an MPI job (inside one, `stop_on_signals` ends it)
        if world_rank() == 0:
            err("mlscale: interrupted by SIGINT")
        return 128 + signal.SIGINT
    except Exception as error:  # noqa: BLE001 - maybe on this rank alone: one line, then abort every rank
        return abort_job(error)


def _without_mpi():
    """Commands that start no MPI job here (``list``, ``report``, ``slurm``; ``sweep`` and ``calibrate`` before
    they launch one) import mpi4py without initialising MPI: no shared-memory segments, no network probes."""
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = mpi4py.rc.finalize = False


def _line_writer(stream):
    def write(line):
        stream.write(line + "\n")
        stream.flush()

    return write


if __name__ == "__main__":
    sys.exit(main())
