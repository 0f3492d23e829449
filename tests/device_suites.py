"""Run a suite's point on a device backend in process: setup -> run -> check, verdict agreed across ranks."""
import pytest
from mpi4py import MPI

from kernels.errors import InputError


def check_point_on_device(case, size, variant, backend, dtype, outputs, runs=2):
    """Set up ``variant`` of ``case`` on ``backend`` over COMM_WORLD, run it ``runs`` times and check it.

    Asserts on every rank that every rank's check found 0 wrong elements and that
    ``outputs(state)`` (the arrays a run leaves) are device arrays. A rank count
    the case refuses (`Case.check_ranks`) skips the test on every rank.
    """
    comm = MPI.COMM_WORLD
    try:
        case.check_ranks(comm.size, variant)
    except InputError as error:
        pytest.skip(str(error))
    state = case.setup(comm, size, variant, backend, dtype)
    try:
        for _ in range(runs):
            case.run(state)
        on_device = all(backend.is_device_array(array) for array in outputs(state))
        wrong = case.check(state)
    finally:
        case.teardown(state)
    assert comm.allgather((wrong, on_device)) == [(0, True)] * comm.size
