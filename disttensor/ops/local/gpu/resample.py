"""GPU resampling kernels on CuPy arrays (``kernels/resample.cu``): the contracts of
:mod:`..cpu.resample` -- a CSR map applied along one axis (interpolation, adaptive average
pooling, their adjoints) and adaptive max pooling forward/backward.  Per rank, no MPI.

The CSR arrays ``(indptr, idx, w)`` are built on the host (NumPy int64/float64) and copied to
the device per call (they are one entry per output row and tap: small next to the data).
"""
from __future__ import annotations

import numpy as np

from . import rawmodules
from .rawmodules import ctype, cupy, i64, launch

__all__ = ["apply_axis", "adaptive_max_forward", "adaptive_max_backward"]


def _kernel(expr):
    return rawmodules.kernel("resample", expr)


def apply_axis(a, t: int, csr, rows: int):
    """``csr`` applied along axis ``t`` of the CuPy array ``a`` (a new C-contiguous array of
    ``a``'s dtype whose axis ``t`` has ``rows`` entries; float64 accumulation)."""
    cp = cupy()
    indptr, idx, w = csr
    shape = tuple(a.shape)
    P = int(np.prod(shape[:t], dtype=np.int64))
    Q = int(np.prod(shape[t + 1:], dtype=np.int64))
    out = cp.empty(shape[:t] + (rows,) + shape[t + 1:], dtype=a.dtype)
    if out.size == 0:
        return out
    T = ctype(a.dtype, "resample")
    args = (cp.ascontiguousarray(a), cp.asarray(indptr, dtype=cp.int64),
            cp.asarray(idx, dtype=cp.int64), cp.asarray(w, dtype=cp.float64), out)
    launch(_kernel(f"csr_apply<{T}>"), out.size, args + i64(P, shape[t], rows, Q))
    return out


def adaptive_max_forward(x, bins):
    """``(y, argmax)`` of adaptive max pooling of the CuPy array ``x`` ``(N, C, D, H, W)``
    over ``bins`` (three ``(lo, hi)`` pairs of int arrays, relative to ``x``); argmax int64
    flat indices ``(d*H + h)*W + w``."""
    cp = cupy()
    x = cp.ascontiguousarray(x)
    T = ctype(x.dtype, "resample")
    lohi = [cp.asarray(np.asarray(v, dtype=np.int64)) for pair in bins for v in pair]
    out = tuple(len(lo) for lo, _ in bins)
    y = cp.empty(x.shape[:2] + out, dtype=x.dtype)
    am = cp.empty(y.shape, dtype=cp.int64)
    launch(_kernel(f"adaptive_max_forward<{T}>"), y.size,
           (x, y, am, *lohi) + i64(x.shape[0] * x.shape[1], *x.shape[2:], *out))
    return y, am


def adaptive_max_backward(dy, argmax, in_spatial):
    """The input window's gradient (``(N, C, *in_spatial)``) of :func:`adaptive_max_forward`:
    each output's gradient added into its argmax cell (``argmax < 0``: none)."""
    cp = cupy()
    dy = cp.ascontiguousarray(dy)
    T = ctype(dy.dtype, "resample")
    dx = cp.zeros(dy.shape[:2] + tuple(in_spatial), dtype=dy.dtype)
    nc = dy.shape[0] * dy.shape[1]
    m = int(np.prod(dy.shape[2:], dtype=np.int64))
    s = int(np.prod(in_spatial, dtype=np.int64))
    launch(_kernel(f"adaptive_max_backward<{T}>"), nc,
           (dy, cp.ascontiguousarray(argmax), dx) + i64(nc, m, s))
    return dx
