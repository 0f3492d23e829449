"""Allreduce by a binomial-tree reduce to rank 0 and a binomial-tree broadcast.

Any rank count; conventions and cost notation as in `parallel.collectives.base`.
"""
import numpy as np

from parallel.collectives.base import COLLECTIVE_TAG, accepts_buffers, allreduce_operands


@accepts_buffers
def allreduce_tree(comm, sendbuf, recvbuf, op="sum"):
    """Allreduce by a binomial-tree reduce to rank 0 and a binomial-tree broadcast.

    Parameters and return value as `parallel.collectives.ring.allreduce_ring`.

    Notes
    -----
    Critical path ``2 ceil(log2 p) (alpha + n beta) + ceil(log2 p) n gamma``; each
    rank sends one message in the reduce and up to ``ceil(log2 p)`` (rank 0) in the
    broadcast. Simple, but neither latency- nor bandwidth-optimal.
    """
    ufunc = allreduce_operands(sendbuf, recvbuf, op)[1]
    p, rank = comm.size, comm.rank
    if recvbuf.size == 0 or p == 1:
        return recvbuf
    scratch = np.empty_like(recvbuf)
    distance = 1
    while distance < p and not rank & distance:
        if rank + distance < p:
            comm.Recv(scratch, source=rank + distance, tag=COLLECTIVE_TAG)
            ufunc(recvbuf, scratch, out=recvbuf)
        distance <<= 1
    if distance < p:
        comm.Send(recvbuf, dest=rank - distance, tag=COLLECTIVE_TAG)
        comm.Recv(recvbuf, source=rank - distance, tag=COLLECTIVE_TAG)
    # ``distance`` is now this rank's lowest set bit (p rounded up to a power of two on rank 0).
    distance >>= 1
    while distance:
        if rank + distance < p:
            comm.Send(recvbuf, dest=rank + distance, tag=COLLECTIVE_TAG)
        distance >>= 1
    return recvbuf
