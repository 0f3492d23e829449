"""Ring reduce-scatter, ring allgather, and the ring allreduce built from the two.

Blocks follow `block_range` (uneven splits); conventions and cost notation as in
`parallel.collectives.base`. Each step passes one block to the right neighbour
while receiving one from the left, so every rank sends ``(p-1)/p n`` bytes per
phase: bandwidth-optimal, but ``p-1`` messages per phase.
"""
import numpy as np

from parallel.collectives.base import (accepts_buffers, allreduce_operands, block_slices, check_block, exchange,
                                      exchange_and_reduce, operands, reduce_ufunc)


def _ring_reduce_scatter(comm, source, slices, ufunc, out, landing=None):
    """Reduce ``source`` around the ring so that ``out`` gets block ``comm.rank`` reduced.

    At step ``s`` rank ``r`` sends its partial of block ``r-1-s`` to the right and
    reduces the partial of block ``r-2-s`` coming from the left. Partials land in
    ``landing[slices[block]]`` (a full-length array free to overwrite, ``out`` its own
    block), or in two alternating scratch blocks when ``landing`` is None.
    """
    p, rank = comm.size, comm.rank
    if p == 1:
        if not np.may_share_memory(out, source):
            np.copyto(out, source[slices[rank]])
        return
    left, right = (rank - 1) % p, (rank + 1) % p
    if landing is None:
        width = max(part.stop - part.start for part in slices)
        scratch = np.empty((2, width), dtype=source.dtype)
    outgoing = source[slices[(rank - 1) % p]]
    for step in range(p - 1):
        part = slices[(rank - 2 - step) % p]
        count = part.stop - part.start
        incoming = landing[part] if landing is not None else scratch[step % 2, :count]
        target = out if step == p - 2 else incoming
        outgoing = exchange_and_reduce(comm, outgoing, right, incoming, left, source[part], ufunc, target)


def _ring_allgather(comm, work, slices):
    """Fill every block of ``work`` from block ``comm.rank``, passing blocks to the right."""
    p, rank = comm.size, comm.rank
    left, right = (rank - 1) % p, (rank + 1) % p
    for step in range(p - 1):
        exchange(comm, work[slices[(rank - step) % p]], right, work[slices[(rank - step - 1) % p]], left)


@accepts_buffers
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
    in ``recvbuf`` itself, so no scratch memory is used. Cost per rank:
    ``2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma`` (bandwidth-optimal).
    """
    source, ufunc = allreduce_operands(sendbuf, recvbuf, op, copy_input=False)
    if recvbuf.size == 0:
        return recvbuf
    slices = block_slices(recvbuf.size, comm.size)
    landing = None if source is recvbuf else recvbuf
    _ring_reduce_scatter(comm, source, slices, ufunc, recvbuf[slices[comm.rank]], landing)
    _ring_allgather(comm, recvbuf, slices)
    return recvbuf


@accepts_buffers
def reduce_scatter_ring(comm, sendbuf, recvbuf, op="sum"):
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

    Returns
    -------
    recvbuf

    Notes
    -----
    Cost per rank: ``(p-1) alpha + (p-1)/p n beta + (p-1)/p n gamma``; scratch: two blocks.
    """
    source = operands(sendbuf, recvbuf)
    ufunc = reduce_ufunc(op, source.dtype)
    slices = block_slices(source.size, comm.size)
    if source is not recvbuf:
        check_block(comm, "recvbuf", recvbuf, source.size)
    out = recvbuf[slices[comm.rank]] if source is recvbuf else recvbuf
    if source.size:
        _ring_reduce_scatter(comm, source, slices, ufunc, out)
    return recvbuf


@accepts_buffers
def allgather_ring(comm, sendbuf, recvbuf):
    """Gather every rank's block into the full vector on every rank (ring).

    Parameters
    ----------
    comm : MPI.Comm
    sendbuf : buffer, shape (block_counts(n, p)[rank],), or MPI.IN_PLACE
        This rank's block; ``MPI.IN_PLACE``: it already sits in ``recvbuf`` at
        ``block_range(n, p, rank)``.
    recvbuf : buffer, shape (n,)
        Gets block ``r`` of every rank ``r`` at ``block_range(n, p, r)``.

    Returns
    -------
    recvbuf

    Notes
    -----
    Cost per rank: ``(p-1) alpha + (p-1)/p n beta``.
    """
    source = operands(sendbuf, recvbuf)
    slices = block_slices(recvbuf.size, comm.size)
    if source is not recvbuf:
        check_block(comm, "sendbuf", source, recvbuf.size)
        np.copyto(recvbuf[slices[comm.rank]], source)
    if recvbuf.size:
        _ring_allgather(comm, recvbuf, slices)
    return recvbuf
