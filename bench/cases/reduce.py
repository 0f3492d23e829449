"""Suite ``reduce``: MPI_Reduce against the hand-written reductions to a root of parallel.collectives.

``size`` is the bytes of the vector every rank contributes; the root (``MLSCALE_COLL_ROOT``) gets
the reduction (sum or max, ``MLSCALE_COLL_OP``); the other ranks' receive buffers are the
hand-written algorithms' workspace and are not checked. In place, MPI_IN_PLACE is the root's
(MPI's rule: the other ranks pass their buffer as the input); the hand-written algorithms take it on
every rank (`bench.families.collective` says what the collective suites share).
"""
from mpi4py import MPI

from bench.families.collective import MPI_OPS, CollectiveCase, reduced
from bench.models.reduce import ReduceModel
from parallel.collectives.reduce import REDUCE_ALGORITHMS


class Reduce(CollectiveCase):
    model_class = ReduceModel
    benchmark = collective = "reduce"
    algorithms = REDUCE_ALGORITHMS
    description = ("MPI_Reduce against the hand-written binomial-tree and Rabenseifner (reduce-scatter + gather) "
                   "reductions of parallel.collectives, and auto; to MLSCALE_COLL_ROOT, sum or max "
                   "(MLSCALE_COLL_OP), in place or out of place (MLSCALE_COLL_IN_PLACE). On GPUs, nccl is NCCL's "
                   "reduce.")

    def expected(self, comm, count, dtype, in_place, op, root):
        return reduced(count, comm.size, dtype, op) if comm.rank == root else None

    def mpi(self, comm, send, recv, op, root):
        if send is MPI.IN_PLACE and comm.rank != root:
            send = recv
        comm.Reduce(send, recv, op=MPI_OPS[op], root=root)

    def hand_written(self, function, comm, send, recv, op, root):
        function(comm, send, recv, op=op, root=root)

    def nccl_call(self, nccl, send, recv, op, root):
        nccl.reduce(send, recv, op, root)
