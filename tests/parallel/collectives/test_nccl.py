"""NCCL through CuPy without a GPU: why it cannot run (agreed on every rank), the bootstrap over MPI.

The allreduce itself runs on a GPU only (tests/gpu_check.sh: ``mlscale run allreduce
--variants nccl --backend cupy``); here the simulated device stands in for CuPy and a
small stand-in for ``cupy.cuda.nccl``.
"""
import sys
import types

import numpy as np
import pytest

from bench.cases.allreduce import Allreduce
from kernels.backend import get_backend
from parallel.collectives.nccl import NcclCollective, nccl_of, unavailable_reason


class FakeCommunicator:
    """Records how it was made (``cupy.cuda.nccl.NcclCommunicator(size, unique id, rank)``)."""

    def __init__(self, size, unique_id, rank):
        self.made, self.destroyed = (size, unique_id, rank), False

    def destroy(self):
        self.destroyed = True


@pytest.fixture
def simulated():
    from fake_device import fake_device_backend

    return fake_device_backend()


@pytest.fixture
def with_nccl(simulated, monkeypatch):
    """The simulated CuPy with an NCCL module (``fake_cupy.cuda.nccl``) whose unique id is rank 0's draw."""
    from mpi4py import MPI

    module = types.SimpleNamespace(available=True, NcclCommunicator=FakeCommunicator, NCCL_FLOAT64=7,
                                   get_unique_id=lambda: (b"id of rank", MPI.COMM_WORLD.rank))
    monkeypatch.setitem(sys.modules, f"{simulated.xp.__name__}.cuda.nccl", module)
    return simulated


def test_no_nccl_module_or_one_that_failed_to_load_is_none(simulated, monkeypatch):
    assert nccl_of(simulated.xp) is None and nccl_of(np) is None
    monkeypatch.setitem(sys.modules, "fake_cupy.cuda.nccl", types.SimpleNamespace(available=False))
    assert nccl_of(simulated.xp) is None


@pytest.mark.mpi(min_size=1)
def test_without_nccl_every_rank_gives_the_same_reason(comm, simulated):
    assert unavailable_reason(comm, simulated.xp) == "NCCL is not available in this CuPy"


@pytest.mark.mpi(min_size=1)
def test_two_ranks_on_one_gpu_are_refused_naming_them(comm, with_nccl):
    reason = unavailable_reason(comm, with_nccl.xp)  # every rank here sees the one simulated GPU
    if comm.size == 1:
        assert reason is None
    else:
        assert reason == "NCCL needs one GPU per rank (ranks 0 and 1 share GPU 0000:00:00.0)"


@pytest.mark.mpi(min_size=1)
def test_one_gpu_per_rank_is_accepted(comm, with_nccl, monkeypatch):
    runtime = types.SimpleNamespace(**vars(with_nccl.xp.cuda.runtime))
    runtime.deviceGetPCIBusId = lambda device: f"0000:{comm.rank:02x}:00.0"
    monkeypatch.setattr(with_nccl.xp, "cuda", types.SimpleNamespace(**dict(vars(with_nccl.xp.cuda), runtime=runtime)))
    assert unavailable_reason(comm, with_nccl.xp) is None


@pytest.mark.mpi(min_size=1)
def test_the_communicator_is_made_from_rank_0s_unique_id(comm, with_nccl):
    reduce = NcclCollective(comm, with_nccl.xp)
    assert reduce._comm.made == (comm.size, (b"id of rank", 0), comm.rank)
    made = reduce._comm
    reduce.close()
    reduce.close()
    assert made.destroyed and reduce._comm is None


def test_types_nccl_cannot_sum_are_refused(with_nccl):
    from mpi4py import MPI

    reduce = NcclCollective(MPI.COMM_SELF, with_nccl.xp)
    send = with_nccl.from_host(np.zeros(4, np.complex128))
    with pytest.raises(TypeError, match="not complex128"):
        reduce.allreduce(send, with_nccl.xp.zeros(4, np.complex128))
    with pytest.raises(ValueError, match="differ"):
        reduce.allreduce(with_nccl.from_host(np.zeros(4)), with_nccl.xp.zeros(3))


def test_without_nccl_the_allreduce_cannot_be_made(simulated):
    from mpi4py import MPI

    with pytest.raises(ValueError, match="NCCL is not available"):
        NcclCollective(MPI.COMM_SELF, simulated.xp)


