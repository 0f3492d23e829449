"""The protocol every communicator wrapper follows, and the two ways through it.

A wrapper (`CommWrapper`) holds the communicator it wraps in ``wrapped`` (an
mpi4py communicator or another wrapper) and tells the backend of the buffers
it hands on in ``backend``; whatever it does not handle itself is the wrapped
communicator's own (``rank``, ``size``, ``Barrier``, ``Get_coords``...), except
the transfers it refuses. Callers never test for a wrapper type nor reach
through ``.wrapped``: `raw_comm` gives the mpi4py communicator under any
wrappers, `backend_of` the backend.

No MPI here: importing this module does not initialise MPI.
"""

#: Transfers by their lowercase name without the non-blocking ``I`` or the
#: persistent ``_init``: ``Isend``, ``Send_init`` and ``send`` are all "send".
_TRANSFERS = frozenset((
    "send", "bsend", "ssend", "rsend", "psend", "recv", "precv", "sendrecv", "sendrecv_replace",
    "bcast", "gather", "gatherv", "scatter", "scatterv", "allgather", "allgatherv",
    "alltoall", "alltoallv", "alltoallw", "reduce", "allreduce", "reduce_scatter", "reduce_scatter_block",
    "scan", "exscan", "neighbor_allgather", "neighbor_allgatherv", "neighbor_alltoall",
    "neighbor_alltoallv", "neighbor_alltoallw"))


def is_transfer(name):
    """True for an mpi4py communicator method that moves data: buffer calls (``Allreduce``,
    ``Ineighbor_alltoall``, ``Send_init``...) and pickle-based ones (``bcast``, ``allgather``...)."""
    base = name.lower().removesuffix("_init")
    return base in _TRANSFERS or (base.startswith("i") and base[1:] in _TRANSFERS)


def is_buffer_call(name):
    """True for a transfer on explicit buffers (mpi4py's uppercase methods: ``Send``, ``Alltoallw``...)."""
    return name[:1].isupper() and is_transfer(name)


class CommWrapper:
    """Base of the communicator wrappers (`kernels.comm.device.DeviceComm`, `kernels.comm.counting.CountingComm`).

    Parameters
    ----------
    comm : MPI.Comm or CommWrapper
        The communicator wrapped (``wrapped``); wrappers nest.

    Subclasses handle their calls as methods and refuse, in ``__getattr__``, the
    transfers they cannot handle (a `TypeError` naming the call); every other
    attribute is the wrapped communicator's.
    """

    def __init__(self, comm):
        self.wrapped = comm

    @property
    def backend(self):
        """The backend of the wrapped communicator (`backend_of`); a staging wrapper gives its own."""
        return backend_of(self.wrapped)

    def __getattr__(self, name):
        if name.startswith("_") or name == "wrapped":  # not yet set (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.wrapped, name)


def raw_comm(comm):
    """The mpi4py communicator under any wrappers (a plain communicator is its own)."""
    while isinstance(comm, CommWrapper):
        comm = comm.wrapped
    return comm


def backend_of(comm):
    """The `kernels.backend.Backend` whose buffers ``comm`` hands to MPI: a device backend for a
    `kernels.comm.device.DeviceComm` (under any other wrappers), None for a plain mpi4py
    communicator (host buffers, or device buffers the caller synchronises and stages itself)."""
    return comm.backend if isinstance(comm, CommWrapper) else None
