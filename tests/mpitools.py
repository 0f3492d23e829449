"""Helpers for the tests that run under MPI."""
import sys
from contextlib import contextmanager

from mpi4py import MPI

from bench.faults import sleeping_barrier


def all_ranks(comm, verdict):
    """True on every rank when ``verdict`` is true on every rank."""
    return comm.allreduce(bool(verdict), op=MPI.LAND)


def from_root(comm, compute):
    """``compute()`` on rank 0, broadcast to every rank; the others sleep meanwhile (a serial reference on an
    oversubscribed node would otherwise share its cores with ranks spinning in the broadcast)."""
    value = compute() if comm.rank == 0 else None
    sleeping_barrier(comm)
    return comm.bcast(value, root=0)


@contextmanager
def combination(*values):
    """A failure inside the block names ``values`` (types by name): which pass of a test's loops failed.

    The name is a note under the error (Python 3.11+), else a line on the test's captured stderr.
    """
    try:
        yield
    except BaseException as error:
        name = "in combination: " + " ".join(getattr(value, "__name__", None) or str(value) for value in values)
        if hasattr(error, "add_note"):
            error.add_note(name)
        else:
            print(name, file=sys.stderr)
        raise
