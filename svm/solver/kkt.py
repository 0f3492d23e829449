"""The KKT rules of the binary C-SVC dual shared by SMO, Dis-SMO and Cascade.

With ``F = -y * grad`` (``F_i = y_i - sum_j a_j y_j K_ij``), the KKT gap is ``m - M``
with ``m = max F over I_up`` and ``M = min F over I_low``; a pair (i in I_up,
j in I_low) moves by a clipped Newton step (`pair_step`), alphas that round next
to a bound are put on it (`snap`), and the bias is LIBSVM's ``-rho`` (`bias_parts`
per block of samples, combined by `bias_from_parts`). Arrays may be NumPy or
device (CuPy) arrays; scalars and the bias parts are host values.
"""
import numpy as np

from kernels.backend import array_module
from svm.solver.arrays import fetch

TAU = 1e-12  # stands in for a non-positive a_ij = K_ii + K_jj - 2 K_ij
SNAP = 1e-12  # an alpha within SNAP * C of a bound is put on it (rounding must not make it free)


def up_low(alpha, y, C):
    """Masks of I_up (alpha_i may move along y_i) and I_low (along -y_i); Python bools for scalars."""
    positive, negative = y > 0, y < 0  # y in {-1, +1}; no ``~``, which is -2 on a Python bool
    return positive & (alpha < C) | negative & (alpha > 0), positive & (alpha > 0) | negative & (alpha < C)


def extremes(F, up, low):
    """``m = max F over I_up`` (-inf if empty) and ``M = min F over I_low`` (inf if empty), as floats."""
    if len(F) == 0:
        return -np.inf, np.inf
    xp = array_module(F)
    m, M = fetch(xp, xp.where(up, F, -np.inf).max(), xp.where(low, F, np.inf).min())
    return m, M


def snap(alpha, C):
    """``alpha`` (array or scalar) with values within ``SNAP * C`` of 0 or ``C`` put on that bound."""
    tolerance = SNAP * C
    xp = array_module(alpha)
    return xp.where(alpha < tolerance, 0.0, xp.where(alpha > C - tolerance, C, alpha))


def pair_step(C, y_i, y_j, alpha_i, alpha_j, F_i, F_j, curvature):
    """Clipped Newton step ``t`` of the pair (i up by ``y_i t``, j down by ``y_j t``); return ``(t, new a_i, new a_j)``.

    A new alpha that lands within ``SNAP * C`` of a bound (``C - a_i + a_j`` rounds
    differently from the room it was clipped to) is put on the bound, so that it
    does not count as free. Shared by `smo_solve` and `svm.distributed.dis_smo` (same iterates).
    """
    step = (F_i - F_j) / (curvature if curvature > 0 else TAU)
    room_i = C - alpha_i if y_i > 0 else alpha_i
    room_j = alpha_j if y_j > 0 else C - alpha_j
    step = min(step, room_i, room_j)
    new_i = (C if y_i > 0 else 0.0) if step == room_i else float(snap(alpha_i + y_i * step, C))
    new_j = (0.0 if y_j > 0 else C) if step == room_j else float(snap(alpha_j - y_j * step, C))
    return step, new_i, new_j


def bias_parts(F, alpha, y, C):
    """Terms of the bias over some samples: ``[sum of F over free alphas, free count, m, M]``.

    Blocks that together hold every sample each give their parts; `bias_from_parts`
    combines them (sums add, ``m`` takes the max, ``M`` the min). Empty blocks give
    ``[0, 0, -inf, inf]``. Returns a host array of 4 floats.
    """
    m, M = extremes(F, *up_low(alpha, y, C))
    free = (alpha > 0) & (alpha < C)
    xp = array_module(F)
    return np.array(fetch(xp, F[free].sum(), xp.count_nonzero(free)) + [m, M])


def bias_from_parts(parts):
    """LIBSVM's bias (``-rho`` of ``calculate_rho``) from `bias_parts` of blocks, shape ``(blocks, 4)`` or ``(4,)``.

    The mean of ``F`` over the free alphas; without a free alpha, the midpoint
    ``(m + M) / 2`` of the interval of feasible biases, taken over *all* samples
    (the bounded ones decide it; one class alone: the finite end).
    """
    parts = np.atleast_2d(parts)
    free_sum, n_free = parts[:, 0].sum(), parts[:, 1].sum()
    if n_free > 0:
        return float(free_sum / n_free)
    m, M = float(parts[:, 2].max()), float(parts[:, 3].min())
    return (m + M) / 2 if np.isfinite(m) and np.isfinite(M) else (m if np.isfinite(m) else M)
