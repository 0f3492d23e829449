"""Array backends: NumPy always; CuPy where a GPU and CuPy are present (skipped elsewhere)."""
import numpy as np
import pytest

from kernels.backend import array_module, get_backend
from kernels.errors import InputError


def _cupy_or_skip():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no CUDA GPU visible")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA GPU visible")
    return cupy


def test_numpy_backend_hands_arrays_to_mpi_as_they_are():
    backend = get_backend("numpy")
    array = np.arange(5.0)
    assert backend.device_buffers_to_mpi
    assert backend.staged(lambda a: a is array, array) is True
    assert backend.to_host(array) is array


def test_unknown_backend_is_an_input_error():
    with pytest.raises(InputError, match="unknown backend 'tpu'"):
        get_backend("tpu")


def test_cupy_missing_or_no_gpu_is_one_clear_error():
    try:
        import cupy  # noqa: F401 - only its absence matters here
    except ImportError:
        with pytest.raises(InputError, match="needs CuPy"):
            get_backend("cupy")
        return
    pytest.skip("CuPy is installed here")


@pytest.mark.parametrize("cuda_aware", ["0", "1"])
def test_cupy_staging_writes_results_back_to_the_device(monkeypatch, cuda_aware):
    cupy = _cupy_or_skip()
    monkeypatch.setenv("MLSCALE_CUDA_AWARE", cuda_aware)
    backend = get_backend("cupy")
    source = cupy.arange(6, dtype=cupy.float64)
    target = cupy.zeros(6, dtype=cupy.float64)

    def double_into(src, dst):
        dst[...] = 2 * src
        return type(dst).__module__.split(".")[0]

    where = backend.staged(double_into, source, target)
    assert where == ("cupy" if cuda_aware == "1" else "numpy")
    assert cupy.asnumpy(target).tolist() == [0, 2, 4, 6, 8, 10]


def test_device_backend_knows_its_arrays_and_moves_them(device_backend):
    xp = device_backend.xp
    device = device_backend.from_host(np.arange(6.0).reshape(2, 3))
    assert device_backend.is_device_array(device) and array_module(device) is xp
    assert array_module(np.zeros(2)) is np and not get_backend("numpy").is_device_array(np.zeros(2))
    assert isinstance(device_backend.to_host(device), np.ndarray)
    column = xp.zeros((2, 3))[:, 1]  # a strided view: copied back element by element
    device_backend.copy_to_device(column, np.array([7.0, 8.0]))
    assert device_backend.to_host(column).tolist() == [7.0, 8.0]
    host = device_backend.host_buffer(device, copy=True)
    assert isinstance(host, np.ndarray) and host.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_device_backend_stages_a_whole_call(device_backend):
    source = device_backend.from_host(np.arange(4.0))
    target = device_backend.xp.zeros(4)

    def double_into(src, dst):
        assert isinstance(src, np.ndarray) and not device_backend.is_device_array(src)
        dst[...] = 2 * src

    device_backend.staged(double_into, source, target, outputs=(1,))
    assert device_backend.to_host(target).tolist() == [0, 2, 4, 6]


def test_simulated_device_refuses_host_arrays_as_cupy_does():
    from fake_device import fake_device_backend

    xp = fake_device_backend().xp
    with pytest.raises(TypeError, match="host array"):
        xp.zeros(3) + np.ones(3)
    with pytest.raises(TypeError, match="host array"):
        xp.exp(np.ones(3))


def test_array_module_knows_arrays_by_their_type_alone(monkeypatch):
    """No Backend needed: CuPy arrays by their type's module, others by ``__array_namespace__``, else NumPy."""
    import sys
    import types

    from fake_device import FAKE_CUPY

    cupy = types.SimpleNamespace(get_array_module=lambda *arrays: "cupy's answer")
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    cupy_array = type("ndarray", (), {"__module__": "cupy._core.core"})()
    assert array_module(cupy_array) == "cupy's answer"
    assert array_module(1.0, None, np.float32(2), [1.0], np.zeros(2), FAKE_CUPY.asarray([1.0])) is FAKE_CUPY
    assert array_module(1.0, np.float64(1), "text", np.zeros((2, 2))) is np and array_module() is np


def test_the_device_report_is_one_line(capsys):
    """``python -m kernels.device_report``: the GPU, cuBLAS and NCCL in one line; or why not, exit status 2."""
    from kernels.device_report import main

    try:
        main()
    except SystemExit as exit_:
        assert exit_.code == 2
        message = capsys.readouterr().err
        assert message.startswith("device report: backend 'cupy'") and message.count("\n") == 1
        return
    report = capsys.readouterr().out
    assert report.count("\n") == 1 and "cuBLAS ok" in report
