"""Suite ``reduce_scatter``: MPI_Reduce_scatter against the hand-written reduce-scatters of parallel.collectives.

``size`` is the bytes of the vector every rank reduces; rank ``r`` gets block ``block_range(n, p, r)``
of the reduction (`bench.families.collective` says what the collective suites share). In place the
result lands where each variant puts it: MPI at the start of ``recvbuf`` (MPI's rule), the
hand-written algorithms and NCCL at the block's own offset.
"""
from mpi4py import MPI

from bench.families.collective import MPI_OPS, CollectiveCase, counts_and_offsets, own_block, reduced
from bench.models.reduce_scatter import ReduceScatterModel
from parallel.collectives.reduce_scatter import REDUCE_SCATTER_ALGORITHMS


class ReduceScatter(CollectiveCase):
    model_class = ReduceScatterModel
    benchmark = collective = "reduce_scatter"
    algorithms = REDUCE_SCATTER_ALGORITHMS
    equal_blocks = True
    description = ("MPI_Reduce_scatter (counts by block_range) against the hand-written ring and recursive-halving "
                   "reduce-scatters of parallel.collectives (pairwise exchange on rank counts that are not powers of "
                   "two), and auto; sum or max (MLSCALE_COLL_OP), in place or out of place (MLSCALE_COLL_IN_PLACE). "
                   "On GPUs, nccl is NCCL's reduceScatter.")

    def receive_count(self, comm, count):
        block = own_block(comm, count)
        return block.stop - block.start

    def expected(self, comm, count, dtype, in_place, op, root):
        return reduced(count, comm.size, dtype, op)[own_block(comm, count)]

    def received(self, state, host_recv):
        if not state.in_place:
            return host_recv
        block = own_block(state.comm, state.count)
        return host_recv[:block.stop - block.start] if state.variant == "mpi" else host_recv[block]

    def mpi(self, comm, send, recv, op, root):
        counts, _ = counts_and_offsets(recv.size if send is MPI.IN_PLACE else send.size, comm.size)
        comm.Reduce_scatter(send, recv, counts, op=MPI_OPS[op])

    def hand_written(self, function, comm, send, recv, op, root):
        function(comm, send, recv, op=op)

    def nccl_call(self, nccl, send, recv, op, root):
        nccl.reduce_scatter(send, recv, op)
