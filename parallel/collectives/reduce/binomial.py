"""Reduce to a root along a binomial tree.

The broadcasts' tree (`parallel.collectives.bcast.base`) walked upwards: on virtual ranks
``v = (rank - root) % p``, rank ``v`` receives from ``v + 1, v + 2, v + 4, ...`` below its lowest
set bit and then sends its partial result to ``v`` minus that bit (`parallel.collectives.tree`
runs this reduce and the binomial broadcast in turn);
`parallel.collectives.rooted.RootedCollective` maps virtual ranks to real ones. Any rank
count; conventions and cost notation as in `parallel.collectives.base`.
"""
from parallel.collectives.base import allreduce_length
from parallel.collectives.bcast.base import children, subtree_span
from parallel.collectives.power_of_two import trivial_schedule
from parallel.collectives.rooted import RootedCollective
from parallel.collectives.schedule import Schedule


def binomial_schedule(rank, p, n, itemsize=None, in_place=False):
    """Steps of `reduce_binomial` on virtual rank ``rank`` (root 0) for ``n`` items (a `Schedule`).

    Out of place the input is not copied: the first child's vector lands in "out" and is reduced
    with "in" there, and a leaf sends "in" itself; later children's vectors land in "tmp".
    """
    schedule = trivial_schedule(p, n, in_place)
    if schedule is not None:
        return schedule
    schedule, whole = Schedule(), slice(0, n)
    data = "out" if in_place else "in"
    for child, _ in reversed(children(rank, p)):         # smallest subtree first: the first to finish
        incoming = ("out" if data == "in" else "tmp", whole)
        schedule.step(recvs=[(incoming, child)], ops=[("reduce", (data, whole), incoming, ("out", whole))])
        data = "out"
    if rank:
        schedule.step(sends=[((data, whole), rank - subtree_span(rank, p))])
    return schedule


_BINOMIAL = RootedCollective("reduce_binomial", binomial_schedule, allreduce_length)


def reduce_binomial(comm, sendbuf, recvbuf, op="sum", root=0):
    """Reduce every rank's vector to ``root`` along a binomial tree.

    Parameters
    ----------
    comm : MPI.Comm
        Every rank calls with the same length, dtype, ``op`` and ``root``.
    sendbuf : buffer, shape (n,), or MPI.IN_PLACE
        This rank's contribution; ``MPI.IN_PLACE`` takes it from ``recvbuf``.
    recvbuf : buffer, shape (n,)
        On ``root``: gets the elementwise reduction over all ranks. On every other rank it is
        workspace (also needed there, shape ``(n,)``): its contents afterwards are unspecified.
    op : {"sum", "max"}
    root : int
        The rank receiving the result (``0 <= root < p``; else a ``ValueError``).

    Returns
    -------
    recvbuf

    Notes
    -----
    Each rank sends one message of ``n`` bytes (the root none) and receives one per child (up to
    ``ceil(log2 p)`` on the root). Critical path: ``ceil(log2 p) (alpha + n beta + n gamma)``:
    latency-optimal, the choice for short vectors. Scratch: ``n`` bytes on ranks with two or
    more children (one or more in place), none on leaves.
    """
    return _BINOMIAL(comm, sendbuf, recvbuf, op, root)
