"""``mlscale slurm``: one sbatch script per node count, rendered from the templates in ``slurm/``.

Each script asks for ``--nodes N --ntasks-per-node T``, changes to the submit
directory and runs ``mlscale run SUITE`` with the forwarded measuring options
and the suite's settings in effect when it was rendered (``--set`` or
``MLSCALE_*``, written as ``--set NAME=VALUE`` so the job does not depend on the
environment it is submitted from), launched by ``srun --mpi=pmi2`` (default) or the MPI's own ``mpiexec``, with the
Python that rendered it (so a virtual environment is used on the compute nodes).
Every job writes its own CSV, ``OUT/SUITE-SCALING[-gpu]-N{nodes}.csv``, so jobs
never append to one file at the same time; ``mlscale report OUT/*.csv`` reads them
together. With ``--calibrate`` each job first runs ``mlscale calibrate --force`` on its own
allocation (intra-node on one node, between two nodes on more: `bench.calibrate`), into
``OUT/...-N{nodes}.calib.json``, so the models are priced with constants of the nodes and the
minutes of the points (on a shared node a calibration ten minutes away was 4-23 % off per table
here); the printed report command names one of each scope.

When ``sinfo`` answers, a node count larger than the partition (``--partition``,
else the default one) is refused before anything is written: such a job would
pend forever. Without ``sinfo`` the scripts are rendered unchecked.

One script per node count rather than a job array: the elements of a Slurm job
array share a single resource request, so they cannot differ in ``--nodes``.

Templates (``string.Template``, ``${name}`` fields): ``strong.sbatch`` and
``weak.sbatch`` (chosen by ``--scaling``) and ``gpu.sbatch`` (chosen by
``--gpus-per-node``, one rank per GPU, ``--backend cupy``).
"""
import os
import re
import shlex
import shutil
import string
import subprocess
import sys

from bench.options import make_config
from bench.units import parse_ranks
from kernels.errors import InputError

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Templates: in the checkout (editable installs), else where setup.cfg's data_files puts them.
TEMPLATE_DIR = next(
    (folder for folder in (os.path.join(PACKAGE_ROOT, "slurm"), os.path.join(sys.prefix, "share", "mlscale", "slurm"))
     if os.path.isdir(folder)),
    os.path.join(PACKAGE_ROOT, "slurm"),
)
LAUNCHERS = ("srun", "mpiexec")
#: Values written into ``#SBATCH`` lines: one word, no quotes or shell syntax.
_SBATCH_VALUE = re.compile(r"[A-Za-z0-9_.,:@+=/-]+")
#: Measuring options forwarded to ``mlscale run`` (``--scaling`` and ``--backend`` come from the template).
_FORWARDED = (("--variants", "variants"), ("--sizes", "sizes"), ("--ranks", "ranks"), ("--iters", "iters"),
              ("--warmup", "warmup"), ("--threads", "threads"), ("--dtype", "dtype"), ("--time-limit", "time_limit"))


def add_slurm_options(parser):
    """Add the Slurm-specific options to the ``slurm`` sub-command's parser."""
    parser.add_argument("--nodes", default="1", help="node counts, one job each, e.g. 1,2,4 (default 1)")
    parser.add_argument("--ntasks-per-node", type=int,
                        help="MPI ranks per node (required; with --gpus-per-node it defaults to one per GPU)")
    parser.add_argument("--gpus-per-node", type=int, help="GPUs per node: selects the GPU template (--backend cupy)")
    parser.add_argument("--partition", help="sbatch --partition")
    parser.add_argument("--time", help="sbatch --time limit, e.g. 00:30:00")
    parser.add_argument("--account", help="sbatch --account")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="srun",
                        help="srun --mpi=pmi2 (default) or the MPI's mpiexec inside the allocation")
    parser.add_argument("--out", default="results", help="folder for the scripts, CSVs and job logs (default results)")
    parser.add_argument("--submit", action="store_true", help="submit every script with sbatch and print the job ids")
    parser.add_argument("--calibrate", nargs="?", const="full", choices=("full", "quick"),
                        help="each job of 2+ ranks runs `mlscale calibrate --force` (quick: with --quick) on its "
                             "own nodes before the sweep (OUT/PREFIX-N{nodes}.calib.json: intra-node on one node, "
                             "inter-node on more)")


