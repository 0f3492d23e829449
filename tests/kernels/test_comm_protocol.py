"""`kernels.comm`: `raw_comm` and `backend_of` through any wrappers, and `CountingComm`'s counts and refusals."""
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

from fake_device import DeviceArray, fake_device_backend
from kernels.backend import get_backend
from kernels.comm import backend_of, raw_comm
from kernels.comm.counting import CountingComm


@pytest.mark.mpi
def test_a_plain_communicator_is_its_own_raw_comm_and_has_no_backend():
    comm = MPI.COMM_WORLD
    assert raw_comm(comm) is comm and backend_of(comm) is None
    host = get_backend("numpy").comm(comm)   # the host backend hands out the communicator itself
    assert host is comm and backend_of(host) is None


@pytest.mark.mpi
def test_wrappers_nest_and_both_functions_reach_through_all_of_them():
    world, device = MPI.COMM_WORLD, fake_device_backend()
    staged = device.comm(world)
    counted = CountingComm(world)
    nested = CountingComm(CountingComm(staged))
    assert [raw_comm(comm) for comm in (staged, counted, nested)] == [world] * 3
    assert (backend_of(staged), backend_of(counted), backend_of(nested)) == (device, None, device)
    assert (nested.rank, nested.size) == (world.rank, world.size)


@pytest.mark.mpi
def test_counting_counts_each_call_by_the_traffic_convention():
    comm = CountingComm(MPI.COMM_WORLD)
    p, rank, n = comm.size, comm.rank, 6
    expected = 0.0 if p == 1 else None
    comm.Allreduce(MPI.IN_PLACE, np.ones(n))
    comm.Bcast(np.ones(n), root=0)
    comm.Allgatherv(np.ones(2), [np.empty(2 * p), ([2] * p, list(range(0, 2 * p, 2)))])
    comm.Reduce_scatter(np.ones(n * p), np.empty(n), recvcounts=[n] * p)
    comm.Alltoall(np.ones(3 * p), np.empty(3 * p))
    send_counts = np.arange(p) + 1   # one item to rank 0, two to rank 1...
    comm.Alltoallv([np.ones(int(send_counts.sum())), (send_counts, np.cumsum(send_counts) - send_counts)],
                   [np.empty(p * (rank + 1)), ([rank + 1] * p, [(rank + 1) * r for r in range(p)])])
    if p > 1:
        expected = (2 * (p - 1) / p * 8 * n + 8 * n + (p - 1) / p * 8 * 2 * p + (p - 1) / p * 8 * n * p
                    + 3 * (p - 1) * 8 + (send_counts.sum() - send_counts[rank]) * 8)
    assert comm.bytes_sent == pytest.approx(expected) and comm.seconds >= 0
    comm.reset()
    assert (comm.bytes_sent, comm.seconds) == (0.0, 0.0)


@pytest.mark.mpi(min_size=2)
def test_counting_counts_the_sender_of_a_message_only():
    comm = CountingComm(MPI.COMM_WORLD)
    rows = np.arange(8.0)
    if comm.rank == 0:
        comm.Send(rows, 1, tag=3)
    elif comm.rank == 1:
        received = np.empty(8)
        comm.Recv(received, 0, 3)
        assert received.tolist() == rows.tolist()
    assert comm.bytes_sent == (rows.nbytes if comm.rank == 0 else 0)


@pytest.mark.mpi
def test_counting_over_a_device_comm_stages_and_counts():
    device = fake_device_backend()
    comm = CountingComm(device.comm(MPI.COMM_WORLD))
    total = device.xp.asarray(np.full(4, comm.rank + 1.0))
    assert comm.sum_in_place(total) is total
    p = comm.size
    assert isinstance(total, DeviceArray) and total.get().tolist() == [p * (p + 1) / 2] * 4
    assert comm.bytes_sent == pytest.approx(2 * (p - 1) / p * total.nbytes)


@pytest.mark.mpi
@pytest.mark.parametrize("name", ["Alltoallw", "Isend", "Allgather", "bcast", "allgather", "Neighbor_alltoall"])
def test_counting_refuses_transfers_it_does_not_count(name):
    comm = CountingComm(MPI.COMM_WORLD)
    with pytest.raises(TypeError, match=f"^CountingComm does not count {name}; use one of Send, "):
        getattr(comm, name)


@pytest.mark.mpi
def test_counting_passes_everything_else_through():
    comm = CountingComm(MPI.COMM_WORLD)
    comm.Barrier()
    assert comm.Get_rank() == MPI.COMM_WORLD.rank and comm.Iprobe(source=MPI.ANY_SOURCE, tag=99) is False


def test_the_traffic_convention_imports_without_starting_mpi():
    check = ("import sys, kernels.comm, kernels.comm.traffic; "
             "assert 'mpi4py.MPI' not in sys.modules, 'kernels.comm imported MPI'")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
