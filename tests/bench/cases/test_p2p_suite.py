"""The ``p2p`` suite's exchange: bound once in set-up, host arrays straight to MPI, device arrays staged."""
from types import SimpleNamespace

import numpy as np
import pytest

from bench.cases.p2p import PointToPoint
from kernels.backend import get_backend

SIZES = (1, 7, 1000, 65537)


class NoStaging:
    """The NumPy backend, but `staged` fails: host arrays must reach MPI without it."""

    def __init__(self):
        self._numpy = get_backend("numpy")
        self.xp, self.name = np, "numpy"

    def from_host(self, array):
        return self._numpy.from_host(array)

    def to_host(self, array):
        return self._numpy.to_host(array)

    def staged(self, *args, **kwargs):
        raise AssertionError("a NumPy exchange went through Backend.staged")


class Boxed:
    """A stand-in for a device array: MPI cannot take it, `staged` copies it through the host."""

    def __init__(self, array):
        self.array = array


class Staging:
    """A backend of `Boxed` arrays whose `staged` copies through host arrays and counts its calls."""

    name = "fake-device"

    def __init__(self):
        self.calls = 0
        self.xp = SimpleNamespace(zeros=lambda size, dtype: Boxed(np.zeros(size, dtype)))

    def from_host(self, array):
        return Boxed(array.copy())

    def to_host(self, array):
        return array.array.copy()

    def staged(self, algorithm, *arrays, outputs=None):
        self.calls += 1
        host = [array.array.copy() for array in arrays]
        result = algorithm(*host)
        for index in outputs:
            arrays[index].array[...] = host[index]
        return result


@pytest.fixture
def pairs(comm):
    """The largest even group of the job's first ranks (p2p pairs ranks)."""
    sub = comm.Split(0 if comm.rank < comm.size // 2 * 2 else 1, comm.rank)
    yield sub
    sub.Free()


def _agreed(comm, value):
    values = comm.allgather(value)
    assert values == [values[0]] * comm.size
    return values[0]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("variant", PointToPoint.variants)
@pytest.mark.parametrize("size", SIZES)
def test_host_arrays_reach_mpi_without_staging_and_check_clean(comm, pairs, variant, size):
    case, wrong, separate = PointToPoint.__new__(PointToPoint), 0, True
    if pairs.size % 2 == 0:
        state = case.setup(pairs, size, variant, NoStaging(), "uint8")
        case.run(state)
        case.run(state)
        wrong = case.check(state)
        separate = not np.shares_memory(state.send, state.recv)  # the echo comes from the own send buffer
    assert _agreed(comm, (wrong, separate)) == (0, True)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("variant", PointToPoint.variants)
def test_a_corrupted_byte_is_counted(comm, pairs, variant):
    case, wrong, checked = PointToPoint.__new__(PointToPoint), 0, False
    if pairs.size % 2 == 0:
        state = case.setup(pairs, 1000, variant, NoStaging(), "uint8")
        case.run(state)
        state.recv[999] ^= 1
        wrong = case.check(state)
        checked = variant == "latency" or not state.sender  # the bandwidth sender receives nothing
    assert comm.allgather(wrong) == comm.allgather(1 if checked else 0)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("variant", PointToPoint.variants)
def test_device_arrays_go_through_backend_staged_once_per_run(comm, pairs, variant):
    case, outcome = PointToPoint.__new__(PointToPoint), (3, 0)
    if pairs.size % 2 == 0:
        backend = Staging()
        state = case.setup(pairs, 4099, variant, backend, "uint8")
        for _ in range(3):
            case.run(state)
        outcome = (backend.calls, case.check(state))
    assert _agreed(comm, outcome) == (3, 0)
