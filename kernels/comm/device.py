"""A communicator that hands device arrays to MPI.

`DeviceComm` wraps an mpi4py communicator for a device backend (CuPy). Every
buffer call first synchronises the current stream, so MPI never reads a buffer
a kernel is still writing. With a CUDA-aware MPI the device arrays then go to
MPI as they are. Otherwise each device buffer is staged through pinned host
memory: copied to the host before the call, and copied back to the device for
the buffers MPI writes (after a blocking call returns, or when a non-blocking
request completes).

Non-blocking calls on a staging communicator return a `StagedRequest`; complete
them with its ``Wait`` / ``Test`` methods or with `wait_all` / `poll_all`, which
copy received data back to the device (``MPI.Request.Waitall`` would complete
the transfer but not the copy). Both helpers take plain requests too, so one
code path serves the host and the device.

Host arrays given to a `DeviceComm` go to MPI unchanged, and everything that
is not a buffer call (``rank``, ``Barrier``, ``Get_coords``...) is the wrapped
communicator's own (`kernels.comm.wrapper.CommWrapper`). A buffer call it does
not stage (``Alltoallw``, ``Neighbor_*``, persistent collectives...) is a
`TypeError`: MPI would get device buffers nobody synchronised.
"""
from mpi4py import MPI

from kernels.comm.wrapper import CommWrapper, is_buffer_call, raw_comm

#: Buffer positions of each call: (send arguments, receive arguments), as
#: (position, keyword) pairs. A buffer is an array or an mpi4py buffer
#: specification whose first item is the array.
_SEND_RECV = ((0, "sendbuf"), (1, "recvbuf"))
_BUFFERS = {
    "Send": (((0, "buf"),), ()),
    "Ssend": (((0, "buf"),), ()),
    "Isend": (((0, "buf"),), ()),
    "Issend": (((0, "buf"),), ()),
    "Recv": ((), ((0, "buf"),)),
    "Irecv": ((), ((0, "buf"),)),
    "Sendrecv": (((0, "sendbuf"),), ((3, "recvbuf"),)),
    "Isendrecv": (((0, "sendbuf"),), ((3, "recvbuf"),)),
    "Sendrecv_replace": (((0, "buf"),), ((0, "buf"),)),
    "Bcast": (((0, "buf"),), ((0, "buf"),)),
    "Ibcast": (((0, "buf"),), ((0, "buf"),)),
    **{name: ((_SEND_RECV[0],), (_SEND_RECV[1],)) for name in (
        "Allreduce", "Iallreduce", "Reduce", "Ireduce", "Allgather", "Iallgather", "Allgatherv",
        "Iallgatherv", "Alltoall", "Ialltoall", "Alltoallv", "Ialltoallv", "Reduce_scatter",
        "Ireduce_scatter", "Reduce_scatter_block", "Ireduce_scatter_block", "Gather", "Igather",
        "Gatherv", "Igatherv", "Scatter", "Iscatter", "Scatterv", "Iscatterv", "Scan", "Exscan")},
}
_NEW_COMMUNICATORS = ("Split", "Split_type", "Dup", "Create_cart", "Sub", "Create")
_PERSISTENT = ("Send_init", "Recv_init", "Bsend_init", "Ssend_init", "Rsend_init")


