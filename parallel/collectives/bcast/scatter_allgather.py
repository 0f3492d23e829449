"""Broadcast by a binomial scatter of the blocks and a ring allgather (van de Geijn).

The root hands each subtree of the binomial tree (`parallel.collectives.bcast.base`,
virtual ranks, root 0) the blocks of its ranks, so virtual rank ``v`` ends up with
block ``v`` of `block_range` over ``p`` (a subtree's blocks are contiguous: one view
per message); then the ring allgather of `parallel.collectives.ring` assembles the
vector everywhere. As MPICH's ``bcast_intra_scatter_ring_allgather`` (which cuts
blocks of ``ceil(n/p)`` bytes; here `block_range`'s uneven ones). Conventions and cost
notation as in `parallel.collectives.base`.
"""
from parallel.collectives.base import allreduce_length, block_slices
from parallel.collectives.bcast.base import children, input_buffer, root_or_in_place, subtree_span
from parallel.collectives.ring import allgather_steps
from parallel.collectives.rooted import RootedCollective
from parallel.collectives.schedule import Schedule


def scatter_allgather_schedule(rank, p, n, itemsize=None, in_place=False):
    """Steps of `bcast_scatter_allgather` on virtual rank ``rank`` (root 0) for ``n`` items (a `Schedule`)."""
    schedule = Schedule()
    if n == 0:
        return schedule
    slices = block_slices(n, p)
    starts = [part.start for part in slices] + [n]

    def blocks(first, span):
        return slice(starts[first], starts[min(first + span, p)])

    source = input_buffer(rank, in_place)
    if rank:
        schedule.step(recvs=[(("out", blocks(rank, subtree_span(rank, p))), rank - subtree_span(rank, p))])
    copies = [("copy", ("in", slice(0, n)), ("out", slice(0, n)))] if source == "in" else []
    schedule.step(sends=[((source, blocks(child, span)), child) for child, span in children(rank, p)], ops=copies)
    allgather_steps(schedule, rank, p, slices)
    return schedule


_SCATTER_ALLGATHER = RootedCollective("bcast_scatter_allgather", scatter_allgather_schedule, allreduce_length,
                                      reduces=False)


def bcast_scatter_allgather(comm, sendbuf, recvbuf, root=0):
    """Broadcast the root's vector by a binomial scatter of its blocks and a ring allgather.

    Parameters and return value as `parallel.collectives.bcast.binomial.bcast_binomial`.

    Notes
    -----
    Cost per rank: scatter ``ceil(log2 p) alpha + (p-1)/p n beta`` on the root (a rank
    receives its subtree's blocks once and passes on all but its own), then the ring
    ``(p-1) alpha + (p-1)/p n beta``: ``(ceil(log2 p) + p - 1) alpha + 2 (p-1)/p n beta``
    on the critical path, against ``ceil(log2 p) n beta`` for the binomial tree.
    Bandwidth-optimal up to a factor 2; best for long vectors on many ranks. Out of
    place the root copies its ``n`` bytes into ``recvbuf``. No scratch.
    """
    return _SCATTER_ALLGATHER(comm, root_or_in_place(comm, sendbuf, root), recvbuf, None, root)
