"""NCCL's point-to-point wire for the hand-written collectives on GPUs: ``ring+nccl``, ``auto+nccl``...

An algorithm name with the suffix `SUFFIX` (``"ring+nccl"``) runs the hand-written algorithm
of that name with its messages over NCCL (``cupy.cuda.nccl``'s ``send`` / ``recv``), not
MPI, so the schedules can be compared with NCCL's own collectives on the same wire. `NcclWire`
stands in for the MPI communicator a `parallel.collectives.plans.Collective` is given:
`parallel.collectives.schedule.bind` posts each step's sends and receives as one NCCL group
(``groupStart`` ... ``groupEnd``) on the current stream, and the local reductions (``xp.add``
/ ``xp.maximum``) follow on that stream, so no step waits on the host; the collective
synchronises the stream once, at its end, and returns complete, as a blocking MPI call does.
Every other attribute (``rank``, ``size``, the attributes the plans are cached under) is the
MPI communicator's. Device arrays only; messages go as bytes (``NCCL_UINT8``), so every dtype
the collectives reduce travels, complex numbers included. The hierarchical allreduce splits
its communicator and is not offered over NCCL.

Communication: the algorithm's own (its messages and bytes per rank), over NCCL's transport
(NVLink, PCIe or the network), one NCCL group per step.
"""
from kernels.errors import InputError
from parallel.collectives.nccl import NcclCollective, unavailable_reason

#: The suffix naming an algorithm run over NCCL's point-to-point wire.
SUFFIX = "+nccl"
#: The hand-written algorithms that run over NCCL (those on one communicator, as `Collective` runs them).
NCCL_WIRE_ALGORITHMS = ("ring", "recursive_doubling", "rabenseifner", "tree", "auto")
#: Their names over NCCL (``"ring+nccl"``...): the allreduce suite's and dp's device-only choices.
NCCL_WIRE_CHOICES = tuple(name + SUFFIX for name in NCCL_WIRE_ALGORITHMS)


def split_wire(name):
    """``(algorithm, over_nccl)`` of a name such as ``"ring+nccl"`` (``("ring", True)``) or ``"ring"``."""
    return (name[:-len(SUFFIX)], True) if name.endswith(SUFFIX) else (name, False)


class NcclWire(NcclCollective):
    """The communicator of the hand-written collectives over NCCL's point-to-point messages.

    Parameters
    ----------
    comm : MPI.Comm
        The ranks, one GPU each; bootstraps the NCCL communicator (rank 0's unique id, broadcast).
        Collective.
    xp : module
        The device array module (``cupy``).
    """

    def __init__(self, comm, xp):
        super().__init__(comm, xp)
        self.mpi_comm = comm

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.mpi_comm, name)

    def exchange(self, sends, recvs):
        """One step's messages, ``((array, peer), ...)`` each way, as one NCCL group on the current stream."""
        stream = self._xp.cuda.get_current_stream().ptr
        kind = self._nccl.NCCL_UINT8
        self._nccl.groupStart()
        for array, peer in sends:
            self._comm.send(array.data.ptr, array.nbytes, kind, peer, stream)
        for array, peer in recvs:
            self._comm.recv(array.data.ptr, array.nbytes, kind, peer, stream)
        self._nccl.groupEnd()

    def synchronize(self):
        """Wait for the current stream: the collective's messages and reductions are complete."""
        self._xp.cuda.get_current_stream().synchronize()


def nccl_wire(comm, backend, name):
    """The `NcclWire` of ``comm`` for the algorithm ``name`` (``"ring+nccl"``, one of `NCCL_WIRE_ALGORITHMS` with
    `SUFFIX`) on ``backend``; `InputError` (one line, on every rank) on the host (``backend`` None) or where
    NCCL cannot run (`parallel.collectives.nccl.unavailable_reason`). Collective."""
    if backend is None:
        raise InputError(f"allreduce {name!r} sends over NCCL, on GPUs only: run it with --backend cupy")
    reason = unavailable_reason(comm, backend.xp)
    if reason is not None:
        raise InputError(f"allreduce {name!r}: {reason}")
    return NcclWire(comm, backend.xp)
