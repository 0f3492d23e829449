"""Suite ``alltoall``: MPI_Alltoall(v) against the hand-written all-to-alls of parallel.collectives.

``size`` is the bytes each rank sends in all: its vector of ``n`` items in ``p`` blocks by
``block_range``, block ``j`` to rank ``j`` (so rank ``j`` receives ``p`` blocks of
``block_range(n, p, j)``'s length, in rank order: MPI_Alltoallv when ``n`` does not divide, as a
mixture of experts' uneven routing). In place (MPI_IN_PLACE) needs equal blocks
(`bench.families.collective` says what the collective suites share).
"""
import numpy as np
from mpi4py import MPI

from bench.families.collective import CollectiveCase, counts_and_offsets, own_block, rank_input
from bench.models.alltoall import AlltoallModel
from kernels.errors import InputError
from parallel.collectives.alltoall import ALLTOALL_ALGORITHMS


class Alltoall(CollectiveCase):
    model_class = AlltoallModel
    benchmark = collective = "alltoall"
    algorithms = ALLTOALL_ALGORITHMS
    equal_blocks = True
    description = ("MPI_Alltoall (MPI_Alltoallv for counts that do not divide) against the hand-written pairwise, "
                   "Bruck and scattered (every Isend / Irecv at once) all-to-alls of parallel.collectives, and auto; "
                   "in place (equal blocks only) or out of place (MLSCALE_COLL_IN_PLACE). On GPUs, nccl is NCCL's "
                   "grouped send / recv.")

    def receive_count(self, comm, count):
        block = own_block(comm, count)
        return comm.size * (block.stop - block.start)

    def check_point(self, comm, count, variant, in_place):
        super().check_point(comm, count, variant, in_place)
        if in_place and count % comm.size:
            raise InputError(f"alltoall in place needs equal blocks: {count} items do not divide over "
                             f"{comm.size} ranks (give sizes of a multiple of ranks x itemsize, or "
                             f"MLSCALE_COLL_IN_PLACE=0)")
        if in_place and variant == "nccl":
            raise InputError("nccl alltoall runs out of place only (MLSCALE_COLL_IN_PLACE=0)")

    def expected(self, comm, count, dtype, in_place, op, root):
        block = own_block(comm, count)
        return np.concatenate([rank_input(rank, count, dtype)[block] for rank in range(comm.size)])

    def mpi(self, comm, send, recv, op, root):
        p = comm.size
        if send is MPI.IN_PLACE or send.size % p == 0:  # in place has equal blocks (check_point)
            comm.Alltoall(send, recv)
            return
        counts, offsets = counts_and_offsets(send.size, p)
        block = recv.size // p
        comm.Alltoallv([send, (counts, offsets)], [recv, ([block] * p, [block * i for i in range(p)])])

    def hand_written(self, function, comm, send, recv, op, root):
        function(comm, send, recv)

    def nccl_call(self, nccl, send, recv, op, root):
        nccl.alltoall(send, recv)
