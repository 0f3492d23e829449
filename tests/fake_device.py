"""A simulated GPU for testing the device code paths on a machine without one.

`fake_device_backend()` returns a `kernels.backend.Backend` named ``"cupy"``
whose array module (`FakeCupy`) behaves, for what mlscale uses, as CuPy does:

- its arrays (`DeviceArray`) live in "device memory": they mix with scalars and
  other device arrays only; a host array (any NumPy array of one or more
  elements) given to one of its functions or ufuncs raises ``TypeError``, as
  CuPy refuses implicit host-device transfers;
- ``xp.asnumpy`` / ``array.get()`` move to the host and ``xp.asarray`` /
  ``array.set()`` move to the device, as in CuPy;
- like CuPy's, its arrays' ``flags`` have no ``writeable``, and its module is
  their array namespace (``__array_namespace__``: `kernels.backend.array_module`
  knows them by their type alone);
- the module counts what the device would do (``xp.counts``, a `collections.Counter`):
  ``launches`` (ufuncs, functions, advanced indexing, element writes, conversions,
  elementwise kernels) and ``host_reads`` (``get``, ``asnumpy``, ``float`` / ``int`` /
  ``bool`` / ``item`` / ``tolist`` of a device array), so tests can bound them;
- ``xp.ElementwiseKernel(in_params, out_params, operation, name)`` is one launch of
  the NumPy twin named in `KERNEL_TWINS` (the CUDA source itself runs on a GPU only);
- MPI is not CUDA-aware (``device_buffers_to_mpi`` False), so every buffer
  goes through host staging (`kernels.comm.device`);
  `fake_cuda_aware_mpi.fake_cuda_aware_backend` declares it CUDA-aware instead.

A suite that passes its checks on this backend and leaves its results as
`DeviceArray` computes on the device with no silent host fallback; only a GPU
can show that the code is also fast there (tests/gpu_check.sh).
"""
import collections
import importlib
import types

import numpy as np

from kernels.backend import Backend

#: The NumPy twin ("module:function") the simulated device runs for each elementwise kernel, by kernel name.
KERNEL_TWINS = {"smo_gain": "svm.solver.pair_update:gain_on_host",
                "smo_pair_update": "svm.solver.pair_update:update_on_host"}


class DeviceArray(np.ndarray):
    """A NumPy array standing for a CuPy array in device memory."""

    def __array_namespace__(self, api_version=None):
        return FAKE_CUPY

    @property
    def flags(self):
        """CuPy's flags: contiguity and ownership only (no ``writeable``)."""
        flags = self.view(np.ndarray).flags
        return types.SimpleNamespace(c_contiguous=flags.c_contiguous, f_contiguous=flags.f_contiguous,
                                     owndata=flags.owndata)

    @property
    def data(self):
        """Its memory, as CuPy's ``MemoryPointer``: ``ptr`` (here a host address standing for a device one)."""
        return types.SimpleNamespace(ptr=self.view(np.ndarray).ctypes.data)

    def __getitem__(self, key):
        if _advanced(key):
            _count("launches")
        return super().__getitem__(key)

    def __setitem__(self, key, value):
        _count("launches")
        super().__setitem__(key, value)

    def __float__(self):
        _count("host_reads")
        return float(self.view(np.ndarray))

    def __int__(self):
        _count("host_reads")
        return int(self.view(np.ndarray))

    def __bool__(self):
        _count("host_reads")
        return bool(self.view(np.ndarray))

    def item(self, *args):
        _count("host_reads")
        return self.view(np.ndarray).item(*args)

    def tolist(self):
        _count("host_reads")
        return self.view(np.ndarray).tolist()

    def get(self, out=None):
        """Copy to the host (into ``out`` when given), as ``cupy.ndarray.get``."""
        _count("host_reads")
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
        _count("launches")
        inputs = tuple(_unwrap(value) for value in inputs)
        outputs = kwargs.get("out")
        if outputs:
            kwargs["out"] = tuple(_unwrap(value) for value in outputs)
        result = _wrap(getattr(ufunc, method)(*inputs, **kwargs))
        if outputs and len(outputs) == 1 and outputs[0] is not None:
            return outputs[0]   # the out array itself, as NumPy and CuPy return it (``y += x`` keeps ``y``)
        return result

    def __array_function__(self, func, types, args, kwargs):
        _count("launches")
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))


def _count(what):
    FAKE_CUPY.counts[what] += 1


def _advanced(key):
    """Whether indexing by ``key`` is advanced (a gather kernel on CuPy), not a view."""
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(item, (np.ndarray, list)) for item in keys)


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
            _count("launches")
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
        get_current_stream=lambda: types.SimpleNamespace(ptr=0, synchronize=lambda: None),
        Device=lambda: types.SimpleNamespace(id=0),
        runtime=types.SimpleNamespace(getDeviceProperties=lambda device: {"name": b"Simulated GPU"},
                                      runtimeGetVersion=lambda: 12040,
                                      deviceGetPCIBusId=lambda device: "0000:00:00.0"))

    def __init__(self):
        super().__init__("fake_cupy", np)
        self.pool = FakeMemoryPool()
        self.counts = collections.Counter()

    @staticmethod
    def ElementwiseKernel(in_params, out_params, operation, name="kernel", **options):  # noqa: N802 (CuPy's name)
        """An elementwise kernel: on the simulated device, one launch of its NumPy twin (`KERNEL_TWINS`)."""
        module, function = KERNEL_TWINS[name].split(":")
        twin = getattr(importlib.import_module(module), function)

        def launch(*args):
            _count("launches")
            return _wrap(twin(*_unwrap(args)))

        return launch

    def get_default_memory_pool(self):
        """The simulated pool (`FakeMemoryPool`), one per module, as CuPy's default pool."""
        return self.pool

    @staticmethod
    def asarray(array, dtype=None):
        """Move to the device (a copy of host data, as ``cupy.asarray``)."""
        if isinstance(array, DeviceArray):
            if dtype is None or np.dtype(dtype) == array.dtype:
                return array
            _count("launches")
            return array.astype(dtype)
        return np.array(array, dtype=dtype).view(DeviceArray)

    array = asarray

    @staticmethod
    def asnumpy(array):
        """Move to the host (one read, counted by ``get``)."""
        return array.get() if isinstance(array, DeviceArray) else np.asarray(array)

    @staticmethod
    def ascontiguousarray(array, dtype=None):
        """Contiguous copy (or the array itself), on the device (of ``dtype`` when given)."""
        return np.ascontiguousarray(_unwrap(array), dtype=dtype).view(DeviceArray)


#: The simulated device's array module (one, as ``cupy`` is one module).
FAKE_CUPY = FakeCupy()


def fake_device_backend():
    """A `Backend` named ``"cupy"`` on the simulated device, staging every MPI buffer."""
    return Backend("cupy", FAKE_CUPY, device_buffers_to_mpi=False, empty_pinned=np.empty)