def parse_node_counts(text):
    """Node counts from a comma list (``1,2,4``), sorted, each >= 1."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"malformed --nodes {text!r}: expected node counts such as 1,2,4") from None
    if not counts:
        raise InputError("--nodes names no node count")
    if min(counts) < 1:
        raise InputError(f"--nodes: node counts must be >= 1, got {min(counts)}")
    return sorted(set(counts))


def choose_template(args):
    """``gpu`` with --gpus-per-node, else the --scaling (``strong`` or ``weak``); checks the GPU settings."""
    if args.gpus_per_node is None:
        if args.backend == "cupy":
            raise InputError("--backend cupy runs the GPU template, which needs --gpus-per-node")
        return args.scaling
    if args.gpus_per_node < 1:
        raise InputError(f"--gpus-per-node must be >= 1, got {args.gpus_per_node}")
    if args.backend != "cupy":
        raise InputError("--gpus-per-node selects the GPU template, which runs --backend cupy: add it")
    if args.ntasks_per_node not in (None, args.gpus_per_node):
        raise InputError(f"the GPU template runs one rank per GPU: --ntasks-per-node {args.ntasks_per_node} "
                         f"differs from --gpus-per-node {args.gpus_per_node}")
    return "gpu"


def check_job_sizes(args, node_counts, tasks_per_node):
    """Raise `InputError` unless the suite can run on ``nodes * tasks_per_node`` ranks for every node count.

    Returns notes on (rank count, variant) pairs that are skipped in some job.
    """
    from bench.sweep import plan_points

    notes = []
    for nodes in node_counts:
        job_size = nodes * tasks_per_node
        shape = f"{nodes} node(s) x {tasks_per_node} task(s) = {job_size} ranks"
        if args.ranks and max(parse_ranks(args.ranks, sys.maxsize)) > job_size:
            raise InputError(f"--ranks {args.ranks} asks for more ranks than the job of {shape}")
        case, config = make_config(args, job_size)
        try:
            _, skipped = plan_points(case, config)
        except InputError as error:
            raise InputError(f"suite {case.name!r} cannot run on {shape}: {error}") from None
        notes += [f"N{nodes}: {note}" for note in skipped]
    return case, notes


def site_options(args):
    """The optional ``#SBATCH`` lines (partition, time, account) as one block."""
    lines = []
    for option, value in (("partition", args.partition), ("time", args.time), ("account", args.account)):
        if value is None:
            continue
        if not _SBATCH_VALUE.fullmatch(value):
            raise InputError(f"--{option} {value!r} is not a plain sbatch value (no spaces, quotes or shell syntax)")
        lines.append(f"#SBATCH --{option}={value}")
    return "\n".join(lines)


