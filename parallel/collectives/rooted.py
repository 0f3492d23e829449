"""Collectives with a root (broadcast, reduce): a schedule written for root 0, run for any root.

A rooted algorithm lays out its steps for virtual ranks ``(rank - root) % p``, as if
the root were rank 0; `RootedCollective` relabels the peers back to real ranks
(`parallel.collectives.schedule.Schedule.relabelled`) and keeps one
`parallel.collectives.plans.Collective` per root, so layouts and plans are cached
per root as for the other collectives. Conventions as in `parallel.collectives.base`.
"""
import operator
from functools import partial

from parallel.collectives.plans import Collective


def _relabelled(schedule_of, root, rank, p, n, itemsize, in_place):
    virtual = schedule_of((rank - root) % p, p, n, itemsize, in_place)
    return virtual.relabelled(lambda peer: (peer + root) % p)


class RootedCollective:
    """A hand-written collective with a root, run from cached layouts and plans.

    Parameters
    ----------
    name : str
    schedule : callable
        ``schedule(virtual_rank, size, n, itemsize, in_place) -> Schedule`` for root 0.
    length : callable
        As for `parallel.collectives.plans.Collective`.
    reduces : bool
        Whether ``op`` applies.
    """

    def __init__(self, name, schedule, length, reduces=True):
        self.name, self.schedule, self.length, self.reduces = name, schedule, length, reduces
        self._by_root = {}

    def __repr__(self):
        return f"RootedCollective({self.name!r})"

    def __call__(self, comm, sendbuf, recvbuf, op="sum", root=0):
        """Run on ``comm`` with ``root``; return ``recvbuf``. A root outside ``0 .. comm.size - 1`` is a
        ``ValueError``, as a bad length is."""
        root = operator.index(root)  # a TypeError for a root that is no integer
        if not 0 <= root < comm.size:
            raise ValueError(f"root {root!r} is not a rank of a communicator of {comm.size}")
        collective = self._by_root.get(root)
        if collective is None:
            collective = self._by_root[root] = Collective(f"{self.name}[root={root}]",
                                                          partial(_relabelled, self.schedule, root), self.length,
                                                          self.reduces)
        return collective(comm, sendbuf, recvbuf, op)
