"""Start an MPI job from a login shell: ``mpiexec -n P`` or, inside a Slurm allocation, ``srun``.

The job runs in its own process group with stdin closed; SIGINT, SIGTERM and
SIGHUP sent to mlscale are forwarded to it, so that Ctrl-C or a ``kill`` of the
``mlscale sweep`` process stops ``mpiexec`` and its ranks too. A SIGKILL of mlscale
(as the OOM killer sends) cannot be forwarded: on Linux the launcher is started with
``PR_SET_PDEATHSIG``, so it gets SIGTERM when mlscale dies and ends its ranks.
"""
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading

from kernels.errors import InputError

LAUNCHERS = ("auto", "mpiexec", "srun")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: After the first forwarded signal, the job has this long to end before it is killed.
KILL_AFTER_SECONDS = 20.0
ROOT_VARIABLES = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


def find_mpiexec():
    """The ``mpiexec`` to use: ``$MLSCALE_MPIEXEC``, the one beside this Python (a venv's MPI wheel), else PATH."""
    configured = os.environ.get("MLSCALE_MPIEXEC")
    if configured:
        found = shutil.which(configured)
        if not found:
            raise InputError(f"MLSCALE_MPIEXEC={configured}: no such executable")
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise InputError("no mpiexec found: install an MPI (pip install 'mlscale[mpich]') or set MLSCALE_MPIEXEC")
    return found


def check_open_mpi_as_root(mpiexec):
    """Refuse in one line to start Open MPI's ``mpiexec`` as root unless the user allowed it.

    Open MPI refuses root with a long text of its own; the two variables of
    `ROOT_VARIABLES` set to 1 allow it (they reach ``mpiexec`` with the environment).
    Runs ``mpiexec --version`` only as root without them.
    """
    if os.geteuid() != 0 or all(os.environ.get(name) == "1" for name in ROOT_VARIABLES):
        return
    try:
        version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=60,
                                 stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return
    if "Open MPI" in version or "OpenRTE" in version:
        raise InputError(f"{mpiexec} is Open MPI, which refuses to run as root: allow it with "
                         f"{'=1 '.join(ROOT_VARIABLES)}=1 in the environment, or run as another user")


def strip_options(argv, options):
    """``argv`` without the options named in ``options`` (name -> whether it takes a value, given as the next
    item or after ``=``): the command line a launcher passes on to the job it starts."""
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


def launch_command(np_, launcher, program):
    """The argument list that runs ``program`` (a list) on ``np_`` ranks.

    ``launcher="auto"`` takes ``srun --mpi=pmi2`` inside a Slurm allocation
    (``SLURM_JOB_ID`` set) and ``mpiexec`` elsewhere.
    """
    if launcher not in LAUNCHERS:
        raise InputError(f"unknown launcher {launcher!r}; choose from {', '.join(LAUNCHERS)}")
    if launcher == "auto":
        launcher = "srun" if os.environ.get("SLURM_JOB_ID") else "mpiexec"
    if launcher == "srun":
        if not shutil.which("srun"):
            raise InputError("--launcher srun: no srun on PATH")
        return ["srun", "--mpi=pmi2", "-n", str(np_)] + program
    mpiexec = find_mpiexec()
    check_open_mpi_as_root(mpiexec)
    return [mpiexec, "-n", str(np_)] + program


def run_under_mpi(np_, launcher, arguments):
    """Run ``mlscale ARGUMENTS`` (a sub-command and its options) on ``np_`` ranks; return its exit status."""
    program = [sys.executable, "-m", "bench.cli"] + list(arguments)
    return run_forwarding_signals(launch_command(np_, launcher, program))


def run_forwarding_signals(command):
    """Run ``command`` in its own process group and return its exit status.

    SIGINT, SIGTERM and SIGHUP received meanwhile are forwarded to the group;
    a job still running `KILL_AFTER_SECONDS` after the first one is killed.
    Returns 128 + the first signal when one arrived (130 for Ctrl-C), else the
    command's status (128 + N when signal N ended it).
    """
    received, child = [], []
    killer = threading.Timer(KILL_AFTER_SECONDS, lambda: child and _signal_group(child[0], signal.SIGKILL))
    killer.daemon = True

    def forward(signum, frame):
        received.append(signum)
        if child:
            _signal_group(child[0], signum)
        if len(received) == 1:
            killer.start()

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    try:
        try:
            child.append(subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True,
                                          preexec_fn=_ends_with(os.getpid())))
        except OSError as error:
            raise InputError(f"cannot start {command[0]}: {error.strerror}") from None
        for signum in received:
            _signal_group(child[0], signum)
        status = child[0].wait()
    finally:
        killer.cancel()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        return 128 + received[0]
    return 128 - status if status < 0 else status


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _ends_with(parent):
    """A ``preexec_fn`` that has the kernel send SIGTERM to the child when ``parent`` dies (Linux;
    elsewhere None: only forwarded signals stop the job)."""
    if not sys.platform.startswith("linux"):
        return None

    def arrange():
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the request: nobody would send it
            os.kill(os.getpid(), signal.SIGTERM)

    return arrange


def _signal_group(process, signum):
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass
