"""Ring reduce-scatter, ring allgather, and the ring allreduce built from the two.

Blocks follow `block_range` (uneven splits); conventions and cost notation as in
`parallel.collectives.base`. Each step passes one block to the right neighbour
while receiving one from the left, so every rank sends ``(p-1)/p n`` bytes per
phase: bandwidth-optimal, but ``p-1`` messages per phase. The steps are laid out
once per shape (`parallel.collectives.schedule`) and run from cached plans
(`parallel.collectives.plans`).
"""
from parallel.collectives.base import allreduce_length, block_slices, check_block, check_counts
from parallel.collectives.plans import Collective
from parallel.collectives.schedule import Schedule


def _reduce_scatter_steps(schedule, rank, p, slices, out, landing):
    """Reduce "in" around the ring so that view ``out`` gets block ``rank`` reduced.

    At step ``s`` rank ``r`` sends its partial of block ``r-1-s`` to the right and
    reduces the partial of block ``r-2-s`` coming from the left. Partials land in
    their own block of "out" when ``landing`` (out of place: "out" is a full-length
    array free to overwrite), else in two alternating blocks of "tmp".
    """
    left, right = (rank - 1) % p, (rank + 1) % p
    width = max(part.stop - part.start for part in slices)
    outgoing = ("in", slices[(rank - 1) % p])
    for step in range(p - 1):
        part = slices[(rank - 2 - step) % p]
        offset = step % 2 * width
        incoming = ("out", part) if landing else ("tmp", slice(offset, offset + part.stop - part.start))
        target = out if step == p - 2 else incoming
        schedule.exchange(outgoing, right, incoming, left, reduce=(("in", part), incoming, target))
        outgoing = target


def allgather_steps(schedule, rank, p, slices, first=None):
    """Append the ring allgather's ``p - 1`` steps: fill every block ``slices[r]`` of "out" from block
    ``rank``, passing one block to the right neighbour while receiving one from the left. ``first``: the
    view the own block is sent from instead (out of place: "in"), copied into "out" while the first
    step's messages are in flight (an early copy).

    Also the second half of the ring allreduce and of the scatter-allgather broadcast
    (`parallel.collectives.bcast.scatter_allgather`), which run it on virtual ranks.
    """
    left, right = (rank - 1) % p, (rank + 1) % p
    for step in range(p - 1):
        outgoing, incoming = ("out", slices[(rank - step) % p]), ("out", slices[(rank - step - 1) % p])
        if step == 0 and first is not None:
            schedule.step([(first, right)], [(incoming, left)], [("early_copy", first, outgoing)])
        else:
            schedule.exchange(outgoing, right, incoming, left)


def ring_schedule(rank, p, n, itemsize=None, in_place=False):
    """Steps of `allreduce_ring` on ``rank`` for ``n`` items (a `Schedule`)."""
    schedule = Schedule()
    if n and p == 1 and not in_place:
        schedule.copy(("in", slice(0, n)), ("out", slice(0, n)))
    elif n and p > 1:
        slices = block_slices(n, p)
        _reduce_scatter_steps(schedule, rank, p, slices, ("out", slices[rank]), landing=not in_place)
        allgather_steps(schedule, rank, p, slices)
    return schedule


def reduce_scatter_schedule(rank, p, n, itemsize=None, in_place=False, counts=None):
    """Steps of `reduce_scatter_ring` on ``rank`` for a full vector of ``n`` items (a `Schedule`; blocks of
    `block_range`, or of ``counts`` items)."""
    slices = block_slices(n, p, counts)
    out = ("out", slices[rank] if in_place else slice(0, slices[rank].stop - slices[rank].start))
    schedule = Schedule()
    if n and p == 1 and not in_place:
        schedule.copy(("in", slices[0]), out)
    elif n and p > 1:
        _reduce_scatter_steps(schedule, rank, p, slices, out, landing=False)
    return schedule


def reduce_scatter_length(comm, source, recvbuf, counts=None):
    """The reduce-scatter's ``n`` (``source``'s length), after checking that an out-of-place ``recvbuf`` is
    this rank's block (and ``counts``, when given: `parallel.collectives.base.check_counts`)."""
    if source is not recvbuf:
        check_block(comm, "recvbuf", recvbuf, source.size, counts)
    elif counts is not None:
        check_counts(comm, counts, source.size)
    return source.size


def own_block(slices, rank, in_place):
    """The view holding this rank's block at the start of an allgather: "out" at ``slices[rank]`` in
    place, else all of "in" (which holds just that block)."""
    part = slices[rank]
    return ("out", part) if in_place else ("in", slice(0, part.stop - part.start))


