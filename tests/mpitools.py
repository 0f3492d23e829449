"""Helpers for the tests that run under MPI."""
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
