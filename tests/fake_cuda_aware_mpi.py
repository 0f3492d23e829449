"""The simulated GPU (`fake_device`) with a CUDA-aware MPI, for the paths that hand device arrays to MPI.

`fake_cuda_aware_backend()` is the simulated device declared CUDA-aware (``device_buffers_to_mpi``
True); its communicators (`CudaAwareComm`, under the `kernels.comm.device.DeviceComm`) take device
arrays only: a host buffer reaching MPI (a staged copy, ``np.asarray`` or a memoryview of a device
array, host scratch) is a ``TypeError``, which proves that nothing went through host memory.
"""
import numpy as np
from mpi4py import MPI

from fake_device import FAKE_CUPY, DeviceArray
from kernels.backend import Backend


class CudaAwareBackend(Backend):
    """The simulated device with a CUDA-aware MPI: its communicators are `CudaAwareComm`."""

    def comm(self, comm):
        return super().comm(CudaAwareComm(comm))


def fake_cuda_aware_backend():
    """A `Backend` named ``"cupy"`` on the simulated device whose MPI takes device arrays (no staging)."""
    return CudaAwareBackend("cupy", FAKE_CUPY, device_buffers_to_mpi=True, empty_pinned=np.empty)


def _device_buffer(value):
    """A buffer argument for MPI: a device array passed on (its "device pointer"), a host array refused."""
    if isinstance(value, DeviceArray):
        return value.view(np.ndarray)
    if isinstance(value, (np.ndarray, memoryview, bytes, bytearray)):
        raise TypeError(f"host buffer ({type(value).__name__}) given to the CUDA-aware MPI of the simulated device: "
                        f"the data left the device")
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (np.ndarray, memoryview)):
        return type(value)([_device_buffer(value[0]), *value[1:]])
    return value


def _takes_device_buffers(name):
    def call(self, *args, **kwargs):
        args = [_device_buffer(value) for value in args]
        kwargs = {key: _device_buffer(value) for key, value in kwargs.items()}
        return getattr(super(CudaAwareComm, self), name)(*args, **kwargs)

    call.__name__ = name
    return call


def _keeps_type(name):
    def call(self, *args, **kwargs):
        return CudaAwareComm(getattr(super(CudaAwareComm, self), name)(*args, **kwargs))

    call.__name__ = name
    return call


class CudaAwareComm(MPI.Intracomm):
    """An intracommunicator of a CUDA-aware MPI on the simulated device: every buffer call takes device
    arrays only (a host buffer is a ``TypeError``); the communicators it splits off are ones too."""


for _name in ("Send", "Ssend", "Isend", "Issend", "Recv", "Irecv", "Sendrecv", "Isendrecv", "Sendrecv_replace",
              "Send_init", "Recv_init", "Bcast", "Ibcast", "Allreduce", "Iallreduce", "Reduce", "Ireduce",
              "Allgather", "Iallgather", "Allgatherv", "Iallgatherv", "Alltoall", "Ialltoall", "Alltoallv",
              "Ialltoallv", "Reduce_scatter", "Ireduce_scatter", "Reduce_scatter_block", "Gather", "Gatherv",
              "Scatter", "Scatterv"):
    setattr(CudaAwareComm, _name, _takes_device_buffers(_name))
for _name in ("Split", "Split_type"):
    setattr(CudaAwareComm, _name, _keeps_type(_name))
