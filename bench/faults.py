"""How a job ends when one rank fails or a signal arrives: one line, a non-zero status, every rank stops.

- An error raised on every rank together (bad options, or an error made known to
  every rank by `agree`) ends the command normally: rank 0 prints one
  line.
- An error on one rank alone that the others cannot hear of (inside timed work
  they wait in a collective) ends the job with `abort_job`: that rank prints one
  line (and the traceback with ``MLSCALE_DEBUG=1``), then calls ``MPI_Abort``.
- SIGINT and SIGTERM (Ctrl-C, ``scancel``, ``mpiexec`` forwarding them): after
  `stop_on_signals`, a watcher thread ends the job with ``MPI_Abort(128 + signal)``
  even while the main thread is blocked inside MPI, once a CSV row being written
  (`uninterrupted`) is complete.

Exit status: 1 for an unexpected error, 2 for an `InputError`, 128 + N for signal N.
"""
import os
import signal
import sys
import threading
import time
import traceback

import numpy as np

from kernels.errors import InputError

EXIT_OK, EXIT_WRONG, EXIT_USAGE = 0, 1, 2
SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: A rank other than 0 that gets a signal leaves rank 0 this long to end the job
#: (and print the line) before it ends the job itself; mpiexec and srun signal
#: every rank, so rank 0 normally ends it at once.
PEER_GRACE_SECONDS = 5.0
#: How long the watcher waits for a CSV row being written before it aborts anyway.
ROW_WAIT_SECONDS = 30.0

_row_lock = threading.Lock()


def error_line(error, rank):
    """The one line that reports ``error`` raised on ``rank`` (`describe` after ``mlscale: error:``)."""
    return f"mlscale: error: {describe(error, rank)}"


def describe(error, rank):
    """An `InputError`'s message; for any other error, the rank, the error's type and its message."""
    if isinstance(error, InputError):
        return str(error)
    return f"rank {rank}: {type(error).__name__}: {error}"


def exit_status(error):
    """`EXIT_USAGE` for an `InputError`, else `EXIT_WRONG`."""
    return EXIT_USAGE if isinstance(error, InputError) else EXIT_WRONG


def debugging():
    """Whether ``MLSCALE_DEBUG`` asks for tracebacks."""
    return os.environ.get("MLSCALE_DEBUG", "") not in ("", "0")


def world_rank():
    """This process's rank in the MPI job (0 outside one, or before MPI starts)."""
    world = _world()
    if world is not None:
        return world.rank
    return int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))


def abort_job(error):
    """Report ``error`` of this rank alone in one line and end every rank of the job.

    Under ``MLSCALE_DEBUG`` the traceback follows the line. When MPI runs, this
    calls ``MPI_Abort`` on ``COMM_WORLD`` with `exit_status` and never returns;
    otherwise it returns the exit status.
    """
    _write(error_line(error, world_rank()))
    if debugging():
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    return _end_job(exit_status(error))