class DeviceComm(CommWrapper):
    """``comm`` for the buffers of a device ``backend`` (a `kernels.backend.Backend`).

    Parameters
    ----------
    comm : MPI.Comm
        The communicator wrapped (``wrapped``).
    backend : Backend
        Gives ``synchronize``, ``device_buffers_to_mpi`` and the host staging.

    Equal to (and hashed as) the mpi4py communicator it wraps.
    """

    def __init__(self, comm, backend):
        super().__init__(comm)
        self._backend = backend

    @property
    def backend(self):
        """The device backend whose buffers this communicator synchronises and stages."""
        return self._backend

    def __getattr__(self, name):
        if name in _BUFFERS:
            return lambda *args, **kwargs: self._call(name, args, kwargs)
        if name in _NEW_COMMUNICATORS:
            return lambda *args, **kwargs: self._wrap(getattr(self.wrapped, name)(*args, **kwargs))
        if name in _PERSISTENT and not self.backend.device_buffers_to_mpi:
            raise TypeError(f"{name} cannot stage device buffers (the copy would happen once); "
                            f"stage the whole call with Backend.staged")
        if is_buffer_call(name) and name not in _PERSISTENT:
            raise TypeError(f"DeviceComm does not synchronise or stage {name}: call it on kernels.comm.raw_comm(comm) "
                            f"with host buffers, or stage the whole call with Backend.staged")
        return super().__getattr__(name)

    def __eq__(self, other):
        return raw_comm(self) == raw_comm(other)

    def __hash__(self):
        return hash(raw_comm(self))

    def _wrap(self, comm):
        return comm if comm == MPI.COMM_NULL else DeviceComm(comm, self.backend)

    def _call(self, name, args, kwargs):
        self.backend.synchronize()
        method = getattr(self.wrapped, name)
        if self.backend.device_buffers_to_mpi:
            return method(*args, **kwargs)
        args, kwargs = list(args), dict(kwargs)
        sends, receives = _BUFFERS[name]
        in_place = _argument(args, kwargs, 0, "sendbuf") is MPI.IN_PLACE
        copies_back = _CopiesBack(self.backend)
        for buffer in dict.fromkeys(sends + receives):
            copy_in = buffer in sends or in_place
            self._stage(args, kwargs, *buffer, copy_in, copies_back if buffer in receives else None)
        result = method(*args, **kwargs)
        if isinstance(result, MPI.Request):
            return StagedRequest(result, copies_back)
        copies_back()
        return result

    def _stage(self, args, kwargs, position, keyword, copy_in, copies_back):
        """Swap the device array of one buffer argument for a pinned host copy."""
        spec = _argument(args, kwargs, position, keyword)
        array = spec[0] if isinstance(spec, (list, tuple)) else spec
        if not self.backend.is_device_array(array):
            return
        host = self.backend.host_buffer(array, copy=copy_in)
        if copies_back is not None:
            copies_back.append((array, host))
        staged = [host, *spec[1:]] if isinstance(spec, (list, tuple)) else host
        if position < len(args):
            args[position] = staged
        else:
            kwargs[keyword] = staged


def _argument(args, kwargs, position, keyword):
    return args[position] if position < len(args) else kwargs.get(keyword)


class _CopiesBack(list):
    """(device array, host copy) pairs to copy back once MPI has written the host copies."""

    def __init__(self, backend):
        super().__init__()
        self.backend = backend

    def __call__(self):
        for device, host in self:
            self.backend.copy_to_device(device, host)
        self.clear()


class StagedRequest(MPI.Request):
    """A request whose received data is copied back to the device when it completes."""

    def __new__(cls, request, copies_back):
        self = super().__new__(cls, request)
        self._copies_back = copies_back
        return self

    def Wait(self, status=None):
        """Wait for the transfer, then copy the received data to the device."""
        super().Wait(status)
        self.complete()
        return True

    def Test(self, status=None):
        """True, with the data on the device, when the transfer has completed."""
        done = super().Test(status)
        if done:
            self.complete()
        return done

    def complete(self):
        """Copy the received data to the device (once; call after the request has completed)."""
        self._copies_back()


def wait_all(requests):
    """``MPI.Request.Waitall(requests)``, then the device copies of any `StagedRequest`."""
    MPI.Request.Waitall(requests)
    for request in requests:
        if isinstance(request, StagedRequest):
            request.complete()


def poll_all(requests):
    """``MPI.Request.Testall(requests)``; when all have completed, the device copies too."""
    done = MPI.Request.Testall(requests)
    if done:
        for request in requests:
            if isinstance(request, StagedRequest):
                request.complete()
    return done
