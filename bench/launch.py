"""Start an MPI job from a login shell: ``mpiexec -n P`` or, inside a Slurm allocation, ``srun``."""
import os
import shutil
import subprocess
import sys

from kernels.errors import InputError

LAUNCHERS = ("auto", "mpiexec", "srun")


def find_mpiexec():
    """The ``mpiexec`` to use: ``$MLSCALE_MPIEXEC``, the one beside this Python (a venv's MPI wheel), else PATH."""
    configured = os.environ.get("MLSCALE_MPIEXEC")
    if configured:
        return configured
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise InputError("no mpiexec found: install an MPI (pip install 'mlscale[mpich]') or set MLSCALE_MPIEXEC")
    return found


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
    return [find_mpiexec(), "-n", str(np_)] + program


def run_under_mpi(np_, launcher, arguments):
    """Run ``mlscale ARGUMENTS`` (a sub-command and its options) on ``np_`` ranks; return its exit status."""
    program = [sys.executable, "-m", "bench.cli"] + list(arguments)
    command = launch_command(np_, launcher, program)
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 130
