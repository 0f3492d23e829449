"""Communicators for the parallel routines: wrappers of one protocol, and one byte-counting convention.

Every parallel routine takes ``comm``: an mpi4py communicator, or a wrapper of
one. The wrappers follow one protocol (`kernels.comm.wrapper.CommWrapper`):
``wrapped`` is the communicator under them, whatever they do not handle is that
communicator's own, and they nest (a counting wrapper over a device one counts
what the device one stages). Callers reach through them in two ways only:

- `raw_comm(comm)`: the mpi4py communicator under any wrappers (a plain one is
  its own): for ``MPI.Comm.Compare``, derived datatypes, persistent requests on
  host buffers;
- `backend_of(comm)`: the `kernels.backend.Backend` whose device buffers
  ``comm`` hands to MPI (synchronised, staged through host memory without a
  CUDA-aware MPI), or None for a plain communicator.

Modules:

`wrapper`
    `CommWrapper`, `raw_comm`, `backend_of`, `is_transfer` / `is_buffer_call`.
`device`
    `DeviceComm` (``Backend.comm(comm)``): device buffers synchronised and handed
    to a CUDA-aware MPI or staged; `StagedRequest`, `wait_all`, `poll_all`. A
    buffer call it cannot stage is a `TypeError`.
`counting`
    `CountingComm`: the transfers the SVMs, tensor parallelism and MoE make, with
    MPI's signatures, counted by `traffic`'s convention and timed; any other
    transfer is a `TypeError`. `CountedCommunication`: ``bytes_sent`` and
    ``comm_seconds`` of a layer's ``counter``.
`traffic`
    One convention for the bytes a rank sends: `BUS_FACTORS`, `bus_bytes`,
    `TrafficCounter`.

This package and `traffic` import without initialising MPI (`mlscale report`
needs no MPI job); `device` and `counting` import mpi4py.
"""
from kernels.comm.wrapper import CommWrapper, backend_of, raw_comm

__all__ = ["CommWrapper", "backend_of", "raw_comm"]
