"""The exchanges of tensor parallelism, by MPI or by one family of hand-written collectives.

A tensor-parallel layer exchanges activations three ways (`parallel.tensor.tensor_parallel`):
an allreduce (Megatron), and under sequence parallelism an allgather and a reduce-scatter of
row blocks: rank ``r`` holds rows ``block_range(T, p, r)`` of a ``(T, width)`` matrix, so its
block has ``block_counts(T, p)[r] * width`` items (not `block_range` over ``T * width``): the
hand-written algorithms run as their v-variants (``counts``).

``collectives`` (`TENSOR_COLLECTIVES`) names the algorithms of all three:

- ``mpi``: ``MPI_Allreduce``, ``MPI_Allgatherv``, ``MPI_Reduce_scatter`` (MPI's own choice);
- ``ring``: the ring allreduce, allgather and reduce-scatter (`parallel.collectives.ring`),
  the allreduce being the ring reduce-scatter then the ring allgather;
- ``recursive``: recursive halving and doubling: Rabenseifner's allreduce, the
  recursive-doubling allgather, the recursive-halving reduce-scatter (pairwise exchange off
  powers of two), the allreduce again being the reduce-scatter then the allgather;
- ``auto``: each collective's ``auto`` (by size and rank count, as MPICH chooses).

Whatever the algorithm, `kernels.comm.counting.CountingComm` counts each exchange as the MPI
call it replaces (`kernels.comm.traffic`: ``2 (p-1)/p n`` per allreduce, ``(p-1)/p n`` per
allgather or reduce-scatter of ``n`` bytes) and times it. On a device communicator the
hand-written algorithms run on host copies of the device buffers (`CountingComm.run`: staged
as one call). Cost per exchange: the algorithm's (in its module); for the ring ``2 (p-1)
alpha + 2 (p-1)/p n beta`` per allreduce, ``(p-1) alpha + (p-1)/p n beta`` per allgather or
reduce-scatter.
"""
import functools

import numpy as np
from mpi4py import MPI

from kernels.backend import array_module
from kernels.comm import raw_comm
from kernels.distribution import block_counts, block_offsets
from kernels.errors import InputError
from parallel.collectives import ALLREDUCE_ALGORITHMS
from parallel.collectives.allgather import ALLGATHER_ALGORITHMS
from parallel.collectives.reduce_scatter import REDUCE_SCATTER_ALGORITHMS

#: The hand-written families by name: (allreduce, allgather, reduce-scatter) algorithm names.
FAMILIES = {
    "ring": ("ring", "ring", "ring"),
    "recursive": ("rabenseifner", "recursive_doubling", "recursive_halving"),
    "auto": ("auto", "auto", "auto"),
}
TENSOR_COLLECTIVES = ("mpi",) + tuple(FAMILIES)


def _in_place_allreduce(allreduce, comm, array):
    return allreduce(comm, MPI.IN_PLACE, array)


class TensorExchange:
    """The three exchanges of tensor-parallel layers on ``counter`` (a `CountingComm`), by ``collectives``.

    Parameters
    ----------
    counter : kernels.comm.counting.CountingComm
        The tensor-parallel group, counted (shared by a block's layers).
    collectives : str
        A name of `TENSOR_COLLECTIVES` (another: `InputError`).
    """

    def __init__(self, counter, collectives="mpi"):
        if collectives not in TENSOR_COLLECTIVES:
            raise InputError(f"tensor parallelism: unknown collectives {collectives!r}; choose from "
                             f"{', '.join(TENSOR_COLLECTIVES)}")
        self.counter, self.collectives = counter, collectives
        if collectives != "mpi":
            allreduce, allgather, reduce_scatter = FAMILIES[collectives]
            self._allreduce = functools.partial(_in_place_allreduce, ALLREDUCE_ALGORITHMS[allreduce])
            self._allgather = ALLGATHER_ALGORITHMS[allgather]
            self._reduce_scatter = REDUCE_SCATTER_ALGORITHMS[reduce_scatter]

    def sum_in_place(self, array):
        """Sum the contiguous ``array`` over the ranks in place (one allreduce, counted); return it."""
        if self.collectives == "mpi":
            return self.counter.sum_in_place(array)
        if not array.flags.c_contiguous:
            raise ValueError("sum_in_place needs a contiguous array")
        self.counter.run("allreduce", array.nbytes, self._allreduce, array.reshape(-1))
        return array

    def allgather_rows(self, local):
        """Concatenate every rank's row block ``local`` (rows ``block_range(T, p, rank)``) into ``(T, ...)``.

        One allgather, after an ``Allgather`` of the row counts that checks the layout (an
        `InputError` on every rank otherwise), timed but not counted.
        """
        counter, ranks = self.counter, self.counter.size
        counts = np.empty(ranks, dtype=np.int64)
        with counter.timed():
            raw_comm(counter).Allgather(np.array([local.shape[0]], dtype=np.int64), counts)
        total = int(counts.sum())
        rows = block_counts(total, ranks)
        if counts.tolist() != rows:
            raise InputError(f"sequence parallel: the ranks hold {counts.tolist()} tokens; expected the "
                             f"block_range layout {rows} of {total} tokens")
        width = int(np.prod(local.shape[1:]))
        xp = array_module(local)
        full = xp.empty((total,) + local.shape[1:], dtype=local.dtype)
        local = xp.ascontiguousarray(local)
        if self.collectives == "mpi":
            displs = [offset * width for offset in block_offsets(total, ranks)]
            counter.Allgatherv(local, [full, ([c * width for c in rows], displs)])
        else:
            blocks = tuple(c * width for c in rows)
            counter.run("allgather", full.nbytes, functools.partial(self._allgather, counts=blocks),
                        local.reshape(-1), full.reshape(-1), outputs=(1,))
        return full

    def reduce_scatter_rows(self, full):
        """Sum ``full`` (T, ...) over the ranks and return this rank's rows ``block_range(T, p, rank)``
        (one reduce-scatter)."""
        counter = self.counter
        rows = block_counts(full.shape[0], counter.size)
        width = int(np.prod(full.shape[1:]))
        xp = array_module(full)
        local = xp.empty((rows[counter.rank],) + full.shape[1:], dtype=full.dtype)
        full = xp.ascontiguousarray(full)
        if self.collectives == "mpi":
            counter.Reduce_scatter(full, local, recvcounts=[c * width for c in rows], op=MPI.SUM)
        else:
            blocks = tuple(c * width for c in rows)
            counter.run("reduce_scatter", full.nbytes, functools.partial(self._reduce_scatter, counts=blocks),
                        full.reshape(-1), local.reshape(-1), outputs=(1,))
        return local
