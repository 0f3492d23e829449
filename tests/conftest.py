"""Shared test set-up: under MPI only rank 0 reports progress in full."""
import pytest


def pytest_configure(config):
    if not config.getoption("with_mpi", default=False):
        return
    from mpi4py import MPI

    if MPI.COMM_WORLD.rank > 0:
        config.option.verbose = -2


@pytest.fixture
def comm():
    """The whole MPI job (tests marked ``mpi`` run under mpiexec)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD
