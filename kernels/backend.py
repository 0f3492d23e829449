"""Array backends: NumPy on the host, CuPy on NVIDIA GPUs.

``get_backend(name, comm)`` returns a `Backend`: the array module (``xp``) and how
its buffers reach MPI. NumPy arrays go to MPI directly. CuPy arrays go directly
too when the MPI library is CUDA-aware (declared with ``MLSCALE_CUDA_AWARE=1``,
since MPI offers no portable query), after the current stream is synchronised;
otherwise they are staged through host memory, and the staging copies are part
of what is timed. Two ways serve the two kinds of code:

- `Backend.comm` wraps a communicator so that every MPI call of a parallel
  routine synchronises and stages its own buffers (`kernels.comm.device`); the
  routine computes with `array_module` (``xp``) of its inputs, so one code path
  serves NumPy and CuPy;
- `Backend.staged` stages a whole call (a hand-written collective whose inner
  loop would otherwise copy at every step).
"""
import os

import numpy as np

from kernels.errors import InputError

BACKENDS = ("numpy", "cupy")



def array_module(*arrays):
    """The array module (``numpy``, ``cupy``...) of the first device array in ``arrays``, else NumPy.

    Known by the array's type alone, whatever backends exist: a CuPy array (its type's module is
    ``cupy...``) gives ``cupy.get_array_module``'s answer; any other array gives its array-API
    namespace (``__array_namespace__``); NumPy arrays, scalars and other objects give NumPy.
    """
    for array in arrays:
        module = _module_of(array)
        if module is not np:
            return module
    return np


def _module_of(array):
    array_type = type(array)
    if array_type is np.ndarray:
        return np
    if array_type.__module__.partition(".")[0] == "cupy":
        import cupy

        return cupy.get_array_module(array)
    namespace = getattr(array, "__array_namespace__", None)
    return np if namespace is None else namespace()


class Backend:
    """An array module and the rules for handing its buffers to MPI.

    Attributes
    ----------
    name : str
        ``"numpy"`` or ``"cupy"``.
    xp : module
        ``numpy`` or ``cupy``.
    device_buffers_to_mpi : bool
        True when MPI takes this backend's arrays as they are (always for NumPy;
        for CuPy only with a CUDA-aware MPI).
    """

    def __init__(self, name, xp, device_buffers_to_mpi, empty_pinned=None):
        self.name = name
        self.xp = xp
        self.device_buffers_to_mpi = device_buffers_to_mpi
        self._empty_pinned = empty_pinned
        self._staging = {}

    def comm(self, comm):
        """``comm`` itself on the host; a `kernels.comm.device.DeviceComm` for device buffers."""
        if self.xp is np:
            return comm
        from kernels.comm.device import DeviceComm

        return DeviceComm(comm, self)

    def is_device_array(self, array):
        """True for an array in device memory (never on the host backend)."""
        return self.xp is not np and isinstance(array, self.xp.ndarray)

    def synchronize(self):
        """Wait for queued device work (a no-op on the host)."""
        if self.xp is not np:
            self.xp.cuda.get_current_stream().synchronize()

    def to_host(self, array):
        """Return ``array`` as a NumPy array (a copy for device arrays)."""
        return self.xp.asnumpy(array) if self.is_device_array(array) else np.asarray(array)

    def from_host(self, array):
        """Return a NumPy ``array`` in this backend's memory."""
        return self.xp.asarray(array)

    def staged(self, algorithm, *arrays, outputs=None):
        """Call ``algorithm(*arrays)`` with buffers MPI can take; return what it returns.

        The arrays are synchronised and passed as they are when MPI takes them.
        Otherwise each is copied into a pinned host buffer (kept for the next call
        of the same shape), the algorithm runs on the host copies, and the arrays
        listed in ``outputs`` (indices; default all) are copied back to the device.
        """
        self.synchronize()
        if self.device_buffers_to_mpi:
            return algorithm(*arrays)
        host = [self._kept_pinned(slot, a) for slot, a in enumerate(arrays)]
        result = algorithm(*host)
        for index in range(len(arrays)) if outputs is None else outputs:
            self.copy_to_device(arrays[index], host[index])
        return result

    def _kept_pinned(self, slot, array):
        key = (slot, array.shape, array.dtype.str)
        if key not in self._staging:
            self._staging[key] = self._empty_pinned(array.shape, array.dtype)
        return self.xp.ascontiguousarray(array).get(out=self._staging[key])

    def host_buffer(self, array, copy):
        """A pinned host array shaped as device ``array``, holding its values when ``copy``."""
        host = self._empty_pinned(array.shape, array.dtype)
        return self.xp.ascontiguousarray(array).get(out=host) if copy else host

    def copy_to_device(self, device, host):
        """Copy host array ``host`` into device array ``device`` (same shape)."""
        if device.flags.c_contiguous:
            device.set(host)
        else:
            device[...] = self.xp.asarray(host)


def get_backend(name="numpy", comm=None):
    """Return the `Backend` called ``name``.

    For ``"cupy"``, each rank selects the GPU ``local_rank % device_count``, where
    ``local_rank`` is its rank among the ranks of ``comm`` on the same node.

    Raises
    ------
    InputError
        Unknown name, CuPy not installed, or no GPU visible.
    """
    if name == "numpy":
        return Backend("numpy", np, True)
    if name != "cupy":
        raise InputError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    local_rank = 0  # found before anything can fail, as every rank must take part
    if comm is not None:
        from mpi4py import MPI

        node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED)
        local_rank = node_comm.rank
        node_comm.Free()
    try:
        import cupy
    except ImportError:
        raise InputError("backend 'cupy' needs CuPy: pip install 'mlscale[cuda12]' or 'mlscale[cuda13]', "
                         "as nvidia-smi's CUDA Version says") from None
    try:
        device_count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        device_count = 0
    if device_count == 0:
        raise InputError("backend 'cupy': no CUDA GPU is visible on this node")
    cupy.cuda.Device(local_rank % device_count).use()
    cuda_aware = os.environ.get("MLSCALE_CUDA_AWARE", "0") == "1"
    if cuda_aware:
        from mpi4py import MPI

        query = getattr(MPI, "Query_cuda_support", None)
        if query is not None and not query():
            raise InputError("MLSCALE_CUDA_AWARE=1, but this MPI library says it is not CUDA-aware")
    import cupyx

    return Backend("cupy", cupy, cuda_aware, cupyx.empty_pinned)
