"""The allreduce (SUM) of one gradient bucket: its wire format, its algorithm, and the seconds spent in MPI.

Algorithms
    ``"mpi"``: ``MPI.Allreduce``, or ``Iallreduce`` for an overlapped exchange
    (`parallel.data.buckets`); else one of the hand-written blocking algorithms of
    `parallel.collectives.ALLREDUCE_ALGORITHMS`. On a device communicator those run
    on persistent requests, so the whole call is staged at once
    (`kernels.backend.Backend.staged`; with a CUDA-aware MPI the device arrays go to MPI
    as they are), or, named with ``+nccl`` (``"ring+nccl"``: GPUs only), with their
    messages over NCCL's point-to-point wire (`parallel.collectives.nccl_wire`), never staged.
Wire formats
    32-bit (the gradients themselves, reduced in place) or 16-bit
    (`parallel.data.gradient_wire.WireFormat`).

Communication cost per bucket of ``n`` bytes on the wire and ``p`` ranks: one
allreduce, the chosen algorithm's (for the ring ``2 (p-1)`` messages and
``2 (p-1)/p n`` bytes sent per rank).
"""
import functools

from mpi4py import MPI

from kernels.comm import backend_of, raw_comm
from kernels.comm.device import poll_all, wait_all
from kernels.errors import InputError
from parallel.collectives import ALLREDUCE_ALGORITHMS
from parallel.collectives.nccl_wire import NCCL_WIRE_CHOICES, nccl_wire, split_wire
from parallel.data.gradient_wire import WireFormat

#: The host's choices (the hand-written algorithms over NCCL's wire, `NCCL_WIRE_CHOICES`, are device only).
ALLREDUCE_CHOICES = ("mpi",) + tuple(ALLREDUCE_ALGORITHMS)


class GradientExchange:
    """Encode, allreduce (SUM, in place) and decode gradient buckets, timing every MPI call.

    Parameters
    ----------
    comm : MPI.Comm or DeviceComm
        All ranks; a device communicator for device gradients.
    allreduce : str
        ``"mpi"``, a key of `parallel.collectives.ALLREDUCE_ALGORITHMS`, or one of
        `parallel.collectives.nccl_wire.NCCL_WIRE_ALGORITHMS` with ``+nccl`` (device only;
        collective: builds the NCCL communicator).
    precision : {"full", "float16", "bfloat16"}
        The wire format.

    Attributes
    ----------
    nonblocking : bool
        Whether `start` is available (``"mpi"`` only: the hand-written algorithms block).
    seconds : float
        Time spent in the MPI calls made through `timed`, summed over all calls.
    """

    def __init__(self, comm, allreduce, precision):
        if allreduce not in ALLREDUCE_CHOICES + NCCL_WIRE_CHOICES:
            raise InputError(f"unknown allreduce {allreduce!r}; choose from "
                             f"{', '.join(ALLREDUCE_CHOICES + NCCL_WIRE_CHOICES)}")
        mpi_comm, device = raw_comm(comm), backend_of(comm)  # device: None for a host communicator
        self.allreduce, self.nonblocking = allreduce, allreduce == "mpi"
        self._format = WireFormat(precision, self.nonblocking, device is not None and device.device_buffers_to_mpi)
        self._comm = comm
        algorithm, over_nccl = split_wire(allreduce)
        if self.nonblocking:
            self._blocking = functools.partial(comm.Allreduce, MPI.IN_PLACE, op=self._format.op)
        elif over_nccl:
            self._blocking = functools.partial(ALLREDUCE_ALGORITHMS[algorithm], nccl_wire(mpi_comm, device, allreduce),
                                               MPI.IN_PLACE)
        elif device is None:
            self._blocking = functools.partial(ALLREDUCE_ALGORITHMS[allreduce], comm, MPI.IN_PLACE)
        else:
            self._blocking = functools.partial(
                device.staged, functools.partial(ALLREDUCE_ALGORITHMS[allreduce], mpi_comm, MPI.IN_PLACE))
        self.seconds = 0.0

    def wire(self, grads):
        """The buffer that carries the bucket ``grads`` (``grads`` itself in 32 bits)."""
        return self._format.buffer(grads)

    def encode(self, grads, wire):
        """Write the bucket ``grads`` into its `wire`."""
        self._format.encode(grads, wire)

    def decode(self, wire, grads):
        """Write the reduced ``wire`` back into its bucket ``grads``."""
        self._format.decode(wire, grads)

    def reduce(self, wire):
        """Allreduce ``wire`` in place, blocking."""
        self.timed(self._blocking, wire)

    def start(self, wire):
        """Start the allreduce of ``wire`` in place (``Iallreduce``; needs `nonblocking`); return its request."""
        return self.timed(self._comm.Iallreduce, MPI.IN_PLACE, wire, op=self._format.op)

    def progress(self, requests):
        """Let MPI progress the started ``requests`` (`kernels.comm.device.poll_all`)."""
        self.timed(poll_all, requests)

    def wait(self, requests):
        """Complete the started ``requests`` (`kernels.comm.device.wait_all`: device copies included)."""
        self.timed(wait_all, requests)

    def timed(self, call, *args, **kwargs):
        """Return ``call(*args, **kwargs)``, its wall time added to `seconds`."""
        start = MPI.Wtime()
        result = call(*args, **kwargs)
        self.seconds += MPI.Wtime() - start
        return result
