"""Running the command line as a user would, for the end-to-end tests."""
import csv
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
TIMEOUT = 300
#: Bound on a run that must end by itself within seconds (an error, a signal); generous for a loaded machine.
PROMPT = 120


def command(*args, ranks=None):
    """The argument list of ``mlscale ARGS`` (under ``mpiexec -n RANKS`` when given)."""
    launcher = [MPIEXEC, "-n", str(ranks)] if ranks else []
    return launcher + [sys.executable, "-m", "bench.cli", *args]


def mlscale(*args, ranks=None, timeout=TIMEOUT, file_size_limit=None, **environment):
    """Run ``mlscale ARGS`` (under ``mpiexec -n RANKS`` when given) with extra environment variables
    (and at most ``file_size_limit`` bytes per file written, ``ulimit -f``, when given).

    Returns ``(exit status, stdout, stderr)``; a launch that outlives ``timeout`` fails the test.
    """
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    done = subprocess.run(command(*args, ranks=ranks), cwd=ROOT, env=dict(os.environ, **environment),
                          capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit if file_size_limit else None)
    return done.returncode, done.stdout, done.stderr


def start(*args, ranks=None, **environment):
    """Start ``mlscale ARGS`` in a process group of its own (for signals); return the `subprocess.Popen`."""
    return subprocess.Popen(command(*args, ranks=ranks), cwd=ROOT, env=dict(os.environ, **environment),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for_rows(path, count, process):
    """Wait until ``path`` holds ``count`` rows (or ``process`` ended); fail after `TIMEOUT` seconds."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and process.poll() is None:
        if os.path.exists(path) and len(rows_of(path)) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{path} never reached {count} rows (exit status {process.poll()})")


def processes_mentioning(text):
    """PIDs of the processes whose command line contains ``text``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if text.encode() in handle.read():
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def rows_of(path):
    """The rows of a CSV file as dicts."""
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))
