"""The hand-written collectives (and dp's exchange) on device arrays, on the simulated GPU with a CUDA-aware MPI.

Its MPI (`fake_cuda_aware_mpi.CudaAwareComm`) takes device arrays only: a host buffer reaching it (a staged
copy, ``np.asarray`` or a memoryview of a device array, host scratch) is a ``TypeError``. Every
algorithm runs twice on the same buffers (the second call on persistent requests) and must give
what it gives on NumPy buffers, which the other tests check against NumPy's references.
"""
import itertools

import numpy as np
import pytest
from mpi4py import MPI

from fake_cuda_aware_mpi import fake_cuda_aware_backend
from fake_device import DeviceArray
from kernels.comm import raw_comm
from kernels.distribution import block_range
from parallel.collectives import ALLREDUCE_ALGORITHMS, release_plans
from parallel.collectives.allgather import ALLGATHER_ALGORITHMS
from parallel.collectives.alltoall import ALLTOALL_ALGORITHMS
from parallel.collectives.bcast import BCAST_ALGORITHMS
from parallel.collectives.reduce import REDUCE_ALGORITHMS
from parallel.collectives.reduce_scatter import REDUCE_SCATTER_ALGORITHMS
from parallel.data.exchange import GradientExchange
from tests.mpitools import all_ranks, combination
from tests.parallel.collectives.collectives_tools import contribution, reference

DTYPES = [np.float64, np.int32, np.complex64]


def _sizes(comm, family, n):
    """(send items, receive items) of a call of ``family`` on a vector of ``n`` items."""
    start, stop = block_range(n, comm.size, comm.rank)
    return {"allgather": (stop - start, n), "reduce_scatter": (n, stop - start),
            "alltoall": (n, comm.size * (stop - start))}.get(family, (n, n))


def _run(family, algorithm, comm, sendbuf, recvbuf, op):
    if family in ("allreduce", "reduce_scatter"):
        return algorithm(comm, sendbuf, recvbuf, op=op)
    if family == "reduce":
        return algorithm(comm, sendbuf, recvbuf, op=op, root=comm.size - 1)
    if family == "bcast":
        return algorithm(comm, sendbuf, recvbuf, root=comm.size - 1)
    return algorithm(comm, sendbuf, recvbuf)


FAMILIES = {"allreduce": ALLREDUCE_ALGORITHMS, "allgather": ALLGATHER_ALGORITHMS,
            "reduce_scatter": REDUCE_SCATTER_ALGORITHMS, "alltoall": ALLTOALL_ALGORITHMS,
            "bcast": BCAST_ALGORITHMS, "reduce": REDUCE_ALGORITHMS}
CASES = [(family, name) for family, algorithms in FAMILIES.items() for name in sorted(algorithms)]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("family, name", CASES, ids=[f"{family}-{name}" for family, name in CASES])
def test_collectives_run_on_device_arrays_with_a_cuda_aware_mpi(comm, family, name):
    """Device results equal the host's, the data never leaving the device, on both calls of a plan."""
    backend = fake_cuda_aware_backend()
    device_comm = backend.comm(comm.Dup())
    mpi_comm, algorithm, xp = raw_comm(device_comm), FAMILIES[family][name], backend.xp
    ops = ["sum"] if family in ("allgather", "alltoall", "bcast") else ["sum", "max"]
    try:
        for dtype, n, op in itertools.product(DTYPES, [0, 1, comm.size + 1, 1003], ops):
            if op == "max" and np.dtype(dtype).kind == "c":
                continue
            with combination(family, name, dtype.__name__, f"n={n}", op):
                send_items, recv_items = _sizes(comm, family, n)
                host_send = contribution(comm.rank, send_items, dtype)
                host_recv = np.full(recv_items, 3, dtype)
                device_send, device_recv = xp.asarray(host_send), xp.asarray(host_recv)
                expected = _run(family, algorithm, comm, host_send, host_recv, op).copy()
                for call in range(2):              # the second on the plan's persistent requests
                    result = backend.staged(lambda s, r: _run(family, algorithm, mpi_comm, s, r, op),
                                            device_send, device_recv)
                    assert result is device_recv and isinstance(result, DeviceArray)
                    assert all_ranks(comm, np.array_equal(result.get(), expected))
    finally:
        release_plans(mpi_comm)
        mpi_comm.Free()


@pytest.mark.mpi(min_size=1)
def test_a_host_buffer_reaching_the_cuda_aware_mpi_is_refused(comm):
    """The check the tests above rely on: the simulated CUDA-aware MPI refuses host memory."""
    mpi_comm = raw_comm(fake_cuda_aware_backend().comm(comm))
    with pytest.raises(TypeError, match="left the device"):
        mpi_comm.Allreduce(MPI.IN_PLACE, np.zeros(3))


def test_device_and_host_buffers_do_not_mix():
    xp = fake_cuda_aware_backend().xp
    with pytest.raises(TypeError, match="both in host memory or both on the device"):
        ALLREDUCE_ALGORITHMS["ring"](MPI.COMM_SELF, xp.zeros(4), np.zeros(4))


@pytest.mark.mpi(min_size=1)
def test_dp_exchange_reduces_device_buckets_with_a_cuda_aware_mpi(comm):
    """`parallel.data.exchange.GradientExchange`: MPI's and every hand-written allreduce, nothing staged."""
    backend = fake_cuda_aware_backend()
    device_comm = backend.comm(comm)
    for allreduce in ("mpi", *sorted(ALLREDUCE_ALGORITHMS)):
        with combination(allreduce):
            exchange = GradientExchange(device_comm, allreduce, "full")
            grads = backend.xp.asarray(contribution(comm.rank, 1001, np.float32))
            exchange.reduce(exchange.wire(grads))
            assert all_ranks(comm, np.array_equal(grads.get(), reference(comm.size, 1001, np.float32, "sum")))
    release_plans(raw_comm(device_comm))
