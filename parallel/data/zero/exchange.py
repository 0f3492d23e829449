"""The collectives of sharded data parallelism on one segment: reduce-scatter and allgather, timed.

``"mpi"``: ``MPI.Reduce_scatter`` and ``MPI.Allgatherv`` with the segment's
`block_counts` (``Iallgatherv`` for a prefetch); or a hand-written pair of the
same name in `parallel.collectives.reduce_scatter.REDUCE_SCATTER_ALGORITHMS` and
`parallel.collectives.allgather.ALLGATHER_ALGORITHMS` (``ring``, ``auto``), which
take `block_range` blocks as the segments are split and are blocking (a prefetch
then runs at once). On a device communicator MPI's calls are staged by it, the
hand-written ones as one call (`kernels.backend.Backend.staged`).

Communication cost per segment of ``n`` bytes on ``p`` ranks, per rank: the
reduce-scatter sends ``(p-1)/p n`` bytes, the allgather ``(p-1)/p n`` (ring:
``p - 1`` messages each; MPI's by its own choice of algorithm).
"""
import functools

from mpi4py import MPI

from kernels.comm import backend_of, raw_comm
from kernels.comm.device import wait_all
from kernels.errors import InputError
from parallel.collectives.allgather import ALLGATHER_ALGORITHMS
from parallel.collectives.reduce_scatter import REDUCE_SCATTER_ALGORITHMS
from parallel.data.exchange import GradientExchange

#: The collectives a sharded trainer can use: MPI's, or a hand-written pair known to both families.
ZERO_COLLECTIVES = ("mpi",) + tuple(name for name in REDUCE_SCATTER_ALGORITHMS if name in ALLGATHER_ALGORITHMS)


class ShardExchange:
    """Reduce-scatter (SUM) and allgather of the segments of a `ShardLayout`, timing every MPI call.

    ``comm`` holds all ranks (an ``MPI.Comm``, or a ``DeviceComm`` for device arrays, as for
    `parallel.data.exchange.GradientExchange`); ``collectives`` is one of `ZERO_COLLECTIVES`.

    Attributes
    ----------
    nonblocking : bool
        Whether `start_allgather` returns before the data is in (``"mpi"``).
    seconds : float
        Time spent in the MPI calls, summed over all calls.
    """

    def __init__(self, comm, collectives):
        if collectives not in ZERO_COLLECTIVES:
            raise InputError(f"unknown sharded collectives {collectives!r}; choose from {', '.join(ZERO_COLLECTIVES)}")
        self.comm, self.collectives, self.nonblocking = comm, collectives, collectives == "mpi"
        device = backend_of(comm)
        if collectives != "mpi":
            reduce_scatter = functools.partial(REDUCE_SCATTER_ALGORITHMS[collectives], raw_comm(comm))
            allgather = functools.partial(ALLGATHER_ALGORITHMS[collectives], raw_comm(comm), MPI.IN_PLACE)
            in_place = functools.partial(reduce_scatter, MPI.IN_PLACE)
            self._reduce_scatter, self._in_place, self._allgather = (reduce_scatter, in_place, allgather) \
                if device is None else (functools.partial(device.staged, reduce_scatter, outputs=(1,)),
                                        functools.partial(device.staged, in_place),
                                        functools.partial(device.staged, allgather))
        self.seconds = 0.0

    def reduce_scatter(self, segment, piece, counts):
        """Sum ``segment`` (this rank's contribution, the whole segment) over the ranks into ``piece``, this
        rank's block of the sum (``counts``: every rank's block length)."""
        if self.nonblocking:
            self.timed(self.comm.Reduce_scatter, segment, piece, counts, op=MPI.SUM)
        else:
            self.timed(self._reduce_scatter, segment, piece)

    def reduce_scatter_in_place(self, segment, own, counts, scratch):
        """Sum ``segment`` over the ranks into its own block ``segment[own]`` (the rest left undefined).

        MPI leaves an in-place result at the buffer's start, so ``"mpi"`` reduces into ``scratch`` (this
        rank's block length) and copies; the hand-written algorithms reduce in place (``scratch`` unused)."""
        if self.nonblocking:
            self.timed(self.comm.Reduce_scatter, segment, scratch, counts, op=MPI.SUM)
            segment[own] = scratch
        else:
            self.timed(self._in_place, segment)

    def allgather(self, segment, counts, displacements):
        """Fill the whole ``segment`` from every rank's block, this rank's already in place; blocking."""
        self.wait(self.start_allgather(segment, counts, displacements))

    def start_allgather(self, segment, counts, displacements):
        """Start `allgather` (``Iallgatherv`` in place); return its request, None when it has completed."""
        if self.nonblocking:
            return self.timed(self.comm.Iallgatherv, MPI.IN_PLACE, [segment, (counts, displacements)])
        self.timed(self._allgather, segment)
        return None

    def wait(self, request):
        """Complete a request of `start_allgather` (device copies included; None: nothing to wait for)."""
        if request is not None:
            self.timed(wait_all, [request])

    timed = GradientExchange.timed  # ``call(*args, **kwargs)``, its wall time added to `seconds`
