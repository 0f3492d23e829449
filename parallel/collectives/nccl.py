"""NCCL allreduce through CuPy (``cupy.cuda.nccl``): the library reference for device buffers.

A GPU user would sum gradients with NCCL rather than MPI; the ``allreduce``
suite's ``nccl`` variant measures it beside MPI and the hand-written algorithms
(which reach device buffers through host staging or a CUDA-aware MPI). MPI only
bootstraps the NCCL communicator: rank 0 draws the unique id, the others receive
it by broadcast. NCCL wants one GPU per rank; `unavailable_reason` says, the same
on every rank, why it cannot run (no NCCL in this CuPy, two ranks on one GPU)
before anything is set up. The module lives with the collectives (not in
``kernels``) because it is one of the allreduce algorithms the suite compares.
"""
import importlib

from mpi4py import MPI

#: NCCL's data type constants (attributes of ``cupy.cuda.nccl``) by NumPy type name.
NCCL_TYPES = {
    "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "uint32": "NCCL_UINT32",
    "int64": "NCCL_INT64", "uint64": "NCCL_UINT64", "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32",
    "float64": "NCCL_FLOAT64",
}


def nccl_of(xp):
    """The NCCL binding of array module ``xp`` (``cupy.cuda.nccl``), or None when it has none.

    CuPy always ships the module; its ``available`` flag is False when the NCCL
    library could not be loaded.
    """
    try:
        module = importlib.import_module(f"{xp.__name__}.cuda.nccl")
    except ImportError:
        return None
    return module if getattr(module, "available", False) else None


def unavailable_reason(comm, xp):
    """Why NCCL cannot sum over the ranks of ``comm`` (one line, the same on every rank), or None.

    Collective. Ranks on one node that use the same GPU (same PCI bus id) are
    refused: NCCL needs one GPU per rank.

    Communication: one ``Split_type`` and a broadcast on each node (to name the
    node by its first rank), one allgather of a short tuple per rank.
    """
    nccl = nccl_of(xp)
    bus_id = xp.cuda.runtime.deviceGetPCIBusId(xp.cuda.Device().id) if nccl else None
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    node_name = node.bcast(comm.rank, root=0)
    node.Free()
    gathered = comm.allgather((nccl is not None, node_name, bus_id))
    if not all(found for found, _, _ in gathered):
        return "NCCL is not available in this CuPy"
    first_user = {}
    for rank, (_, node_name, bus_id) in enumerate(gathered):
        other = first_user.setdefault((node_name, bus_id), rank)
        if other != rank:
            return f"NCCL needs one GPU per rank (ranks {other} and {rank} share GPU {bus_id})"
    return None


class NcclAllreduce:
    """Out-of-place SUM allreduce of device arrays over NCCL, one GPU per rank of ``comm``.

    Parameters
    ----------
    comm : MPI.Comm
        The ranks taking part, each with its own current GPU (see `unavailable_reason`);
        used once, to broadcast NCCL's unique id from rank 0. Collective.
    xp : module
        The array module (``cupy``).

    Calling it with ``(send, recv)`` (device arrays of the same length and type,
    shape (n,) on every rank) writes the sum over the ranks into ``recv`` on the
    current stream and synchronises that stream, so the result is complete when
    the call returns. Communication: NCCL's allreduce of n elements (ring or tree,
    NCCL's choice). `close` destroys the NCCL communicator.
    """

    def __init__(self, comm, xp):
        self._nccl = nccl_of(xp)
        if self._nccl is None:
            raise ValueError("NCCL is not available in this CuPy")
        self._xp = xp
        unique_id = comm.bcast(self._nccl.get_unique_id() if comm.rank == 0 else None, root=0)
        self._comm = self._nccl.NcclCommunicator(comm.size, unique_id, comm.rank)

    def __call__(self, send, recv):
        if send.dtype != recv.dtype or send.size != recv.size:
            raise ValueError(f"send ({send.size} {send.dtype}) and recv ({recv.size} {recv.dtype}) differ")
        if send.dtype.name not in NCCL_TYPES:
            raise TypeError(f"NCCL sums {', '.join(NCCL_TYPES)}, not {send.dtype.name}")
        stream = self._xp.cuda.get_current_stream()
        self._comm.allReduce(send.data.ptr, recv.data.ptr, send.size, getattr(self._nccl, NCCL_TYPES[send.dtype.name]),
                             self._nccl.NCCL_SUM, stream.ptr)
        stream.synchronize()
        return recv

    def close(self):
        """Destroy the NCCL communicator (again: nothing)."""
        if self._comm is not None:
            self._comm.destroy()
            self._comm = None