@pytest.mark.mpi(min_size=1)
def test_the_allreduce_suite_says_why_nccl_cannot_run(comm, simulated, with_nccl, monkeypatch):
    suite = Allreduce()
    assert suite.unavailable(comm, "nccl", get_backend("numpy")) == "NCCL sums device buffers only (--backend cupy)"
    assert suite.unavailable(comm, "ring", with_nccl) is None
    expected = None if comm.size == 1 else "NCCL needs one GPU per rank (ranks 0 and 1 share GPU 0000:00:00.0)"
    assert suite.unavailable(comm, "nccl", with_nccl) == expected
    monkeypatch.delitem(sys.modules, "fake_cupy.cuda.nccl")
    assert suite.unavailable(comm, "nccl", with_nccl) == "NCCL is not available in this CuPy"


def test_the_nccl_variant_sums_on_one_gpu(device_backend):
    """On a real GPU (the ``cupy`` param): setup, run twice, check, on the device; skipped where NCCL cannot run."""
    from mpi4py import MPI

    suite, comm = Allreduce(), MPI.COMM_SELF
    reason = suite.unavailable(comm, "nccl", device_backend)
    if reason:
        pytest.skip(reason)
    state = suite.setup(comm, 8 * 1001, "nccl", device_backend, "float64")
    try:
        suite.run(state)
        suite.run(state)
        assert suite.check(state) == 0 and device_backend.is_device_array(state.recv)
    finally:
        suite.teardown(state)


class RecordingCommunicator(FakeCommunicator):
    """Records every NCCL call as ``(name, arguments)``, the stream pointer last."""

    calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, args))


def _device_array(pointer, size, dtype="float64"):
    """What NcclCollective reads of a device array: its type, size and pointer."""
    dtype = np.dtype(dtype)
    return types.SimpleNamespace(dtype=dtype, size=size, itemsize=dtype.itemsize,
                                 data=types.SimpleNamespace(ptr=pointer))


def test_each_collective_passes_nccl_the_pointers_counts_and_root_nccl_tests_would(monkeypatch):
    """Rank 1 of 4 (no GPU: the calls are recorded): out of place, in place (a block at its offset), alltoall by
    grouped sends and receives at each peer's block."""
    from mpi4py import MPI

    stream = types.SimpleNamespace(ptr=99, synchronize=lambda: None)
    nccl = types.SimpleNamespace(available=True, NcclCommunicator=RecordingCommunicator, NCCL_FLOAT64=7,
                                 NCCL_SUM=0, NCCL_MAX=3, get_unique_id=lambda: b"id",
                                 groupStart=lambda: RecordingCommunicator.calls.append(("groupStart", ())),
                                 groupEnd=lambda: RecordingCommunicator.calls.append(("groupEnd", ())))
    xp = types.SimpleNamespace(__name__="recording_cupy",
                               cuda=types.SimpleNamespace(get_current_stream=lambda: stream))
    monkeypatch.setitem(sys.modules, "recording_cupy.cuda.nccl", nccl)
    comm = types.SimpleNamespace(rank=1, size=4, bcast=lambda value, root: b"id")
    RecordingCommunicator.calls = []
    collective = NcclCollective(comm, xp)
    whole, block = _device_array(1000, 8), _device_array(5000, 2)
    collective.allreduce(whole, _device_array(2000, 8), "max")
    collective.allgather(block, whole)
    collective.allgather(MPI.IN_PLACE, whole)
    collective.reduce_scatter(whole, block)
    collective.reduce_scatter(MPI.IN_PLACE, whole)
    collective.broadcast(MPI.IN_PLACE, whole, root=2)
    collective.reduce(whole, _device_array(2000, 8), "sum", root=3)
    collective.alltoall(whole, _device_array(2000, 8))
    assert RecordingCommunicator.calls[:7] == [
        ("allReduce", (1000, 2000, 8, 7, 3, 99)),
        ("allGather", (5000, 1000, 2, 7, 99)),
        ("allGather", (1000 + 2 * 8, 1000, 2, 7, 99)),
        ("reduceScatter", (1000, 5000, 2, 7, 0, 99)),
        ("reduceScatter", (1000, 1000 + 2 * 8, 2, 7, 0, 99)),
        ("broadcast", (1000, 1000, 8, 7, 2, 99)),
        ("reduce", (1000, 2000, 8, 7, 0, 3, 99))]
    assert RecordingCommunicator.calls[7:] == [("groupStart", ())] + [
        call for peer in range(4) for call in (("send", (1000 + 16 * peer, 2, 7, peer, 99)),
                                               ("recv", (2000 + 16 * peer, 2, 7, peer, 99)))] + [("groupEnd", ())]
    with pytest.raises(ValueError, match="do not divide over 4 ranks"):
        collective.allgather(block, _device_array(1000, 7))
    with pytest.raises(ValueError, match="out of place only"):
        collective.alltoall(MPI.IN_PLACE, whole)
