"""Where a point ran, for the CSV's provenance columns: the MPI library and the nodes."""
import os
from dataclasses import dataclass
from typing import Optional

from mpi4py import MPI


def mpi_library():
    """The first line of ``MPI_Get_library_version``, spaces collapsed and NUL bytes dropped.

    Open MPI ends its version string with a NUL byte, which would make ``grep``
    call the CSV binary.
    """
    lines = MPI.Get_library_version().replace("\x00", "").splitlines()
    return " ".join(lines[0].split()) if lines else ""


@dataclass
class Placement:
    """How the ranks of a communicator sit on nodes.

    ``nodes`` counts shared-memory domains (the leaders of a ``COMM_TYPE_SHARED``
    split), not host names: two nodes that share a host name (containers, some
    clouds) are two nodes. ``ranks_here`` is the number of ranks on this rank's
    node. ``note`` is one line when Slurm names another number of nodes
    (``SLURMD_NODENAME`` set on every rank), else None.
    """

    nodes: int
    ranks_here: int
    note: Optional[str] = None


def placement(comm):
    """The `Placement` of the ranks of ``comm`` (call on every rank).

    Communication: one ``Split_type``, one allreduce of an int and one allgather
    of a short string per rank.
    """
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    leader, ranks_here = node.rank == 0, node.size
    node.Free()
    nodes = comm.allreduce(int(leader))
    names = comm.allgather(os.environ.get("SLURMD_NODENAME"))
    note = None
    if all(names) and len(set(names)) != nodes:
        note = (f"nodes: MPI sees {nodes} shared-memory node(s) among {comm.size} ranks but Slurm names "
                f"{len(set(names))} (SLURMD_NODENAME); the CSV records {nodes}")
    return Placement(nodes=nodes, ranks_here=ranks_here, note=note)
