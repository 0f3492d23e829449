"""Shared test set-up: under MPI only rank 0 reports progress in full and prints the MPI banner."""
import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """On ranks other than 0: terse progress, and pytest-mpi without its end-of-run banner.

    pytest-mpi's plugin (registered in its own ``pytest_configure``, which runs
    before this one) prints an "MPI Information" section on every rank; here it is
    swapped on the other ranks for a copy that prints nothing at the end, and
    keeps its markers and ``min_size`` skips.
    """
    if not config.getoption("with_mpi", default=False):
        return
    from mpi4py import MPI

    if MPI.COMM_WORLD.rank == 0:
        return
    config.option.verbose = -2
    from pytest_mpi import MPIPlugin

    class QuietMPIPlugin(MPIPlugin):
        def pytest_terminal_summary(self, terminalreporter, exitstatus, *args):
            """Nothing: rank 0 prints the banner for the whole job."""

    manager = config.pluginmanager
    for plugin in [plugin for plugin in manager.get_plugins() if type(plugin) is MPIPlugin]:
        manager.unregister(plugin)
        manager.register(QuietMPIPlugin())


def pytest_ignore_collect(collection_path, config):
    """Under MPI (``--with-mpi -m mpi``), a test module with no ``mark.mpi`` in its text is not imported: its
    tests would all be deselected, and importing it (scikit-learn, matplotlib...) costs every rank of every
    launch."""
    if not config.getoption("with_mpi", default=False) or collection_path.suffix != ".py" \
            or not collection_path.name.startswith("test_"):
        return None
    return True if "mark.mpi" not in collection_path.read_text() else None


@pytest.fixture
def comm():
    """The whole MPI job (tests marked ``mpi`` run under mpiexec)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _cupy_backend_or_skip():
    try:
        import cupy
    except ImportError:
        pytest.skip("CuPy is not installed (pip install 'mlscale[cuda12]' or '[cuda13]' on a GPU machine)")
    try:
        visible = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        visible = 0
    if visible == 0:
        pytest.skip("no CUDA GPU is visible")
    from kernels.backend import get_backend

    return get_backend("cupy")


@pytest.fixture(params=["simulated", "cupy"])
def device_backend(request):
    """A device `kernels.backend.Backend`: the simulated GPU of `fake_device` (always),
    and CuPy on a real GPU (skipped with the reason when there is none).

    Suite tests run their device path on it: the simulated one proves that the
    data stays in device arrays and every MPI buffer is staged; the real one runs
    the same code on the GPU (tests/gpu_check.sh runs it there).
    """
    if request.param == "cupy":
        return _cupy_backend_or_skip()
    from fake_device import fake_device_backend

    return fake_device_backend()
