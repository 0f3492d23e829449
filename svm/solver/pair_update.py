"""The fused elementwise kernels of an SMO iteration: the second-order gain of every j, and the pair update.

On CuPy each is one ``cupy.ElementwiseKernel`` launch (compiled once, ``--fmad=false`` so that
no multiply-add is contracted: the same rounding as NumPy's separate operations); elsewhere its
NumPy twin (`gain_on_host`, `update_on_host`) runs, with the same operations in the same order,
so both give the same iterates. An iteration of `svm.solver.smo` on a device is then a dozen
launches: the selection's reductions, the gain, and one update of ``F``, both alphas and both
masks (the scalar writes of the pair were about ten launches of their own).
"""
import numpy as np

from svm.solver.kkt import TAU, up_low

#: Compiled as written: no contracted multiply-adds (NumPy's rounding), float64 infinities from CuPy's header.
_OPTIONS = {"options": ("--fmad=false",), "preamble": "#include <cupy/math_constants.h>"}

_GAIN = ("float64 f, bool low, float64 qd, float64 row, float64 m, float64 qd_i", "float64 gain", f"""
    double b = m - (low ? f : CUDART_INF);
    double a = qd_i + qd - 2.0 * row;
    a = a < {TAU!r} ? {TAU!r} : a;
    gain = b > 0 ? b * b / a : -CUDART_INF;
    """, "smo_gain")

_UPDATE = ("float64 row_i, float64 row_j, float64 y, float64 step, int64 index_i, int64 index_j, float64 new_i, "
           "float64 new_j, float64 C", "float64 work, float64 f, float64 a, bool up, bool low", """
    work = (row_i - row_j) * step;
    f = f - work;
    if (_ind.get() == index_i || _ind.get() == index_j) {
        a = _ind.get() == index_i ? new_i : new_j;
        up = y > 0 ? a < C : a > 0;
        low = y > 0 ? a > 0 : a < C;
    }
    """, "smo_pair_update")


def gain_on_host(f, low, qd, row, m, qd_i):
    """``b^2 / a`` for every j in I_low with ``b = m - F_j > 0`` (``a = K_ii + K_jj - 2 K_ij``, at least
    `svm.solver.kkt.TAU`), else -inf; host arrays of shape (n,) as ``f``."""
    b = m - np.where(low, f, np.inf)
    a = qd_i + qd - 2.0 * row
    np.maximum(a, TAU, out=a)
    return np.where(b > 0, b * b / a, -np.inf)


def update_on_host(row_i, row_j, y, step, i, j, new_i, new_j, C, work, f, a, up, low):
    """``F -= step (K_i - K_j)`` (through ``work``), ``a[i], a[j] = new_i, new_j`` and their masks, in place
    (host arrays of shape (n,))."""
    np.subtract(row_i, row_j, out=work)
    work *= step
    f -= work
    a[i], a[j] = new_i, new_j
    for k in (i, j):
        up[k], low[k] = up_low(a[k], y[k], C)


def fused_kernels(xp):
    """``(gain, update)`` for array module ``xp``: its compiled elementwise kernels where it has them
    (``xp.ElementwiseKernel``: CuPy), else the NumPy twins; each called with the twin's arguments."""
    make = getattr(xp, "ElementwiseKernel", None)
    if make is None:
        return gain_on_host, update_on_host
    return make(*_GAIN, **_OPTIONS), make(*_UPDATE, **_OPTIONS)
