"""Running the command line as a user would, for the end-to-end tests."""
import csv
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
TIMEOUT = 300


def mlscale(*args, ranks=None, **environment):
    """Run ``mlscale ARGS`` (under ``mpiexec -n RANKS`` when given) with extra environment variables.

    Returns ``(exit status, stdout, stderr)``; a launch that outlives `TIMEOUT` fails the test.
    """
    launcher = [MPIEXEC, "-n", str(ranks)] if ranks else []
    done = subprocess.run(launcher + [sys.executable, "-m", "bench.cli", *args], cwd=ROOT,
                          env=dict(os.environ, **environment), capture_output=True, text=True, timeout=TIMEOUT)
    return done.returncode, done.stdout, done.stderr


def rows_of(path):
    """The rows of a CSV file as dicts."""
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))
