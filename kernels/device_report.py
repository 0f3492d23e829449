"""One line saying whether this node can run ``--backend cupy``: ``python -m kernels.device_report``.

It selects the GPU as `kernels.backend.get_backend` does and tries what the suites need, each by use:
a cuBLAS GEMM (``cupy-cuda12x[ctk]`` brings the CUDA libraries; the bare wheel has no cuBLAS) and
NCCL (``nvidia-nccl-cu12`` / ``-cu13``). For example::

    GPU 0 of 1: NVIDIA H200, CUDA runtime 13.0, CuPy 14.2.0; cuBLAS ok; NCCL 2.28.9

Exit status 0 when cuBLAS works (NCCL only names its version or why it is missing), else 2 with
the reason in one line on stderr (no CuPy, no GPU or driver, a library that does not load).
"""
import sys

from kernels.backend import get_backend
from kernels.errors import InputError


def device_report():
    """The one-line report of this process's GPU (`InputError` when ``--backend cupy`` cannot run here)."""
    xp = get_backend("cupy").xp
    cuda = xp.cuda
    device = cuda.Device().id
    name = cuda.runtime.getDeviceProperties(device)["name"]
    runtime = cuda.runtime.runtimeGetVersion()  # 1000 * major + 10 * minor
    try:
        product = xp.ones((64, 64), xp.float32) @ xp.ones((64, 64), xp.float32)
        ok = float(product[0, 0]) == 64.0
    except Exception as error:  # a missing libcublas surfaces as an ImportError, OSError or CUDA error
        raise InputError(f"cuBLAS does not run ({type(error).__name__}: {error}); "
                         f"install the CUDA libraries: pip install 'mlscale[cuda12]' or '[cuda13]'") from None
    if not ok:
        raise InputError("cuBLAS gives a wrong product of two 64x64 matrices of ones")
    from cupy.cuda import nccl

    nccl_text = (f"NCCL {_version(nccl.get_version())}" if nccl.available
                 else "NCCL not available (pip install nvidia-nccl-cu12 or -cu13)")
    name = name.decode() if isinstance(name, bytes) else name
    return (f"GPU {device} of {cuda.runtime.getDeviceCount()}: {name}, CUDA runtime "
            f"{runtime // 1000}.{runtime % 1000 // 10}, CuPy {xp.__version__}; cuBLAS ok; {nccl_text}")


def _version(code):
    """NCCL's version number (``major * 10000 + minor * 100 + patch`` since 2.9) as text."""
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


def main():
    """Print the report; exit status 2 with one line on stderr when the GPU cannot be used."""
    try:
        print(device_report())
    except InputError as error:
        sys.stderr.write(f"device report: {error}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
