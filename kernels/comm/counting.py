"""`CountingComm`: a communicator wrapper that counts the bytes this rank sends and times its transfers.

It offers the transfers the parallel SVMs, tensor parallelism and MoE make,
with mpi4py's own signatures (and `CountingComm.sum_in_place`, an in-place ``Allreduce``), and counts each by the convention of
`kernels.comm.traffic` (per call, ``n`` the bytes named; nothing on one rank):

- ``Send``: ``n`` of the buffer ("send"); ``Recv``: nothing (receiving costs nothing);
- ``Bcast``: ``n`` of the buffer, on every rank ("broadcast");
- ``Allreduce``: ``2 (p - 1) / p`` of the receive buffer's ``n``;
- ``Allgatherv``: ``(p - 1) / p`` of the gathered receive buffer's ``n``;
- ``Reduce_scatter``: ``(p - 1) / p`` of the reduced send buffer's ``n``;
- ``Alltoall``, ``Alltoallv``: exactly the bytes bound for other ranks ("send");
  an ``Alltoallv`` send buffer is ``[array, (counts, displs)]``, counts in items.

A buffer is an array or an mpi4py buffer specification whose first item is the
array (its whole ``nbytes`` counts). `CountingComm.run` runs a hand-written
collective in place of MPI's call and counts it as that call (the same bytes,
whatever the algorithm sends). Any other transfer is a `TypeError` (so
every transfer made through it is counted); everything else (``rank``,
``Probe``, ``Barrier``...) is the wrapped communicator's. It wraps any
communicator, a `kernels.comm.device.DeviceComm` too (counting what that one
stages), or another `CountingComm` (both count).
"""
import functools

from mpi4py import MPI

from kernels.comm.traffic import TrafficCounter
from kernels.comm.wrapper import CommWrapper, backend_of, is_transfer, raw_comm

_COUNTED = ("Send", "Recv", "Bcast", "Allreduce", "Allgatherv", "Reduce_scatter", "Alltoall", "Alltoallv")


def _nbytes(buffer):
    """Bytes of the array of a buffer argument (an array, or a specification starting with one)."""
    return (buffer[0] if isinstance(buffer, (list, tuple)) else buffer).nbytes


class CountingComm(CommWrapper, TrafficCounter):
    """``comm`` whose transfers add this rank's bytes sent to `bytes_sent` and their wall time to `seconds`.

    Parameters
    ----------
    comm : MPI.Comm or CommWrapper
        The communicator wrapped (``wrapped``).

    Attributes
    ----------
    bytes_sent, seconds : float
        As `kernels.comm.traffic.TrafficCounter` (`reset` zeroes them; `add` counts a
        transfer made elsewhere, `timed` times a block).
    """

    def __init__(self, comm):
        CommWrapper.__init__(self, comm)
        TrafficCounter.__init__(self, comm.size)

    def __getattr__(self, name):
        if is_transfer(name):
            raise TypeError(f"CountingComm does not count {name}; use one of {', '.join(_COUNTED)}")
        return super().__getattr__(name)

    def _counted(self, kind, nbytes, name, *args, **kwargs):
        with self.timed():
            getattr(self.wrapped, name)(*args, **kwargs)
        self.add(kind, nbytes)

    def run(self, kind, nbytes, algorithm, *arrays, outputs=None):
        """Run ``algorithm(comm, *arrays)`` (a hand-written collective, `parallel.collectives`) on the
        MPI communicator under this wrapper; time it and count it as a ``kind`` transfer of ``nbytes``
        (the count of the MPI call it replaces). Over a `kernels.comm.device.DeviceComm` device
        ``arrays`` are staged as one call (`kernels.backend.Backend.staged`: copied to pinned host
        buffers, and the indices ``outputs`` back; default all), host arrays passed as they are;
        return what ``algorithm`` returns."""
        device, call = backend_of(self), functools.partial(algorithm, raw_comm(self))
        staged = device is not None and device.is_device_array(arrays[0])
        with self.timed():
            result = device.staged(call, *arrays, outputs=outputs) if staged else call(*arrays)
        self.add(kind, nbytes)
        return result

    def sum_in_place(self, array):
        """Sum a contiguous ``array`` over the ranks, in place (one counted ``Allreduce``); return it."""
        self.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)
        return array

    def Send(self, buf, dest, tag=0):
        """``MPI.Comm.Send``: one message of the buffer's bytes."""
        self._counted("send", _nbytes(buf), "Send", buf, dest, tag)

    def Recv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):
        """``MPI.Comm.Recv``: nothing sent."""
        self._counted("send", 0, "Recv", buf, source, tag, status)

    def Bcast(self, buf, root=0):
        """``MPI.Comm.Bcast``: the buffer's bytes, on every rank."""
        self._counted("broadcast", _nbytes(buf), "Bcast", buf, root)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        """``MPI.Comm.Allreduce`` (``sendbuf`` may be ``MPI.IN_PLACE``)."""
        self._counted("allreduce", _nbytes(recvbuf), "Allreduce", sendbuf, recvbuf, op)

    def Allgatherv(self, sendbuf, recvbuf):
        """``MPI.Comm.Allgatherv``: ``recvbuf`` is ``[array, (counts, displs)]`` (or with a datatype)."""
        self._counted("allgather", _nbytes(recvbuf), "Allgatherv", sendbuf, recvbuf)

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM):
        """``MPI.Comm.Reduce_scatter``: the reduced total is ``sendbuf`` (``recvbuf`` in place)."""
        total = recvbuf if sendbuf is MPI.IN_PLACE else sendbuf
        self._counted("reduce_scatter", _nbytes(total), "Reduce_scatter", sendbuf, recvbuf, recvcounts, op)

    def Alltoall(self, sendbuf, recvbuf):
        """``MPI.Comm.Alltoall``: the ``(p - 1) / p`` of ``sendbuf`` bound for other ranks, exactly."""
        self._counted("send", _nbytes(sendbuf) // self.ranks * (self.ranks - 1), "Alltoall", sendbuf, recvbuf)

    def Alltoallv(self, sendbuf, recvbuf):
        """``MPI.Comm.Alltoallv`` with ``sendbuf = [array, (counts, displs)]``: the items bound for other ranks."""
        array, (counts, _) = sendbuf[0], sendbuf[1]
        to_others = int(sum(counts)) - int(counts[self.rank])
        self._counted("send", to_others * array.itemsize, "Alltoallv", sendbuf, recvbuf)


class CountedCommunication:
    """Mixin for layers whose ``counter`` (a `CountingComm`) carries their communication."""

    @property
    def bytes_sent(self):
        """Bytes this rank has sent (see `kernels.comm.counting`)."""
        return self.counter.bytes_sent

    @property
    def comm_seconds(self):
        """Seconds this rank has spent in communication calls."""
        return self.counter.seconds