def allgather_schedule(rank, p, n, itemsize=None, in_place=False, counts=None):
    """Steps of `allgather_ring` on ``rank`` for a full vector of ``n`` items (a `Schedule`; blocks of
    `block_range`, or of ``counts`` items)."""
    slices = block_slices(n, p, counts)
    schedule = Schedule()
    if n and p > 1:
        allgather_steps(schedule, rank, p, slices, None if in_place else own_block(slices, rank, in_place))
    elif n and not in_place:
        schedule.copy(own_block(slices, rank, in_place), ("out", slices[rank]))
    return schedule


def allgather_length(comm, source, recvbuf, counts=None):
    """The allgather's ``n`` (``recvbuf``'s length), after checking that ``source`` is this rank's block
    (and ``counts``, when given: `parallel.collectives.base.check_counts`)."""
    if source is not recvbuf:
        check_block(comm, "sendbuf", source, recvbuf.size, counts)
    elif counts is not None:
        check_counts(comm, counts, recvbuf.size)
    return recvbuf.size


_ALLREDUCE = Collective("allreduce_ring", ring_schedule, allreduce_length)
_REDUCE_SCATTER = Collective("reduce_scatter_ring", reduce_scatter_schedule, reduce_scatter_length)
_ALLGATHER = Collective("allgather_ring", allgather_schedule, allgather_length, reduces=False)


def allreduce_ring(comm, sendbuf, recvbuf, op="sum"):
    """Allreduce by a ring reduce-scatter followed by a ring allgather.

    Parameters
    ----------
    comm : MPI.Comm
        Every rank calls with the same length, dtype and ``op``.
    sendbuf : buffer, shape (n,), or MPI.IN_PLACE
        This rank's contribution; ``MPI.IN_PLACE`` takes it from ``recvbuf``.
    recvbuf : buffer, shape (n,)
        Gets the elementwise reduction over all ranks (same on every rank).
    op : {"sum", "max"}

    Returns
    -------
    recvbuf

    Notes
    -----
    Blocks follow `block_range` (uneven splits). Out of place, partial results land
    in ``recvbuf`` itself, so no scratch memory is used; in place, two blocks. Cost per rank:
    ``2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma`` (bandwidth-optimal).
    """
    return _ALLREDUCE(comm, sendbuf, recvbuf, op)


def reduce_scatter_ring(comm, sendbuf, recvbuf, op="sum", counts=None):
    """Reduce ``n`` items over all ranks and leave block ``comm.rank`` on each rank (ring).

    Parameters
    ----------
    comm : MPI.Comm
    sendbuf : buffer, shape (n,), or MPI.IN_PLACE
        This rank's full-length contribution.
    recvbuf : buffer
        Out of place: shape ``(block_counts(n, p)[rank],)``, gets the reduced block
        ``block_range(n, p, rank)``. In place: shape ``(n,)``, holds the input; on
        return its block ``block_range(n, p, rank)`` holds the result and the other
        blocks are left as they were.
    op : {"sum", "max"}
    counts : tuple of int, optional
        The v-variant (``MPI_Reduce_scatter``'s ``recvcounts``): block ``j`` has ``counts[j]``
        items, the blocks one after another, instead of `block_range`'s.

    Returns
    -------
    recvbuf

    Notes
    -----
    Cost per rank: ``(p-1) alpha + (p-1)/p n beta + (p-1)/p n gamma``; scratch: two blocks
    (with ``counts``: the largest block's items instead of ``n/p``).
    """
    return _REDUCE_SCATTER(comm, sendbuf, recvbuf, op, counts)


def allgather_ring(comm, sendbuf, recvbuf, counts=None):
    """Gather every rank's block into the full vector on every rank (ring).

    Parameters
    ----------
    comm : MPI.Comm
    sendbuf : buffer, shape (block_counts(n, p)[rank],), or MPI.IN_PLACE
        This rank's block; ``MPI.IN_PLACE``: it already sits in ``recvbuf`` at
        ``block_range(n, p, rank)``.
    recvbuf : buffer, shape (n,)
        Gets block ``r`` of every rank ``r`` at ``block_range(n, p, r)``.
    counts : tuple of int, optional
        The v-variant (``MPI_Allgatherv`` with displacements one after another): block ``r``
        has ``counts[r]`` items, instead of `block_range`'s.

    Returns
    -------
    recvbuf

    Notes
    -----
    Cost per rank: ``(p-1) alpha + (p-1)/p n beta``; out of place one local copy of the
    own block (``n/p`` bytes). No scratch. Bandwidth-optimal: best for long vectors
    (`parallel.collectives.allgather` has the latency-optimal ones).
    """
    return _ALLGATHER(comm, sendbuf, recvbuf, None, counts)
