"""Host reads of device results for the SVM solvers (NumPy arrays pass through unchanged).

The solvers compute with ``xp = kernels.backend.array_module(X)``; the few
values a Python loop or an MPI message needs on the host are read here, in one
transfer per call on a device (each read synchronises the device stream).
"""
import numpy as np


def fetch(xp, *values):
    """The scalars ``values`` (0-d arrays or NumPy scalars of ``xp``) as Python floats.

    On the host each is converted; on a device they are stacked and copied to
    the host in one transfer (one synchronisation instead of one per value).
    """
    if xp is np:
        return [float(value) for value in values]
    return xp.stack([xp.asarray(value, dtype=xp.float64) for value in values]).get().tolist()


def to_host(array):
    """``array`` as a NumPy array (a copy of a device array, the array itself on the host)."""
    return array.get() if hasattr(array, "get") and hasattr(array, "shape") else np.asarray(array)
