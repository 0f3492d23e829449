"""Broadcast down a binomial tree: ``ceil(log2 p)`` rounds, the whole vector each.

The tree of `parallel.collectives.bcast.base` on virtual ranks (root 0; the second half of
`parallel.collectives.tree`'s allreduce): virtual rank ``v`` receives from
``v - lowbit(v)`` and sends to ``v + 2**j`` for every ``2**j < lowbit(v)`` (the root:
every ``2**j < p``), largest subtree first, its sends posted together. As MPICH's
``bcast_intra_binomial``; conventions and cost notation as in
`parallel.collectives.base`.
"""
from parallel.collectives.base import allreduce_length
from parallel.collectives.bcast.base import children, input_buffer, root_or_in_place, subtree_span
from parallel.collectives.rooted import RootedCollective
from parallel.collectives.schedule import Schedule


def binomial_schedule(rank, p, n, itemsize=None, in_place=False):
    """Steps of `bcast_binomial` on virtual rank ``rank`` (root 0) for ``n`` items (a `Schedule`)."""
    schedule, whole = Schedule(), slice(0, n)
    if n == 0:
        return schedule
    source = (input_buffer(rank, in_place), whole)
    if rank:
        schedule.step(recvs=[(source, rank - subtree_span(rank, p))])
    copies = [("copy", source, ("out", whole))] if source[0] == "in" else []
    schedule.step(sends=[(source, child) for child, _ in children(rank, p)], ops=copies)
    return schedule


_BINOMIAL = RootedCollective("bcast_binomial", binomial_schedule, allreduce_length, reduces=False)


def bcast_binomial(comm, sendbuf, recvbuf, root=0):
    """Broadcast the root's vector to every rank down a binomial tree.

    Parameters
    ----------
    comm : MPI.Comm
        Every rank calls with the same length, dtype and ``root``.
    sendbuf : buffer, shape (n,), or MPI.IN_PLACE
        Read on the root only (ignored elsewhere); ``MPI.IN_PLACE`` on the root: the
        data is already in its ``recvbuf``.
    recvbuf : buffer, shape (n,)
        Gets the root's vector on every rank (the root's too).
    root : int
        The rank whose vector is broadcast (``ValueError`` outside ``0 .. p - 1``).

    Returns
    -------
    recvbuf

    Notes
    -----
    Critical path ``ceil(log2 p) (alpha + n beta)``; the root sends ``ceil(log2 p)``
    messages of ``n`` bytes, a rank ``v`` of the tree ``log2 lowbit(v)`` of them
    (half the ranks, the leaves, none). Latency-optimal; best for short vectors.
    Out of place the root copies its ``n`` bytes into ``recvbuf``. No scratch.
    """
    return _BINOMIAL(comm, root_or_in_place(comm, sendbuf, root), recvbuf, None, root)
