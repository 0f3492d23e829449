"""`kernels.comm.device.DeviceComm` on the simulated device: every buffer staged, results back on the device."""
import numpy as np
import pytest
from mpi4py import MPI

from fake_device import DeviceArray, fake_device_backend
from kernels.comm import raw_comm
from kernels.comm.device import StagedRequest, poll_all, wait_all

pytestmark = pytest.mark.mpi


@pytest.fixture
def device():
    backend = fake_device_backend()
    return backend, backend.comm(MPI.COMM_WORLD)


def _on_device(backend, host):
    return backend.xp.asarray(host)


def test_blocking_calls_write_back_to_the_device(device):
    backend, comm = device
    rank, size = comm.rank, comm.size
    send = _on_device(backend, np.full(5, rank, np.float64))
    recv = backend.xp.zeros(5)
    comm.Sendrecv(send, (rank + 1) % size, 0, recv, (rank - 1) % size, 0)
    assert isinstance(recv, DeviceArray) and recv.get().tolist() == [(rank - 1) % size] * 5
    total = backend.xp.zeros(5)
    comm.Allreduce(send, total, op=MPI.SUM)
    assert total.get().tolist() == [size * (size - 1) / 2] * 5
    in_place = _on_device(backend, np.full(3, rank + 1.0))
    comm.Allreduce(MPI.IN_PLACE, in_place)
    assert in_place.get().tolist() == [size * (size + 1) / 2] * 3
    root_data = _on_device(backend, np.arange(4.0) if rank == 0 else np.zeros(4))
    comm.Bcast(root_data, root=0)
    assert root_data.get().tolist() == [0, 1, 2, 3]


def test_vector_specification_and_uneven_counts(device):
    backend, comm = device
    counts = [rank % 3 for rank in range(comm.size)]  # some ranks send nothing
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
    mine = _on_device(backend, np.full(counts[comm.rank], comm.rank, np.int64))
    gathered = backend.xp.zeros(sum(counts), np.int64)
    comm.Allgatherv(mine, [gathered, (counts, displs), MPI.INT64_T])
    expected = np.repeat(np.arange(comm.size), counts)
    assert gathered.get().tolist() == expected.tolist()


def test_non_blocking_receives_complete_on_wait(device):
    backend, comm = device
    rank, size = comm.rank, comm.size
    send = _on_device(backend, np.full(7, rank, np.int32))
    first, second = backend.xp.zeros(7, np.int32), backend.xp.zeros(7, np.int32)
    requests = [comm.Irecv(first, (rank - 1) % size, 1), comm.Isend(send, (rank + 1) % size, 1)]
    assert all(isinstance(request, StagedRequest) for request in requests)
    wait_all(requests)
    assert first.get().tolist() == [(rank - 1) % size] * 7
    again = [comm.Irecv(second, (rank + 1) % size, 2), comm.Isend(send, (rank - 1) % size, 2)]
    while not poll_all(again):
        pass
    assert second.get().tolist() == [(rank + 1) % size] * 7
    single = backend.xp.zeros(2)
    request = comm.Iallreduce(_on_device(backend, np.ones(2)), single)
    request.Wait()
    assert single.get().tolist() == [size, size]


def test_sub_communicators_stay_device_aware(device):
    backend, comm = device
    half = comm.Split(comm.rank % 2, comm.rank)
    value = _on_device(backend, np.ones(1))
    half.Allreduce(MPI.IN_PLACE, value)
    assert value.get()[0] == half.size and half == raw_comm(half)
    half.Free()


def test_persistent_requests_refuse_device_staging(device):
    _, comm = device
    with pytest.raises(TypeError, match="Send_init cannot stage"):
        comm.Send_init


@pytest.mark.parametrize("name", ["Alltoallw", "Neighbor_alltoall", "Ineighbor_allgatherv", "Allgather_init",
                                  "Isendrecv_replace"])
def test_buffer_calls_it_does_not_stage_are_refused_in_one_line(device, name):
    _, comm = device
    with pytest.raises(TypeError, match=f"^DeviceComm does not synchronise or stage {name}: .*raw_comm") as error:
        getattr(comm, name)
    assert "\n" not in str(error.value)


def test_other_attributes_are_the_communicators_own(device):
    _, comm = device
    raw = raw_comm(comm)
    assert (comm.rank, comm.size, comm.Get_size()) == (raw.rank, raw.size, raw.size)
    comm.Barrier()
    assert comm.allgather(comm.rank) == list(range(comm.size))
    cart = comm.Create_cart([comm.size])
    assert cart.Get_coords(cart.rank) == [comm.rank] and raw_comm(cart) is not cart
    cart.Free()


def test_host_arrays_pass_unchanged(device):
    _, comm = device
    host = np.full(3, comm.rank, np.float64)
    comm.Allreduce(MPI.IN_PLACE, host)
    assert host.tolist() == [comm.size * (comm.size - 1) / 2] * 3
