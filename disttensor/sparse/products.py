"""The products of :class:`~.csb.CSBMatrix`: operand checks and the choice of the CPU
(:mod:`.local_cpu`) or GPU (:mod:`.local_gpu`) kernel by the matrix's device.

Errors (all before any work): a right-hand side that is not 1-D or 2-D or whose leading
extent differs from the matrix's inner one (``ValueError``), one whose dtype differs from the
matrix's (``TypeError``: no silent promotion), one on another device than the matrix
(``TypeError``).
"""
from __future__ import annotations

import numpy as np

from ..core.backend import array_module, device_of

__all__ = ["matmul", "sampled_dense_dense"]


def _operand(a, x, rows: int, what: str):
    """``x`` as a C-contiguous 2-D array of ``rows`` rows (a 1-D ``x`` as one column) and
    whether it was 1-D."""
    if device_of(x) == "cpu" and not isinstance(x, np.ndarray):
        x = np.asarray(x)
    if device_of(x) != a.device:
        raise TypeError(f"{what} is a {device_of(x)} array but the CSB matrix is on "
                        f"{a.device} (use CSBMatrix.to_device)")
    if x.ndim not in (1, 2):
        raise ValueError(f"{what} must be 1-D or 2-D, got {x.ndim}-D (shape {x.shape})")
    if x.shape[0] != rows:
        raise ValueError(f"{what} has {x.shape[0]} rows where the CSB matrix of shape "
                         f"{a.shape} needs {rows}")
    if x.dtype != a.dtype:
        raise TypeError(f"{what} is {x.dtype} but the CSB matrix is {a.dtype}: the dtypes "
                        "must match (use CSBMatrix.astype or x.astype)")
    xp = array_module(x)
    vec = x.ndim == 1
    x2 = x.reshape(rows, 1) if vec else x
    return xp.ascontiguousarray(x2), vec


def _kernels(device):
    if device == "cpu":
        from . import local_cpu
        return local_cpu
    from . import local_gpu
    return local_gpu


def matmul(a, x):
    """``a @ x`` for a :class:`~.csb.CSBMatrix` ``a`` (a transposed view runs over
    block-columns): a new array ``(m,)`` or ``(m, k)``."""
    m, n = a.shape
    x2, vec = _operand(a, x, n, "the right-hand operand")
    y = _kernels(a.device).spmm(a.structure, a.values, x2, a._t)
    return y.reshape(m) if vec else y


def sampled_dense_dense(a, dy, x):
    """``(dy @ x.T)`` at ``a``'s nonzeros in storage order (see :func:`~.csb.sddmm`)."""
    m, n = a.shape
    dy2, dvec = _operand(a, dy, m, "dy")
    x2, xvec = _operand(a, x, n, "x")
    if dvec != xvec or dy2.shape[1] != x2.shape[1]:
        raise ValueError(f"dy {tuple(dy.shape)} and x {tuple(x.shape)} must have the same "
                         "number of columns k (both 2-D, or both 1-D)")
    # stored (r, c): value dy[r] . x[c]; for a transposed view the stored row is x's side
    left, right = (x2, dy2) if a._t else (dy2, x2)
    return _kernels(a.device).sddmm(a.structure, left, right, a.dtype)
