"""GPU kernels of group, instance and layer normalization on CuPy arrays: the functions and
contracts of :mod:`..cpu.normalization` (``row_moments``, ``rows_backward_sums``,
``rows_backward_apply``,
``ln_forward_apply``, ``ln_backward_sums``, ``ln_backward_apply``), with the RawKernels of
``kernels/normalization.cu`` (float16 too).

Every function takes 2-D ``(R, L)`` views (copied once if not C-contiguous).  Reductions are
float64 and deterministic run to run (per-(row, chunk) partials, then one thread per row merges
its chunks in order); the chunk count depends on the shape only.  Per rank, no MPI.
"""
from __future__ import annotations

import numpy as np

from .rawmodules import BLOCK, CTYPES, ctype, cupy, i64, kernel, launch


def _rows(cp, a, what):
    if not isinstance(a, cp.ndarray):
        raise TypeError(f"{what} must be a cupy.ndarray, got {type(a).__name__}")
    if np.dtype(a.dtype).name not in CTYPES:
        raise TypeError(f"{what} must be float16/32/64, got {a.dtype}")
    if a.ndim != 2:
        raise ValueError(f"{what} must be a 2-D (rows, values) view, got shape {a.shape}")
    return cp.ascontiguousarray(a)


def _vec(cp, v, n, what):
    v = cp.ascontiguousarray(cp.asarray(v, dtype=cp.float64).reshape(-1))
    if v.size != n:
        raise ValueError(f"{what} must have {n} values, got {v.size}")
    return v


def _pair(cp, dy, x):
    dy, x = _rows(cp, dy, "dy"), _rows(cp, x, "x")
    if dy.shape != x.shape or dy.dtype != x.dtype:
        raise ValueError(f"dy shape {dy.shape} != x shape {x.shape} (or dtypes differ)")
    return dy, x


def _chunks(R, L):
    """Chunks per row of the two-stage reductions (a function of the shape only)."""
    return int(min(max(1, -(-L // (BLOCK * 8))), 1024))


def row_moments(x):
    """Per-row ``(mean, m2)`` (float64 ``(R,)``) of ``x`` ``(R, L)``."""
    cp = cupy()
    x = _rows(cp, x, "x")
    R, L = x.shape
    mean, m2 = cp.zeros(R), cp.zeros(R)
    if R == 0 or L == 0:
        return mean, m2
    B = _chunks(R, L)
    pm, pq = cp.empty(R * B), cp.empty(R * B)
    T = ctype(x.dtype, "normalization")
    kernel("normalization", f"row_moments_partial<{T}>")((B, min(R, 65535)), (BLOCK,),
                                                         (x,) + i64(R, L) + (pm, pq))
    launch(kernel("normalization", "row_moments_finalize"), R,
           (pm, pq) + i64(R, L, B) + (mean, m2))
    return mean, m2


def rows_backward_sums(dy, x, m):
    """Per row ``(sum(dy), sum(dy * (x - m[r])))`` (float64 ``(R,)``): pointwise.cu's channel
    sums over the ``(1, R, L)`` view."""
    from .batchnorm import channel_sums_backward
    cp = cupy()
    dy, x = _pair(cp, dy, x)
    R = x.shape[0]
    return channel_sums_backward(dy[None], x[None], _vec(cp, m, R, "m"), cp.ones(R))


def rows_backward_apply(dy, x, a, m, b, d):
    """``dx = a[r]*dy + b[r]*(x - m[r]) + d[r]`` on ``(R, L)`` views (``dy``'s dtype)."""
    cp = cupy()
    dy, x = _pair(cp, dy, x)
    R, L = x.shape
    dx = cp.empty_like(dy)
    T = ctype(x.dtype, "normalization")
    launch(kernel("normalization", f"rows_backward_apply<{T}>"), x.size,
           (dy, x, dx) + tuple(_vec(cp, v, R, n) for v, n in ((a, "a"), (m, "m"), (b, "b"),
                                                                (d, "d")))
           + i64(L, x.size))
    return dx


def ln_forward_apply(x, mean, invstd, gamma, beta):
    """``y = (x - mean[r]) * invstd[r] * gamma[j] + beta[j]`` (``x``'s dtype)."""
    cp = cupy()
    x = _rows(cp, x, "x")
    R, L = x.shape
    y = cp.empty_like(x)
    T = ctype(x.dtype, "normalization")
    launch(kernel("normalization", f"ln_forward_apply<{T}>"), x.size,
           (x, y, _vec(cp, mean, R, "mean"), _vec(cp, invstd, R, "invstd"),
            _vec(cp, gamma, L, "gamma"), _vec(cp, beta, L, "beta")) + i64(L, x.size))
    return y


def ln_backward_sums(dy, x, mean, invstd, gamma, cols_dtype=np.float64):
    """``(sum_dyg, sum_dyg_xhat, cols)``: per row ``sum dy*gamma[j]`` and
    ``sum dy*gamma[j]*xhat`` (float64); ``cols`` ``(2, L)`` of ``cols_dtype`` (float32 or
    float64, accumulated in float64): per column ``sum dy*xhat``, ``sum dy``."""
    cp = cupy()
    dy, x = _pair(cp, dy, x)
    R, L = x.shape
    mean, invstd = _vec(cp, mean, R, "mean"), _vec(cp, invstd, R, "invstd")
    gamma = _vec(cp, gamma, L, "gamma")
    want = np.float32 if np.dtype(cols_dtype) == np.float32 else np.float64
    sa, sb, cols = cp.zeros(R), cp.zeros(R), cp.zeros((2, L))
    dg, db = cols[0], cols[1]
    if R == 0 or L == 0:
        return sa, sb, cols.astype(want, copy=False)
    T = ctype(x.dtype, "normalization")
    B = _chunks(R, L)
    pa, pb = cp.empty(R * B), cp.empty(R * B)
    kernel("normalization", f"ln_row_partial<{T}>")(
        (B, min(R, 65535)), (BLOCK,), (dy, x, mean, invstd, gamma) + i64(R, L) + (pa, pb))
    launch(kernel("pointwise", "channel_finalize"), R, (pa, pb) + i64(R, B) + (sa, sb))
    launch(kernel("normalization", f"ln_col_sums<{T}>"), L,
           (dy, x, mean, invstd) + i64(R, L) + (dg, db))
    return sa, sb, cols.astype(want, copy=False)


def ln_backward_apply(dy, x, mean, invstd, gamma, mean_dyg, mean_dyg_xhat):
    """``dx = invstd[r] * (dy*gamma[j] - mean_dyg[r] - xhat*mean_dyg_xhat[r])``."""
    cp = cupy()
    dy, x = _pair(cp, dy, x)
    R, L = x.shape
    dx = cp.empty_like(dy)
    T = ctype(x.dtype, "normalization")
    launch(kernel("normalization", f"ln_backward_apply<{T}>"), x.size,
           (dy, x, dx, _vec(cp, mean, R, "mean"), _vec(cp, invstd, R, "invstd"),
            _vec(cp, gamma, L, "gamma"), _vec(cp, mean_dyg, R, "mean_dyg"),
            _vec(cp, mean_dyg_xhat, R, "mean_dyg_xhat")) + i64(L, x.size))
    return dx
