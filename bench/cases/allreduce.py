"""Suite ``allreduce``: MPI_Allreduce against the hand-written algorithms of parallel.collectives.

Every rank contributes a vector of ``size`` bytes (out of place, SUM). Inputs are
small integers, so every algorithm's sum is exact whatever its order, and the
check compares element by element with the NumPy sum of all ranks' inputs.
"""
import functools
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from bench.case import Case, bandwidth_metrics
from bench.models.allreduce import AllreduceModel
from kernels.errors import InputError
from parallel.collectives import ALLREDUCE_ALGORITHMS, release_plans
from parallel.collectives.nccl import NcclCollective, unavailable_reason

SEED = 2024


def rank_input(rank, count, dtype):
    """The input vector of ``rank``: integers in [0, 8) drawn from a per-rank seed."""
    return np.random.default_rng([SEED, rank]).integers(0, 8, count).astype(dtype)


@dataclass
class _State:
    comm: object
    backend: object
    dtype: str
    algorithm: object
    send: object
    recv: object
    nccl: object = None


class Allreduce(Case):
    model_class = AllreduceModel
    benchmark = "allreduce"
    size_help = "message size in bytes per rank (out of place, SUM)"
    default_sizes = "8:16M"
    metrics_help = "algbw = size / time; busbw = algbw * 2(p-1)/p (nccl-tests), GB/s"
    description = ("MPI_Allreduce against the hand-written ring, recursive-doubling, Rabenseifner and binomial-tree "
                   "algorithms of parallel.collectives, and auto (one of them by size, as MPICH chooses). Every rank "
                   "sums a vector of size bytes out of place, the same buffers every run (the algorithms run them on "
                   "persistent requests from the second run); the inputs are small integers, so every order of "
                   "summation gives the exact sum the check expects. On GPUs, nccl is the library reference "
                   "(NCCL through CuPy, one GPU per rank, bootstrapped over MPI; the others pass device buffers to "
                   "MPI through host staging unless MPI is CUDA-aware).")

    def iterations(self, size):
        return (50, 5) if size <= (1 << 20) else (20, 3)

    def setup(self, comm, size, variant, backend, dtype):
        itemsize = np.dtype(dtype).itemsize
        if size % itemsize:
            raise InputError(f"allreduce size {size} is not a whole number of {dtype} elements")
        count = size // itemsize
        send = backend.from_host(rank_input(comm.rank, count, dtype))
        recv = backend.xp.zeros(count, dtype)
        if variant == "nccl":
            return _State(comm, backend, dtype, None, send, recv, NcclCollective(comm, backend.xp))
        algorithm = _mpi_allreduce if variant == "mpi" else ALLREDUCE_ALGORITHMS[variant]
        return _State(comm, backend, dtype, functools.partial(algorithm, comm), send, recv)

    def unavailable(self, comm, variant, backend):
        """As `Case.unavailable`; ``nccl`` on a device also needs NCCL in CuPy and one GPU per rank."""
        reason = super().unavailable(comm, variant, backend)
        if reason is None and variant == "nccl":
            return unavailable_reason(comm, backend.xp)
        return reason

    def run(self, state):
        if state.nccl is not None:  # device buffers straight to NCCL, never staged
            state.nccl.allreduce(state.send, state.recv)
        else:
            state.backend.staged(state.algorithm, state.send, state.recv, outputs=(1,))

    def teardown(self, state):
        """Free the plans (persistent requests) kept for this point's buffers, and the NCCL communicator."""
        release_plans(state.comm)
        if state.nccl is not None:
            state.nccl.close()

    def check(self, state):
        count = state.recv.size
        expected = sum(rank_input(rank, count, state.dtype) for rank in range(state.comm.size))
        return int(np.count_nonzero(state.backend.to_host(state.recv) != expected))

    def metrics(self, state, seconds):
        return bandwidth_metrics("allreduce", state.recv.nbytes, state.comm.size, seconds)


def _mpi_allreduce(comm, send, recv):
    comm.Allreduce(send, recv, op=MPI.SUM)
    return recv
