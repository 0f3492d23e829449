"""The hand-written collectives over NCCL's point-to-point wire (``ring+nccl``...) on the simulated GPU.

A stand-in for ``cupy.cuda.nccl`` moves each group's messages with MPI between the pointers it is
given (one GPU per rank, by distinct bus ids); on a real GPU the same code runs over NCCL
(tests/gpu_check.sh).
"""
import ctypes
import sys
import types

import numpy as np
import pytest
from mpi4py import MPI

from fake_device import DeviceArray, fake_device_backend
from kernels.errors import InputError
from parallel.collectives import ALLREDUCE_ALGORITHMS, release_plans
from parallel.collectives.nccl_wire import NCCL_WIRE_ALGORITHMS, nccl_wire, split_wire
from parallel.data.exchange import GradientExchange
from tests.mpitools import all_ranks, combination
from tests.parallel.collectives.collectives_tools import contribution, reference


def _nccl_over_mpi(comm):
    """A ``cupy.cuda.nccl`` whose grouped send / recv run as MPI messages on ``comm`` (bytes at the pointers)."""
    group = []

    def buffer(pointer, count):
        return (ctypes.c_ubyte * count).from_address(pointer)

    class Communicator:
        def __init__(self, size, unique_id, rank):
            assert (size, rank) == (comm.size, comm.rank)

        def send(self, pointer, count, kind, peer, stream):
            group.append(lambda: comm.Isend(buffer(pointer, count), peer, 7))

        def recv(self, pointer, count, kind, peer, stream):
            group.append(lambda: comm.Irecv(buffer(pointer, count), peer, 7))

        def destroy(self):
            """Nothing to free."""

    def group_end():
        MPI.Request.Waitall([post() for post in group])
        group.clear()

    return types.SimpleNamespace(available=True, NCCL_UINT8=0, NcclCommunicator=Communicator,
                                 get_unique_id=lambda: b"id", groupStart=lambda: None, groupEnd=group_end)


@pytest.fixture
def wired(comm, monkeypatch):
    """The simulated GPU with NCCL over MPI, one (simulated) GPU per rank."""
    backend = fake_device_backend()
    xp = backend.xp
    monkeypatch.setitem(sys.modules, f"{xp.__name__}.cuda.nccl", _nccl_over_mpi(comm))
    runtime = types.SimpleNamespace(**dict(vars(xp.cuda.runtime), deviceGetPCIBusId=lambda device: f"{comm.rank:x}"))
    monkeypatch.setattr(xp, "cuda", types.SimpleNamespace(**dict(vars(xp.cuda), runtime=runtime)))
    return backend


@pytest.mark.mpi(min_size=1)
def test_allreduce_algorithms_over_the_nccl_wire_match_numpy(comm, wired):
    dup = comm.Dup()
    try:
        for name in NCCL_WIRE_ALGORITHMS:
            wire = nccl_wire(dup, wired, name + "+nccl")
            for dtype, n, op in [(np.float64, 1003, "sum"), (np.int32, comm.size + 1, "max"),
                                 (np.complex128, 7, "sum"), (np.float32, 0, "sum")]:
                with combination(name, dtype.__name__, f"n={n}", op):
                    recv = wired.xp.asarray(contribution(comm.rank, n, dtype))
                    for _ in range(2):      # a plan's second call: no persistent requests on the wire
                        recv[...] = wired.xp.asarray(contribution(comm.rank, n, dtype))
                        result = ALLREDUCE_ALGORITHMS[name](wire, MPI.IN_PLACE, recv, op=op)
                        assert isinstance(result, DeviceArray)
                        assert all_ranks(comm, np.array_equal(result.get(), reference(comm.size, n, dtype, op)))
            release_plans(wire)
            wire.close()
    finally:
        dup.Free()


@pytest.mark.mpi(min_size=1)
def test_dp_exchange_over_the_nccl_wire_sums_the_bucket(comm, wired):
    exchange = GradientExchange(wired.comm(comm), "ring+nccl", "full")
    grads = wired.xp.asarray(contribution(comm.rank, 1001, np.float32))
    exchange.reduce(exchange.wire(grads))
    assert all_ranks(comm, np.array_equal(grads.get(), reference(comm.size, 1001, np.float32, "sum")))


@pytest.mark.mpi(min_size=1)
def test_the_allreduce_suites_wire_variants_run_and_check_on_the_device(comm, wired):
    """``ring+nccl``... as the sweep runs them: set-up, runs, the check against NumPy, teardown; uneven counts,
    in place too."""
    from bench.registry import case_class, get_case
    from bench.settings import resolve

    for name, in_place in ((name, place) for name in NCCL_WIRE_ALGORITHMS for place in ("0", "1")):
        case = get_case("allreduce", resolve(case_class("allreduce").declared_settings, (f"COLL_IN_PLACE={in_place}",),
                                             {}, "allreduce"))
        assert case.unavailable(comm, name + "+nccl", wired) is None and name + "+nccl" in case.variants
        state = case.setup(comm, 8 * (comm.size * 3 + 1), name + "+nccl", wired, "float64")
        try:
            for _ in range(2):
                case.run(state)
            with combination(name, f"in_place={in_place}"):
                assert all_ranks(comm, case.check(state) == 0)
        finally:
            case.teardown(state)


def test_nccl_wire_is_refused_on_the_host_in_one_line():
    with pytest.raises(InputError, match=r"^allreduce 'ring\+nccl' sends over NCCL, on GPUs only: run it with "
                                         r"--backend cupy$"):
        GradientExchange(MPI.COMM_SELF, "ring+nccl", "full")


def test_nccl_wire_without_nccl_says_why():
    with pytest.raises(InputError, match="NCCL is not available in this CuPy"):
        GradientExchange(fake_device_backend().comm(MPI.COMM_SELF), "auto+nccl", "full")


def test_wire_names_split():
    assert split_wire("ring+nccl") == ("ring", True) and split_wire("ring") == ("ring", False)