def stop_on_signals():
    """From now on SIGINT and SIGTERM end the whole MPI job within seconds.

    A Python signal handler runs only between byte codes of the main thread, never
    while it is blocked inside MPI, so the handlers do nothing but wake a watcher
    thread (`signal.set_wakeup_fd`). The watcher of rank 0 prints one line and calls
    ``MPI_Abort(128 + signal)``; other ranks leave rank 0 `PEER_GRACE_SECONDS` to
    do so first. A CSV row being written (`uninterrupted`) is finished first.
    Call it once, from the main thread, after MPI is initialised.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for signum in SIGNALS:
        signal.signal(signum, _wake_only)
    threading.Thread(target=_watch, args=(read_fd,), name="mlscale-signals", daemon=True).start()


class uninterrupted:
    """Context manager: work a signal must not cut in half (appending a CSV row)."""

    def __enter__(self):
        _row_lock.acquire()

    def __exit__(self, *exc):
        _row_lock.release()


def _wake_only(signum, frame):
    """The Python-level handler: the watcher thread, woken by the C-level handler, does the work."""


def _watch(read_fd):
    while True:
        signum = os.read(read_fd, 1)[0]
        if signum in SIGNALS:
            break
    rank = world_rank()
    if rank != 0:
        time.sleep(PEER_GRACE_SECONDS)
    _row_lock.acquire(timeout=ROW_WAIT_SECONDS)
    name = signal.Signals(signum).name
    _write(f"mlscale: interrupted by {name}" + (f" (rank {rank})" if rank else "")
           + "; rows already written are complete")
    _end_job(128 + signum)


def _write(line):
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _world():
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return None
    return mpi.COMM_WORLD


#: Time left to ``mpiexec`` to forward a rank's last line before ``MPI_Abort`` (Hydra's proxy
#: dropped it in about 1 run in 8 when the abort came at once).
FORWARD_SECONDS = 0.3


def _end_job(status):
    """``MPI_Abort(status)`` when MPI runs (its own notice silenced: our line said it); else return ``status``."""
    world = _world()
    if world is None:
        if threading.current_thread() is not threading.main_thread():
            os._exit(status)
        return status
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    time.sleep(FORWARD_SECONDS)  # mpiexec's proxy forwards our line before the abort tears it down
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    world.Abort(status)
    return status


class RankError(RuntimeError):
    """An error raised on some rank and made known to every rank by `agree`."""


class AgreedInputError(InputError):
    """An `InputError` raised on some rank and made known to every rank by `agree`."""


#: Errors raised on every rank together: the sweep ends without an abort.
AGREED = (AgreedInputError, RankError)
#: How long a rank whose step failed waits for the others to hear of it before it aborts the job
#: (``MLSCALE_GRACE_SECONDS`` sets another: a job whose ranks drift apart by more may want longer).
AGREE_GRACE_SECONDS = 10.0
GRACE_VARIABLE = "MLSCALE_GRACE_SECONDS"


def grace_seconds(text):
    """The positive, finite number of seconds ``text`` gives, else None."""
    try:
        seconds = float(text)
    except (TypeError, ValueError):
        return None
    return seconds if 0 < seconds < float("inf") else None


def agree_grace_seconds():
    """``MLSCALE_GRACE_SECONDS`` when it is a positive number of seconds (`grace_seconds`), else
    `AGREE_GRACE_SECONDS` (`bench.settings` warns of a value it cannot use)."""
    return grace_seconds(os.environ.get(GRACE_VARIABLE)) or AGREE_GRACE_SECONDS


def agree(comm, function, *args):
    """Call ``function(*args)`` on every rank; if any rank raises, raise on all ranks.

    The error raised everywhere is the lowest failing rank's: an `AgreedInputError`
    with its message when it was an `InputError`, else a `RankError` naming the
    rank and the error. A failing rank cannot know whether the others will get
    here: they may wait in a collective of ``function`` that it left. It waits
    `agree_grace_seconds` for them, then ends the job with the same line and
    status (`bench.faults.abort_job`).

    Communication: one ``Iallreduce`` of an int; on failure one allgather of the
    messages.
    """
    result, caught, failure = None, None, None
    try:
        result = function(*args)
    except Exception as error:  # noqa: BLE001 - reported on every rank below
        caught, failure = error, failure_of(error, comm.rank)
    flag, failed = np.array([failure is not None], dtype=np.intc), np.zeros(1, dtype=np.intc)
    request = comm.Iallreduce(flag, failed)  # op: SUM
    if failure is None:
        request.Wait()
    else:
        _wait_or_abort(request, caught, agree_grace_seconds())
    if failed[0]:
        raise agreed_error(next(f for f in comm.allgather(failure) if f))
    return result


#: How long a rank whose timed work failed waits to see the same failure on every rank (`failing_together`;
#: a shorter ``MLSCALE_GRACE_SECONDS`` shortens it too).
TOGETHER_SECONDS = 2.0


class failing_together:
    """Context manager for timed work on ``comm``: an error raised there on every rank is raised on every rank
    as the lowest rank's agreed error (one line from rank 0, as `agree` gives); on some ranks alone (the others
    wait in a collective of the work) the failing rank ends the job (`abort_job`) after `TOGETHER_SECONDS` (or the shorter grace).

    The work itself pays nothing: a duplicate of ``comm`` (made on entry, freed on exit, collective) carries
    the failing ranks' agreement, so it never meets the work's own collectives. Communication on failure: one
    ``Iallreduce`` of an int among the failing ranks, one allgather of the messages when all failed.
    """

    def __init__(self, comm):
        self.comm = comm

    def __enter__(self):
        self.faults = self.comm.Dup()
        return self

    def __exit__(self, kind, error, trace):
        faults, self.faults = self.faults, None
        if error is None or not isinstance(error, Exception):
            faults.Free()
            return False
        failure = failure_of(error, self.comm.rank)
        everyone = np.zeros(1, dtype=np.intc)
        _wait_or_abort(faults.Iallreduce(np.ones(1, dtype=np.intc), everyone), error,
                       min(TOGETHER_SECONDS, agree_grace_seconds()))
        failures = faults.allgather(failure)
        faults.Free()
        raise agreed_error(failures[0]) from error


def _wait_or_abort(request, error, seconds):
    """Complete ``request``, or end the job with ``error`` (`abort_job`) once ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while not request.Test():
        if time.monotonic() > deadline:
            abort_job(error)
        time.sleep(1e-3)


def failure_of(error, rank):
    """``(kind, message)`` of ``error`` raised on ``rank``, as `agreed_error` takes it (an agreed error
    keeps its kind and message)."""
    if isinstance(error, InputError):
        return "input", str(error)
    return "rank", str(error) if isinstance(error, RankError) else describe(error, rank)


def agreed_error(failure):
    """The error to raise on every rank for an agreed ``(kind, message)`` failure."""
    kind, message = failure
    return AgreedInputError(message) if kind == "input" else RankError(message)


def sleeping_barrier(comm, interval=1e-3):
    """A barrier that sleeps between polls, so waiting ranks leave their cores to the working ones."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(interval)
