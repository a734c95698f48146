"""The fused CPU update of :class:`disttensor.nn.optim.Adam` (and AdamW): one Numba loop per
parameter instead of a dozen NumPy calls and their temporaries (per rank, no MPI).

A training step of a small model spends more time calling NumPy than computing (each call
costs about a microsecond whatever the array's size); this loop makes the update one call per
parameter and allocates nothing.  It computes exactly what the NumPy path computes, in the
same order and in the parameter's dtype (the scalars are cast to it first, as NumPy does with
Python scalars; ``fastmath`` off, so no contraction into FMAs): the results are bitwise the
same.  Imported on the first fused update (Numba is loaded only then).
"""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["adam_update", "fusable"]


def fusable(*arrays) -> bool:
    """Whether the fused loop takes these arrays: NumPy, C-contiguous, one float dtype
    (float32 or float64) and one shape."""
    a0 = arrays[0]
    if type(a0) is not np.ndarray or a0.dtype not in (np.float32, np.float64):
        return False
    for a in arrays:
        if (type(a) is not np.ndarray or a.dtype != a0.dtype or a.shape != a0.shape
                or not a.flags.c_contiguous):
            return False
    return True


@njit(cache=True)
def _adam(d, g, m, v, beta1, c1, beta2, c2, bc2, eps, step_size):
    for i in range(d.size):
        gi = g[i]
        mi = m[i] * beta1
        mi = mi + c1 * gi
        vi = v[i] * beta2
        vi = vi + c2 * (gi * gi)
        m[i] = mi
        v[i] = vi
        den = np.sqrt(vi) / bc2
        den = den + eps
        d[i] = d[i] - step_size * (mi / den)


def adam_update(d, grad, m, v, beta1: float, beta2: float, bias2_sqrt: float, eps: float,
                step_size: float) -> None:
    """In place, with ``t`` the step: ``m = beta1*m + (1-beta1)*grad``, ``v = beta2*v +
    (1-beta2)*grad**2``, ``d -= step_size * m / (sqrt(v) / bias2_sqrt + eps)``
    (``bias2_sqrt = sqrt(1 - beta2**t)``, ``step_size = lr / (1 - beta1**t)``).  The arrays
    must pass :func:`fusable`."""
    t = d.dtype.type
    _adam(d.reshape(-1), grad.reshape(-1), m.reshape(-1), v.reshape(-1), t(beta1),
          t(1 - beta1), t(beta2), t(1 - beta2), t(bias2_sqrt), t(eps), t(step_size))
