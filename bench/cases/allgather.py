"""Suite ``allgather``: MPI_Allgather(v) against the hand-written allgathers of parallel.collectives.

``size`` is the bytes of the gathered vector; rank ``r`` contributes its block
``block_range(n, p, r)`` (`bench.families.collective` says what the collective suites share).
"""
import numpy as np

from bench.families.collective import CollectiveCase, counts_and_offsets, own_block, rank_input
from bench.models.allgather import AllgatherModel
from parallel.collectives.allgather import ALLGATHER_ALGORITHMS


def _blocks(comm, count, dtype):
    counts, _ = counts_and_offsets(count, comm.size)
    return [rank_input(rank, counts[rank], dtype) for rank in range(comm.size)]


class Allgather(CollectiveCase):
    model_class = AllgatherModel
    benchmark = collective = "allgather"
    algorithms = ALLGATHER_ALGORITHMS
    equal_blocks = True
    description = ("MPI_Allgather (MPI_Allgatherv for counts that do not divide) against the hand-written ring, "
                   "recursive doubling and Bruck allgathers of parallel.collectives, and auto (one of them by size "
                   "and rank count, as MPICH chooses); in place or out of place (MLSCALE_COLL_IN_PLACE). On GPUs, "
                   "nccl is NCCL's allGather.")

    def send_input(self, comm, count, dtype):
        return _blocks(comm, count, dtype)[comm.rank]

    def in_place_input(self, comm, count, dtype):
        vector = np.zeros(count, dtype)
        vector[own_block(comm, count)] = self.send_input(comm, count, dtype)
        return vector

    def expected(self, comm, count, dtype, in_place, op, root):
        return np.concatenate(_blocks(comm, count, dtype)) if count else np.zeros(0, dtype)

    def mpi(self, comm, send, recv, op, root):
        if recv.size % comm.size == 0:
            comm.Allgather(send, recv)
        else:
            comm.Allgatherv(send, [recv, counts_and_offsets(recv.size, comm.size)])

    def hand_written(self, function, comm, send, recv, op, root):
        function(comm, send, recv)

    def nccl_call(self, nccl, send, recv, op, root):
        nccl.allgather(send, recv)
