"""A simulated GPU for testing the device code paths on a machine without one.

`fake_device_backend()` returns a `kernels.backend.Backend` named ``"cupy"``
whose array module (`FakeCupy`) behaves, for what mlscale uses, as CuPy does:

- its arrays (`DeviceArray`) live in "device memory": they mix with scalars and
  other device arrays only; a host array (any NumPy array of one or more
  elements) given to one of its functions or ufuncs raises ``TypeError``, as
  CuPy refuses implicit host-device transfers;
- ``xp.asnumpy`` / ``array.get()`` move to the host and ``xp.asarray`` /
  ``array.set()`` move to the device, as in CuPy;
- MPI is not CUDA-aware (``device_buffers_to_mpi`` False), so every buffer
  goes through host staging (`kernels.comm.device`).

A suite that passes its checks on this backend and leaves its results as
`DeviceArray` computes on the device with no silent host fallback; only a GPU
can show that the code is also fast there (tests/gpu_check.sh).
"""
import types

import numpy as np

from kernels.backend import Backend


class DeviceArray(np.ndarray):
    """A NumPy array standing for a CuPy array in device memory."""

    def get(self, out=None):
        """Copy to the host (into ``out`` when given), as ``cupy.ndarray.get``."""
        host = self.view(np.ndarray)
        if out is None:
            return host.copy()
        np.copyto(out, host)
        return out

    def set(self, host):
        """Copy host array ``host`` into this array, as ``cupy.ndarray.set``."""
        _refuse_device(host)
        np.copyto(self.view(np.ndarray), host)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        inputs = tuple(_unwrap(value) for value in inputs)
        outputs = kwargs.get("out")
        if outputs:
            kwargs["out"] = tuple(_unwrap(value) for value in outputs)
        result = _wrap(getattr(ufunc, method)(*inputs, **kwargs))
        if outputs and len(outputs) == 1 and outputs[0] is not None:
            return outputs[0]   # the out array itself, as NumPy and CuPy return it (``y += x`` keeps ``y``)
        return result

    def __array_function__(self, func, types, args, kwargs):
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))


def _refuse_device(value):
    if isinstance(value, DeviceArray):
        raise TypeError("set() takes a host array")


def _unwrap(value):
    """Device arrays as plain arrays, refusing host arrays (CuPy's implicit-transfer rule)."""
    if isinstance(value, DeviceArray):
        return value.view(np.ndarray)
    if isinstance(value, np.ndarray) and value.ndim > 0:
        raise TypeError(f"host array of shape {value.shape} mixed with device arrays "
                        f"(move it with xp.asarray first)")
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(item) for item in value)
    if isinstance(value, dict):
        return {key: _unwrap(item) for key, item in value.items()}
    return value


def _wrap(value):
    if isinstance(value, np.ndarray) and not isinstance(value, DeviceArray):
        return value.view(DeviceArray)
    if isinstance(value, tuple):
        return tuple(_wrap(item) for item in value)
    if isinstance(value, list):
        return [_wrap(item) for item in value]
    return value


class _FakeModule(types.ModuleType):
    """NumPy's functions on device arrays: host arrays refused, results on the device."""

    def __init__(self, name, host_module):
        super().__init__(name)
        self._host_module = host_module

    def __getattr__(self, name):
        attribute = getattr(self._host_module, name)
        if isinstance(attribute, types.ModuleType):
            return _FakeModule(f"{self.__name__}.{name}", attribute)
        if not callable(attribute) or isinstance(attribute, type):
            return attribute

        def on_device(*args, **kwargs):
            return _wrap(attribute(*_unwrap(args), **_unwrap(kwargs)))

        return on_device


class FakeMemoryPool:
    """The device memory pool's interface the harness reads (``cupy.get_default_memory_pool()``):
    it counts nothing; ``held`` stands for the bytes the pool holds, ``freed`` counts ``free_all_blocks``."""

    def __init__(self):
        self.held, self.freed = 0, 0

    def free_all_blocks(self):
        self.held, self.freed = 0, self.freed + 1

    def total_bytes(self):
        return self.held


class FakeCupy(_FakeModule):
    """The array module of the simulated device (``xp``)."""

    ndarray = DeviceArray
    __version__ = "0.0-simulated"
    cuda = types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(synchronize=lambda: None),
        Device=lambda: types.SimpleNamespace(id=0),
        runtime=types.SimpleNamespace(getDeviceProperties=lambda device: {"name": b"Simulated GPU"},
                                      runtimeGetVersion=lambda: 12040,
                                      deviceGetPCIBusId=lambda device: "0000:00:00.0"))

    def __init__(self):
        super().__init__("fake_cupy", np)
        self.pool = FakeMemoryPool()

    def get_default_memory_pool(self):
        """The simulated pool (`FakeMemoryPool`), one per module, as CuPy's default pool."""
        return self.pool

    @staticmethod
    def asarray(array, dtype=None):
        """Move to the device (a copy of host data, as ``cupy.asarray``)."""
        if isinstance(array, DeviceArray):
            return array if dtype is None else array.astype(dtype, copy=False)
        return np.array(array, dtype=dtype).view(DeviceArray)

    array = asarray

    @staticmethod
    def asnumpy(array):
        """Move to the host."""
        return array.get() if isinstance(array, DeviceArray) else np.asarray(array)

    @staticmethod
    def ascontiguousarray(array, dtype=None):
        """Contiguous copy (or the array itself), on the device (of ``dtype`` when given)."""
        return np.ascontiguousarray(_unwrap(array), dtype=dtype).view(DeviceArray)


def fake_device_backend():
    """A `Backend` named ``"cupy"`` on the simulated device, staging every MPI buffer."""
    return Backend("cupy", FakeCupy(), device_buffers_to_mpi=False, empty_pinned=np.empty)