def partition_size(partition):
    """``(name, nodes)`` of ``partition`` (None: the default partition) as ``sinfo`` reports it.

    Returns None when ``sinfo`` is missing, fails, or does not list the partition.
    """
    if shutil.which("sinfo") is None:
        return None
    try:
        done = subprocess.run(["sinfo", "--noheader", "--format=%P %D"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    nodes, default = {}, None
    for line in done.stdout.splitlines():
        words = line.split()
        if len(words) != 2 or not words[1].isdigit():
            continue
        name = words[0].rstrip("*")
        default = name if words[0].endswith("*") else default
        nodes[name] = nodes.get(name, 0) + int(words[1])  # one line per node state
    name = partition or default
    return (name, nodes[name]) if name in nodes else None


def check_partition(args, node_counts):
    """Raise `InputError` when the largest node count exceeds the partition's nodes (when sinfo can tell)."""
    known = partition_size(args.partition)
    if known and max(node_counts) > known[1]:
        raise InputError(f"--nodes {max(node_counts)}: partition {known[0]!r} has {known[1]} node(s) (sinfo); "
                         "the job would pend forever")


def run_options(args, settings):
    """The measuring options and ``settings`` (`bench.settings.Settings`) as passed on to ``mlscale run``
    (a string starting with a space)."""
    words = []
    for option, attribute in _FORWARDED:
        value = getattr(args, attribute)
        if value not in (None, ""):
            words += [option, str(value)]
    if not args.check:
        words.append("--no-check")
    for assignment in settings.assignments():
        words += ["--set", assignment]
    if args.force:
        words.append("--force")
    return "".join(" " + shlex.quote(word) for word in words)


def launch_prefix(launcher, ranks):
    """``srun --mpi=pmi2`` or ``MPIEXEC -n RANKS`` (the MPI beside this Python, see `bench.launch`)."""
    if launcher == "srun":
        return "srun --mpi=pmi2"
    from bench.launch import find_mpiexec

    return f"{shlex.quote(find_mpiexec())} -n {ranks}"


def render(template, fields):
    """The text of ``slurm/TEMPLATE.sbatch`` with ``fields`` substituted (every field must be given)."""
    with open(os.path.join(TEMPLATE_DIR, f"{template}.sbatch")) as handle:
        return string.Template(handle.read()).substitute(fields)


def render_jobs(args, argv, node_counts, tasks_per_node, template, prefix, settings):
    """``[(script path, script text)]``, one per node count, named ``OUT/PREFIX-N{nodes}``; nothing is written."""
    out_dir = os.path.abspath(args.out)
    common = dict(
        rendered_by=" ".join(shlex.quote(word) for word in ["mlscale"] + list(argv)).replace("\n", " "),
        ntasks_per_node=tasks_per_node, gpus_per_node=args.gpus_per_node, site_options=site_options(args),
        package_root=shlex.quote(PACKAGE_ROOT), python=shlex.quote(sys.executable), suite=shlex.quote(args.suite),
        scaling=args.scaling, run_options=run_options(args, settings),
    )
    jobs = []
    for nodes in node_counts:
        stem = os.path.join(out_dir, f"{prefix}-N{nodes}")
        launch = launch_prefix(args.launcher, nodes * tasks_per_node)
        quick = " --quick" if args.calibrate == "quick" else ""
        calibrate = (f"{launch} {common['python']} -m bench.cli calibrate --in-job --force{quick} --out "
                     f"{shlex.quote(calibration_path(stem))}\n") if calibrated(args, nodes, tasks_per_node) else ""
        text = render(template, dict(
            common, job_name=os.path.basename(stem), nodes=nodes, log=f"{stem}-%j.log", csv=shlex.quote(f"{stem}.csv"),
            launch=launch, calibrate=calibrate,
        ))
        jobs.append((f"{stem}.sbatch", text))
    return jobs


def calibrated(args, nodes, tasks_per_node):
    """Whether the job on ``nodes`` calibrates: with ``--calibrate``, when it has two ranks or more (`calibrate`
    measures between two)."""
    return args.calibrate is not None and nodes * tasks_per_node >= 2


def calibration_path(stem):
    """Where the job of ``stem`` (``OUT/PREFIX-N{nodes}``) writes its calibration with ``--calibrate``."""
    return f"{stem}.calib.json"


def report_hint(args, prefix, node_counts, tasks_per_node):
    """The ``mlscale report`` command for the jobs' CSVs; with ``--calibrate``, ``--model`` with the calibration of
    the one-node job (intra-node) and of the first job on more nodes (inter-node), those that calibrate."""
    stem = os.path.join(args.out, f"{prefix}-N")
    counts = [count for count in node_counts if calibrated(args, count, tasks_per_node)]
    chosen = [count for count in counts if count == 1] + [count for count in counts if count > 1][:1]
    return f"mlscale report {shlex.quote(stem)}*.csv" + "".join(
        f" --model {shlex.quote(calibration_path(f'{stem}{count}'))}" for count in chosen)


def submit(path):
    """``sbatch --parsable PATH`` from the current directory; return the job id."""
    done = subprocess.run(["sbatch", "--parsable", path], capture_output=True, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise InputError(f"sbatch rejected {path}: {reason}")
    return done.stdout.strip().split(";")[0]


def command_slurm(args, argv, out):
    """Validate everything, write one script per node count, and submit them with ``--submit``.

    Returns the exit status (0); bad input raises `InputError` before any script is
    written or submitted.
    """
    node_counts = parse_node_counts(args.nodes)
    check_partition(args, node_counts)
    template = choose_template(args)
    tasks_per_node = args.ntasks_per_node if args.ntasks_per_node is not None else args.gpus_per_node
    if tasks_per_node is None:
        raise InputError("--ntasks-per-node is required (MPI ranks per node)")
    if tasks_per_node < 1:
        raise InputError(f"--ntasks-per-node must be >= 1, got {tasks_per_node}")
    if args.csv:
        raise InputError("mlscale slurm writes one CSV per node count into --out; drop --csv")
    if args.submit and shutil.which("sbatch") is None:
        raise InputError("--submit: no sbatch on PATH (run on a Slurm login node, or drop --submit)")
    if re.search(r"\s", os.path.abspath(args.out)):
        raise InputError(f"--out {args.out!r}: the path must not contain spaces (it goes into #SBATCH --output)")
    case, notes = check_job_sizes(args, node_counts, tasks_per_node)
    prefix = f"{case.name}-{args.scaling}{'-gpu' if template == 'gpu' else ''}"
    jobs = render_jobs(args, argv, node_counts, tasks_per_node, template, prefix, case.settings)
    os.makedirs(os.path.abspath(args.out), exist_ok=True)
    if args.calibrate is not None and not calibrated(args, node_counts[0], tasks_per_node):
        notes.append(f"N{node_counts[0]}: one rank, no calibration (mlscale calibrate measures between two ranks)")
    for note in case.settings.warnings + notes:
        out(f"# {note}")
    for path, text in jobs:
        with open(path, "w") as handle:
            handle.write(text)
    for path, _ in jobs:
        out(f"submitted job {submit(path)}: {path}" if args.submit else path)
    out(f"# {'after the jobs' if args.submit else 'sbatch each script, then'}: {report_hint(args, prefix, node_counts, tasks_per_node)}")
    return 0
