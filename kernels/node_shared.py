"""Blocks in node-shared memory: the ranks of one node read each other's blocks in place.

`share_on_node` moves one operand's block into an MPI-3 shared-memory window
(``MPI_Win_allocate_shared``) over a communicator whose ranks all sit on one node
(``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)``), and gives every rank a NumPy view
of every other rank's block. A kernel then takes a panel from its owner's view:
no message, no copy by MPI, nothing for MPI to progress (MPICH moves a
non-blocking message only inside MPI calls, so a panel sent that way is copied
while the receiver waits; see `kernels.gemm_lookahead`).

The window lives as long as the `NodeBlocks`: the matrix's ``local`` becomes the
view of this rank's part of the window (its values copied once), so writes to
the block are what the peers read. Synchronisation is the writers' part, so that
readers (the kernels) wait for nothing: every write to a shared block happens
inside ``with blocks.writing():`` entered by every rank of the communicator
together, which no rank enters before all have finished reading and no rank
leaves before all writes are visible (``MPI_Win_sync``, barrier, ``MPI_Win_sync``:
the shared-memory pattern of MPI-3's unified model, inside one
``MPI_Win_lock_all`` epoch held from creation to `NodeBlocks.free`). Host memory only.
"""
from contextlib import contextmanager

import numpy as np
from mpi4py import MPI

from kernels.backend import array_module
from kernels.errors import InputError


def on_one_node(comm):
    """Whether every rank of ``comm`` shares this rank's node (the same answer on every rank; collective)."""
    if comm.size == 1:
        return True
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.size == comm.size
    finally:
        node.Free()


class NodeBlocks:
    """One block per rank of ``comm`` (all on one node) in one shared-memory window.

    Made by `share_on_node`; ``blocks[r]`` is rank ``r``'s block, readable by
    every rank of ``comm``, and ``blocks[comm.rank]`` is the matrix's ``local``.
    Call `free` on every rank of ``comm`` when done (it is collective).

    Parameters
    ----------
    comm : MPI.Comm
        Ranks of one node, each passing its own block (shapes may differ; one
        dtype); every rank calls this together.
    block : numpy.ndarray
        This rank's block, copied into its part of the window.

    Notes
    -----
    Creation: an ``allgather`` of the shapes, the window (one segment of
    ``sum(block sizes)`` bytes on the node, no data moved between ranks) and one
    `writing` fence; afterwards reading a peer's block costs no message at all.
    Each `writing` is two ``MPI_Win_sync`` and two barriers (``2 log2 p``
    messages of no data per rank).
    """

    def __init__(self, comm, block):
        self.comm = comm
        shapes = comm.allgather(block.shape)
        self.window = MPI.Win.Allocate_shared(block.nbytes, block.itemsize, comm=comm)
        self.window.Lock_all(MPI.MODE_NOCHECK)
        self.blocks = [np.ndarray(shape, block.dtype, buffer=self.window.Shared_query(rank)[0])
                       for rank, shape in enumerate(shapes)]
        with self.writing():
            self.blocks[comm.rank][...] = block

    @contextmanager
    def writing(self):
        """Fence writes to the blocks (collective over ``comm``): wait until every rank has
        stopped reading, let the body write, then make every write visible to every rank."""
        self._synchronize()
        yield self.blocks
        self._synchronize()

    def _synchronize(self):
        self.window.Sync()
        self.comm.Barrier()
        self.window.Sync()

    def free(self):
        """Release the window (collective); the blocks must not be used afterwards."""
        self.window.Unlock_all()
        self.window.Free()
        self.blocks = []


def share_on_node(matrix, comm):
    """Move ``matrix.local`` into node-shared memory over ``comm``; a `NodeBlocks`, or None.

    None (nothing moved) when ``comm`` has one rank or spans several nodes: the
    same answer on every rank of ``comm``. Collective over ``comm``.

    Parameters
    ----------
    matrix : DistMatrix
        Its ``local`` block (host memory) is copied into the window and replaced by
        the window's view.
    comm : MPI.Comm
        The ranks that read each other's blocks (e.g. a grid row or column).

    Raises
    ------
    InputError
        For a block in device memory (no host window can hold it).
    """
    if array_module(matrix.local) is not np:
        raise InputError("node-shared blocks hold host memory; a device block cannot be shared this way")
    if comm.size == 1 or not on_one_node(comm):
        return None
    shared = NodeBlocks(comm, matrix.local)
    matrix.local = shared.blocks[comm.rank]
    return shared
