"""One way to count the bytes a rank sends, for every parallel routine and suite.

Counts are nominal: the per-rank traffic of a bandwidth-optimal algorithm for the
collective, whatever algorithm MPI picks (the nccl-tests bus factors, which the
harness also uses to turn algorithm bandwidth into bus bandwidth). For a payload
of ``n`` bytes on ``p`` ranks:

- ``send`` (a point-to-point message, the send half of a ``Sendrecv``, or bytes
  known exactly such as an all-to-all's rows to other ranks), ``sendrecv``,
  ``broadcast``: ``n``;
- ``allreduce``: ``2 (p - 1) / p * n``;
- ``allgather``, ``reduce_scatter``, ``alltoall``: ``(p - 1) / p * n`` with ``n``
  the gathered (or reduced) total;
- nothing at all on one rank. Receiving costs nothing.

Counts are floats (the factors are fractions); `TrafficCounter` adds them up.
No MPI here: importing this module does not initialise MPI.
"""
import contextlib
import time

#: nccl-tests bus-bandwidth factors by collective, as functions of the rank count.
BUS_FACTORS = {
    "allreduce": lambda p: 2 * (p - 1) / p,
    "allgather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "alltoall": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
    "sendrecv": lambda p: 1.0,
    "send": lambda p: 1.0,
}


def bus_bytes(kind, nbytes, ranks):
    """Nominal bytes one rank sends for a ``kind`` transfer of ``nbytes`` on ``ranks`` ranks (0 on one rank)."""
    return BUS_FACTORS[kind](ranks) * nbytes if ranks > 1 else 0.0


class TrafficCounter:
    """Bytes this rank has sent (module convention) and seconds spent communicating, among ``ranks`` ranks.

    Attributes
    ----------
    ranks : int
        Ranks of the communicator the transfers are on (no transfer counts on one rank).
    bytes_sent : float
    seconds : float
        Wall time inside the calls wrapped by `timed` (waits for other ranks included).
    """

    def __init__(self, ranks):
        self.ranks = ranks
        self.reset()

    def reset(self):
        """Zero the counts."""
        self.bytes_sent, self.seconds = 0.0, 0.0

    def add(self, kind, nbytes):
        """Count a ``kind`` transfer (a key of `BUS_FACTORS`) of ``nbytes``."""
        self.bytes_sent += bus_bytes(kind, nbytes, self.ranks)

    @contextlib.contextmanager
    def timed(self):
        """Add the wall time of the ``with`` block to `seconds`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - start
