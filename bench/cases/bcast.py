"""Suite ``bcast``: MPI_Bcast against the hand-written broadcasts of parallel.collectives.

``size`` is the bytes of the vector the root (``MLSCALE_COLL_ROOT``) sends to every rank.
Out of place (nccl-tests' default) the root's send buffer is copied into its receive buffer and
broadcast from there by MPI's variant (MPI_Bcast has one buffer): the copy is part of its time
(`bench.families.collective` says what the collective suites share).
"""
import numpy as np
from mpi4py import MPI

from bench.families.collective import CollectiveCase, rank_input
from bench.models.bcast import BcastModel
from parallel.collectives.bcast import BCAST_ALGORITHMS


class Bcast(CollectiveCase):
    model_class = BcastModel
    benchmark = "bcast"
    collective = "broadcast"
    algorithms = BCAST_ALGORITHMS
    description = ("MPI_Bcast against the hand-written binomial-tree, scatter + ring allgather (van de Geijn) and "
                   "pipelined-chain broadcasts of parallel.collectives, and auto; from MLSCALE_COLL_ROOT, in place "
                   "or out of place (MLSCALE_COLL_IN_PLACE). On GPUs, nccl is NCCL's broadcast.")

    def send_input(self, comm, count, dtype):
        root = self.model.config["root"]
        return rank_input(root, count, dtype) if comm.rank == root else np.zeros(count, dtype)

    def expected(self, comm, count, dtype, in_place, op, root):
        return rank_input(root, count, dtype)

    def mpi(self, comm, send, recv, op, root):
        if send is not MPI.IN_PLACE and comm.rank == root:
            recv[...] = send
        comm.Bcast(recv, root=root)

    def hand_written(self, function, comm, send, recv, op, root):
        function(comm, send, recv, root=root)

    def nccl_call(self, nccl, send, recv, op, root):
        nccl.broadcast(send, recv, root)
