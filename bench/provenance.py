"""Where a point ran, for the CSV's provenance columns: the MPI library, the nodes, the device;
and a point's peak device memory."""
import gc
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


def device_description(backend):
    """This rank's device as one CSV field, e.g. ``NVIDIA H200 (CuPy 13.3.0, CUDA 12.4)``; empty on the host.

    The CUDA version is the runtime's CuPy was built with (``runtimeGetVersion``).
    """
    if backend.name == "numpy":
        return ""
    cuda = backend.xp.cuda
    name = cuda.runtime.getDeviceProperties(cuda.Device().id)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    runtime = cuda.runtime.runtimeGetVersion()  # 1000 * major + 10 * minor
    return f"{name} (CuPy {backend.xp.__version__}, CUDA {runtime // 1000}.{runtime % 1000 // 10})"


class DevicePeak:
    """The high-water mark of a device backend's memory pool over one point.

    Made before a point's set-up: it frees the blocks the pool caches (after a
    garbage collection, so the previous point's arrays are gone), so that the
    bytes the pool holds at the point's end (``total_bytes``: CuPy's pool keeps
    what it allocated until asked to free it) are the most the point held at once.
    Allocations outside the pool (pinned host buffers, cuBLAS workspaces) are not
    counted. On the host backend ``on_device`` is False and nothing is done.
    """

    def __init__(self, backend):
        self.on_device = backend.name != "numpy"
        self._pool = backend.xp.get_default_memory_pool() if self.on_device else None
        if self.on_device:
            gc.collect()
            self._pool.free_all_blocks()

    def bytes(self):
        """Bytes the pool holds now (None on the host)."""
        return int(self._pool.total_bytes()) if self.on_device else None
