"""NCCL's collectives through CuPy (``cupy.cuda.nccl``): the library reference for device buffers.

A GPU user would sum gradients with NCCL rather than MPI; the ``nccl`` variant of the
collective suites (allreduce, allgather, reduce_scatter, alltoall, bcast, reduce)
measures it beside MPI and the hand-written algorithms
(which reach device buffers through host staging or a CUDA-aware MPI). MPI only
bootstraps the NCCL communicator: rank 0 draws the unique id, the others receive
it by broadcast. NCCL wants one GPU per rank; `unavailable_reason` says, the same
on every rank, why it cannot run (no NCCL in this CuPy, two ranks on one GPU)
before anything is set up. The module lives with the collectives (not in
``kernels``) because it is one of the algorithms the suites compare.
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


class NcclCollective:
    """NCCL's collectives on device arrays, one GPU per rank of ``comm``, as nccl-tests calls them.

    Parameters
    ----------
    comm : MPI.Comm
        The ranks taking part, each with its own current GPU (see `unavailable_reason`);
        used once, to broadcast NCCL's unique id from rank 0. Collective.
    xp : module
        The array module (``cupy``).

    Each method runs on the current stream and synchronises it, so the result is complete when
    it returns. ``send`` may be ``MPI.IN_PLACE`` (the data in ``recv``, laid out as MPI's in-place
    call has it: a rank's block at its offset for allgather and reduce_scatter). NCCL's blocks
    are equal: allgather, reduce_scatter and alltoall need a whole vector divisible by the ranks
    (a ``ValueError`` otherwise). Communication: NCCL's own algorithm and transport for each
    (alltoall: one ``send`` and one ``recv`` per peer in one group, as nccl-tests does). `close`
    destroys the NCCL communicator.
    """

    def __init__(self, comm, xp):
        self._nccl = nccl_of(xp)
        if self._nccl is None:
            raise ValueError("NCCL is not available in this CuPy")
        self._xp, self.rank, self.size = xp, comm.rank, comm.size
        unique_id = comm.bcast(self._nccl.get_unique_id() if comm.rank == 0 else None, root=0)
        self._comm = self._nccl.NcclCommunicator(comm.size, unique_id, comm.rank)

    def _type(self, array):
        if array.dtype.name not in NCCL_TYPES:
            raise TypeError(f"NCCL takes {', '.join(NCCL_TYPES)}, not {array.dtype.name}")
        return getattr(self._nccl, NCCL_TYPES[array.dtype.name])

    def _op(self, op):
        return {"sum": self._nccl.NCCL_SUM, "max": self._nccl.NCCL_MAX}[op]

    def _blocks(self, n):
        if n % self.size:
            raise ValueError(f"NCCL's blocks are equal: {n} items do not divide over {self.size} ranks")
        return n // self.size

    def _run(self, call, *args):
        stream = self._xp.cuda.get_current_stream()
        call(*args, stream.ptr)
        stream.synchronize()

    @staticmethod
    def _check(send, recv, expected):
        if send.dtype != recv.dtype or send.size != expected:
            raise ValueError(f"send ({send.size} {send.dtype}) and recv ({recv.size} {recv.dtype}) differ")

    def allreduce(self, send, recv, op="sum"):
        """``recv`` (n,) = the reduction of every rank's ``send`` (n,)."""
        send = recv if send is MPI.IN_PLACE else send
        kind = self._type(recv)
        self._check(send, recv, recv.size)
        self._run(self._comm.allReduce, send.data.ptr, recv.data.ptr, recv.size, kind, self._op(op))
        return recv

    def allgather(self, send, recv):
        """``recv`` (n,) = every rank's block ``send`` (n / p,)."""
        kind, block = self._type(recv), self._blocks(recv.size)
        pointer = recv.data.ptr + self.rank * block * recv.itemsize if send is MPI.IN_PLACE else send.data.ptr
        if send is not MPI.IN_PLACE:
            self._check(send, recv, block)
        self._run(self._comm.allGather, pointer, recv.data.ptr, block, kind)
        return recv

    def reduce_scatter(self, send, recv, op="sum"):
        """This rank's block of the reduction of every ``send`` (n,) into ``recv`` (n / p,); in place
        ``recv`` (n,) holds the input and gets the block at its offset."""
        whole = recv if send is MPI.IN_PLACE else send
        kind, block = self._type(whole), self._blocks(whole.size)
        target = recv.data.ptr + self.rank * block * recv.itemsize if send is MPI.IN_PLACE else recv.data.ptr
        if send is not MPI.IN_PLACE:
            self._check(recv, send, block)
        self._run(self._comm.reduceScatter, whole.data.ptr, target, block, kind, self._op(op))
        return recv

    def broadcast(self, send, recv, root=0):
        """``recv`` (n,) = the root's ``send`` (its ``recv`` when in place)."""
        source = recv if send is MPI.IN_PLACE or self.rank != root else send
        kind = self._type(recv)
        self._check(source, recv, recv.size)
        self._run(self._comm.broadcast, source.data.ptr, recv.data.ptr, recv.size, kind, root)
        return recv

    def reduce(self, send, recv, op="sum", root=0):
        """The root's ``recv`` (n,) = the reduction of every rank's ``send`` (n,)."""
        send = recv if send is MPI.IN_PLACE else send
        kind = self._type(recv)
        self._check(send, recv, recv.size)
        self._run(self._comm.reduce, send.data.ptr, recv.data.ptr, recv.size, kind, self._op(op), root)
        return recv

    def alltoall(self, send, recv):
        """Block ``j`` of ``send`` (n,) to rank ``j``; ``recv`` (n,) gets block ``rank`` of every rank in rank
        order. Not in place (NCCL has no in-place all-to-all)."""
        if send is MPI.IN_PLACE:
            raise ValueError("NCCL's all-to-all is out of place only")
        block = self._blocks(send.size)
        self._check(send, recv, recv.size)
        kind, stream, step = self._type(send), self._xp.cuda.get_current_stream(), block * send.itemsize
        self._nccl.groupStart()
        for peer in range(self.size):
            self._comm.send(send.data.ptr + peer * step, block, kind, peer, stream.ptr)
            self._comm.recv(recv.data.ptr + peer * step, block, kind, peer, stream.ptr)
        self._nccl.groupEnd()
        stream.synchronize()
        return recv

    def close(self):
        """Destroy the NCCL communicator (again: nothing)."""
        if self._comm is not None:
            self._comm.destroy()
            self._comm = None
