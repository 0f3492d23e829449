"""Two-level (SMP-aware) allreduce: inside each node, then between nodes, as NCCL, Horovod and MPICH do.

A node is a ``comm.Split_type(MPI.COMM_TYPE_SHARED)`` communicator. When every node
has the same number of ranks ``L`` (``N`` nodes), the blocks line up: a ring
reduce-scatter inside each node leaves node-local rank ``l`` the node's sum of block
``l`` (`block_range(n, L, l)`), the ranks of equal node-local index (one per node,
``comm.Split(color=l)``) allreduce that block (`allreduce_auto`), and a ring
allgather inside each node assembles the vector: every link between nodes carries
only ``n / L`` bytes per rank. Nodes of unequal rank counts (3 ranks as 2 + 1) cannot
line their blocks up; then, as MPICH's ``MPIR_Allreduce_intra_smp``, each node reduces
to its first rank (`reduce_auto`), the node leaders allreduce (`allreduce_auto`) and
each leader broadcasts in its node (`bcast_auto`).
On one node it is the intra-node part alone (`allreduce_ring`); with one rank per
node the allreduce between nodes alone.

The node and cross-node communicators are made once per communicator (collective:
the first call on a communicator splits it) and stored as an MPI attribute on it
(`parallel.collectives.attributes`), so they are freed, with their cached plans, when
the communicator is freed (the attribute's delete callback) or at exit. On one node, or with one rank per node, the
one level runs on the communicator itself, so `release_plans` of it frees its plans;
the two-level plans live on the sub-communicators (freed with the communicator, or by
``release_plans()`` of all). Conventions and cost notation as in
`parallel.collectives.base`; ``alpha`` and ``beta`` differ inside a node and between
nodes.
"""
import atexit
from collections import OrderedDict

from mpi4py import MPI

from kernels.backend import array_module
from kernels.distribution import block_range
from parallel.collectives.attributes import CommAttribute
from parallel.collectives.auto import allreduce_auto
from parallel.collectives.base import allreduce_length, buffer_array, operands, reduce_ufunc
from parallel.collectives.bcast import bcast_auto
from parallel.collectives.plans import release_plans
from parallel.collectives.reduce import reduce_auto
from parallel.collectives.ring import allgather_ring, allreduce_ring, reduce_scatter_ring

#: Reduced-block scratch vectors kept per communicator (one per length and dtype; the most recently used).
BLOCKS_KEPT = 4


class _Nodes:
    """The node communicator of this rank, the communicator across nodes, and the scheme they allow.

    ``across`` joins the ranks of equal node-local index when the nodes are equal in size
    (``aligned``), else the node leaders (``COMM_NULL`` elsewhere).
    """

    def __init__(self, comm):
        self.node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
        self.aligned = len(set(comm.allgather(self.node.size))) == 1
        color = self.node.rank if self.aligned else 0 if self.node.rank == 0 else MPI.UNDEFINED
        self.across = comm.Split(color, comm.rank)
        self.blocks = OrderedDict()       # (n, dtype, xp) -> this rank's reduced block

    def block(self, n, dtype, xp):
        """A scratch vector of this rank's node block of ``n`` items in array module ``xp``'s memory (the same
        object for the same shape, so the collectives on it run from their plans)."""
        key = (n, dtype, xp)
        block = self.blocks.pop(key, None)
        if block is None:
            start, stop = block_range(n, self.node.size, self.node.rank)
            block = xp.empty(stop - start, dtype)
        self.blocks[key] = block
        while len(self.blocks) > BLOCKS_KEPT:
            self.blocks.popitem(last=False)
        return block

    def free(self):
        """Release the sub-communicators' plans and free them."""
        for sub in (self.node, self.across):
            if sub != MPI.COMM_NULL:
                release_plans(sub)
                sub.Free()
        self.blocks.clear()


_NODES = CommAttribute(_Nodes, _Nodes.free)
atexit.register(_NODES.delete_all)       # the sub-communicators freed while Python and MPI are both still up


def allreduce_hierarchical(comm, sendbuf, recvbuf, op="sum"):
    """Allreduce inside each node, then between nodes, then inside each node again.

    Parameters and return value as `parallel.collectives.ring.allreduce_ring`. The
    first call on a communicator is collective beyond the allreduce: it splits the
    communicator into nodes (`_Nodes`).

    Notes
    -----
    ``L`` ranks per node, ``N`` nodes, per rank. Equal nodes: inside the node
    ``2 (L-1) alpha + 2 (L-1)/L n beta + (L-1)/L n gamma`` (ring reduce-scatter and
    allgather), between nodes `allreduce_auto` of ``n / L`` bytes on ``N`` ranks
    (recursive doubling, ``log2 N' (alpha + n/L beta + n/L gamma)``, for small blocks;
    else at most ``2 (N-1) alpha + 2 (N-1)/N n/L beta + (N-1)/N n/L gamma``); scratch: the
    ``n / L``-byte block (kept for reuse, `BLOCKS_KEPT` per communicator), the ring's two
    blocks and what `allreduce_auto` needs for ``n / L`` bytes. Unequal nodes: inside the
    node `reduce_auto` and `bcast_auto` of ``n`` bytes (binomial trees for short vectors:
    ``ceil(log2 L) (alpha + n beta)`` each on the critical path, plus
    ``ceil(log2 L) n gamma`` in the reduce), between the ``N`` leaders `allreduce_auto`
    of ``n`` bytes; scratch: what those need (up to ``n`` bytes each). The sub-collectives
    get the same buffer objects on every call, so repeated calls run from their plans
    (persistent requests).
    """
    send = sendbuf if sendbuf is MPI.IN_PLACE else buffer_array("sendbuf", sendbuf)
    recv = buffer_array("recvbuf", recvbuf)
    source = operands(send, recv)
    reduce_ufunc(op, source.dtype)          # an unknown op is refused before any message
    n = allreduce_length(comm, source, recv)
    nodes = _NODES.get(comm)
    if nodes.aligned and nodes.across.size == 1:        # one node: its ranks are comm's, in order
        allreduce_ring(comm, sendbuf, recvbuf, op)
    elif nodes.aligned and nodes.node.size == 1:        # one rank per node
        allreduce_auto(comm, sendbuf, recvbuf, op)
    elif nodes.aligned:
        block = nodes.block(n, source.dtype, array_module(source))
        reduce_scatter_ring(nodes.node, recvbuf if sendbuf is MPI.IN_PLACE else sendbuf, block, op)
        allreduce_auto(nodes.across, MPI.IN_PLACE, block, op)
        allgather_ring(nodes.node, block, recvbuf)
    else:
        reduce_auto(nodes.node, sendbuf, recvbuf, op)
        if nodes.node.rank == 0:
            allreduce_auto(nodes.across, MPI.IN_PLACE, recvbuf, op)
        bcast_auto(nodes.node, MPI.IN_PLACE, recvbuf)
    return recvbuf
