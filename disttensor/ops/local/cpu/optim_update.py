"""Adam's update of one host parameter in one pass (per rank, no MPI).

:meth:`disttensor.nn.optim.Adam._update` on NumPy arrays is some twelve NumPy calls per
parameter, each about a microsecond whatever the size, so on small models (a dozen
parameters of a few thousand elements) the calls, not the arithmetic, are the optimizer's
time.  :func:`adam_step` does the same update in one compiled loop: the same operations in
the same order, each rounded to the parameter's dtype as NumPy rounds them (the scalars are
cast to that dtype first, as NumPy casts a Python float against a float32 array), so the
results are bit-identical to the NumPy expressions (``tests/unit/test_optim_scratch.py``).
It covers the common case: float32 or float64 C-contiguous arrays of fewer than
:data:`MAX_SIZE` elements, no ``amsgrad``, no ``maximize``, weight decay none or decoupled
(AdamW); the caller takes its NumPy path otherwise.  Larger parameters stay with NumPy: its
passes are vectorised, while this loop is not (vectorising it would need fast-math, which
changes the rounding), so from a few thousand elements NumPy's twelve calls are as fast.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["adam_step", "MAX_SIZE"]

#: parameters from this many elements take NumPy's vectorised passes instead (at 8192
#: float32 elements, on a loaded core, the loop took 27-33 us and NumPy's scratch path 33 us)
MAX_SIZE = 4096


@njit(cache=True)
def _adam(d, grad, m, v, coef):
    """Flat arrays; ``coef`` the scalars in their dtype, ``(decay, beta1, c1, beta2, c2,
    bias2, eps, step_size)``: ``d *= decay`` (when not 1), ``m = m*beta1 + g*c1``, ``v =
    v*beta2 + (g*g)*c2``, ``d -= (m / (sqrt(v)/bias2 + eps)) * step_size``."""
    decay, beta1, c1, beta2, c2 = coef[0], coef[1], coef[2], coef[3], coef[4]
    bias2, eps, step_size = coef[5], coef[6], coef[7]
    for i in range(d.size):
        p = d[i]
        if decay != 1:
            p = p * decay
        g = grad[i]
        mi = m[i] * beta1 + g * c1
        m[i] = mi
        vi = v[i] * beta2 + (g * g) * c2
        v[i] = vi
        den = np.sqrt(vi) / bias2 + eps
        d[i] = p - (mi / den) * step_size


def adam_step(d, grad, m, v, t: int, lr: float, beta1: float, beta2: float, eps: float,
              decay: float = 1.0) -> bool:
    """Adam's update of ``d`` (with its moments ``m``, ``v``) at step ``t`` in place, as
    :meth:`disttensor.nn.optim.Adam._update` computes it; ``decay``: AdamW's ``1 - lr *
    weight_decay`` (1: none).  Returns False, touching nothing, where the arrays are not all
    C-contiguous NumPy float32 or float64 arrays of one shape and dtype, or have
    :data:`MAX_SIZE` elements or more."""
    dt = d.dtype
    if not (type(d) is np.ndarray and d.size < MAX_SIZE and type(grad) is np.ndarray and type(m) is np.ndarray
            and type(v) is np.ndarray and (dt == np.float32 or dt == np.float64)
            and grad.dtype == dt and m.dtype == dt and v.dtype == dt
            and grad.shape == d.shape and d.flags.c_contiguous and grad.flags.c_contiguous
            and m.flags.c_contiguous and v.flags.c_contiguous and d.flags.writeable):
        return False
    coef = _COEF[dt.itemsize == 4]    # (each rounded to the dtype as it is stored)
    coef[0], coef[1], coef[2], coef[3] = decay, beta1, 1 - beta1, beta2
    coef[4], coef[5], coef[6], coef[7] = 1 - beta2, math.sqrt(1 - beta2 ** t), eps, \
        lr / (1 - beta1 ** t)
    _adam(d.reshape(-1), grad.reshape(-1), m.reshape(-1), v.reshape(-1), coef)
    return True


# the scalars of a call, in the parameter's dtype, stored into one kept array per dtype (a
# NumPy scalar made from a Python float allocates a buffer; a store into an array does not;
# like the optimizers themselves, not for two threads stepping at once)
_COEF = (np.empty(8, np.float64), np.empty(8, np.float32))
