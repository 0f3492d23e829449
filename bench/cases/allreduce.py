"""Suite ``allreduce``: MPI_Allreduce against the hand-written algorithms of parallel.collectives.

Every rank contributes a vector of ``size`` bytes and gets the reduction of all of them (sum by
default; ``MLSCALE_COLL_OP=max``), out of place by default (``MLSCALE_COLL_IN_PLACE=1``:
MPI_IN_PLACE). What the collective suites share (inputs, checks, in place, NCCL, metrics) is in
`bench.families.collective`.
"""
from bench.families.collective import MPI_OPS, CollectiveCase, reduced
from bench.models.allreduce import AllreduceModel
from parallel.collectives import ALLREDUCE_ALGORITHMS


class Allreduce(CollectiveCase):
    model_class = AllreduceModel
    benchmark = collective = "allreduce"
    algorithms = ALLREDUCE_ALGORITHMS
    size_help = "message size in bytes per rank (the vector every rank reduces)"
    metrics_help = "algbw = size / time; busbw = algbw * 2(p-1)/p (nccl-tests), GB/s"
    description = ("MPI_Allreduce against the hand-written ring, recursive-doubling, Rabenseifner, binomial-tree and "
                   "two-level (hierarchical: inside each node, then between the nodes) algorithms of "
                   "parallel.collectives, and auto (one of them by size, as MPICH chooses). Every rank reduces a "
                   "vector of size bytes (sum, or max by MLSCALE_COLL_OP), out of place or in place "
                   "(MLSCALE_COLL_IN_PLACE), the same buffers every run (the algorithms run them on persistent "
                   "requests from the second run); the inputs are small integers, so every order of summation gives "
                   "the exact sum the check expects. On GPUs, nccl is the library reference (NCCL through CuPy, one "
                   "GPU per rank, bootstrapped over MPI; the others pass device buffers to MPI through host staging "
                   "unless MPI is CUDA-aware).")

    def expected(self, comm, count, dtype, in_place, op, root):
        return reduced(count, comm.size, dtype, op)

    def mpi(self, comm, send, recv, op, root):
        comm.Allreduce(send, recv, op=MPI_OPS[op])

    def hand_written(self, function, comm, send, recv, op, root):
        function(comm, send, recv, op=op)

    def nccl_call(self, nccl, send, recv, op, root):
        nccl.allreduce(send, recv, op)
