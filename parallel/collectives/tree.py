"""Allreduce by a binomial-tree reduce to rank 0 and a binomial-tree broadcast from it.

The two halves are the rooted collectives' own trees, run for root 0: the reduce of
`parallel.collectives.reduce.binomial` leaves the whole reduction in rank 0's
``recvbuf``, and the broadcast of `parallel.collectives.bcast.binomial` sends it from
there down the same tree (in place: every rank's result lands in its ``recvbuf``). Any
rank count; laid out once per shape (`parallel.collectives.schedule`) and run from
cached plans (`parallel.collectives.plans`); conventions and cost notation as in
`parallel.collectives.base`.
"""
from parallel.collectives.base import allreduce_length
from parallel.collectives.bcast.binomial import binomial_schedule as broadcast_schedule
from parallel.collectives.plans import Collective
from parallel.collectives.reduce.binomial import binomial_schedule as reduce_schedule


def tree_schedule(rank, p, n, itemsize=None, in_place=False):
    """Steps of `allreduce_tree` on ``rank`` for ``n`` items (a `Schedule`): the binomial reduce to rank 0,
    then the binomial broadcast of rank 0's "out"."""
    reduced = reduce_schedule(rank, p, n, itemsize, in_place)
    return reduced.extend(broadcast_schedule(rank, p, n, itemsize, in_place=True))


_TREE = Collective("allreduce_tree", tree_schedule, allreduce_length)


def allreduce_tree(comm, sendbuf, recvbuf, op="sum"):
    """Allreduce by a binomial-tree reduce to rank 0 and a binomial-tree broadcast.

    Parameters and return value as `parallel.collectives.ring.allreduce_ring`.

    Notes
    -----
    Critical path ``2 ceil(log2 p) (alpha + n beta) + ceil(log2 p) n gamma``; each
    rank sends one message in the reduce and up to ``ceil(log2 p)`` (rank 0) in the
    broadcast, posted together. Simple, but neither latency- nor bandwidth-optimal.
    Scratch: ``n`` bytes on ranks with two or more children in the tree (one or more
    in place), none on leaves (`parallel.collectives.reduce.binomial.reduce_binomial`).
    """
    return _TREE(comm, sendbuf, recvbuf, op)
