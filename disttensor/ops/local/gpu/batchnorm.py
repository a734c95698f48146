"""GPU per-channel statistics and batch-norm apply on CuPy arrays: the contracts of
:mod:`..cpu.pointwise` (``channel_sums``, ``channel_sums_backward``, ``bn_forward_apply``,
``bn_backward_apply``), with the RawKernels of ``kernels/pointwise.cu``.

Any layout ``(N, C, *spatial)`` (ndim >= 2).  The sums are float64 and deterministic run to run
(two stages in a fixed order: per-block partials, then one thread per channel); the apply
kernels return the input dtype and take per-channel parameters (one value is repeated).
Per rank, no MPI.
"""
from __future__ import annotations

import numpy as np

from .operands import as_nc, float_input, float_pair, ncs, per_channel
from .rawmodules import BLOCK, CTYPES, ctype, cupy, i64, kernel, launch


def _channel_reduce(cp, mode, a, b, mean, invstd):
    N, C, S = ncs(a.shape)
    M = N * S
    s1 = cp.zeros(C, cp.float64)
    s2 = cp.zeros(C, cp.float64)
    if C == 0 or M == 0:
        return s1, s2
    T = ctype(a.dtype, "pointwise")
    B = int(min(max(1, -(-M // (BLOCK * 8))), 1024))  # depends on the shape only: deterministic
    p1 = cp.empty(C * B, cp.float64)
    p2 = cp.empty(C * B, cp.float64)
    partial = kernel("pointwise", f"channel_partial<{T}, {mode}>")
    partial((B, min(C, 65535)), (BLOCK,), (a, b, mean, invstd) + i64(C, S, M) + (p1, p2))
    launch(kernel("pointwise", "channel_finalize"), C, (p1, p2) + i64(C, B) + (s1, s2))
    return s1, s2


def channel_sums(x):
    """``(s, ss)``: float64 (C,) sums of ``x`` and ``x*x`` over every axis but 1."""
    cp = cupy()
    x = as_nc(cp, x, "x")
    if np.dtype(x.dtype).name not in CTYPES:
        x = x.astype(cp.float64)
    dummy = cp.zeros(1, cp.float64)
    return _channel_reduce(cp, 0, x, x, dummy, dummy)


def channel_sums_backward(dy, x, mean, invstd):
    """``(sum_dy, sum_dy_xhat)``: float64 (C,) sums of ``dy`` and ``dy*xhat`` over every axis but
    1, ``xhat = (x - mean[c]) * invstd[c]``."""
    cp = cupy()
    dy, x = float_pair(cp, dy, x, "x")
    C = x.shape[1]
    return _channel_reduce(cp, 1, dy, x, per_channel(cp, mean, C, "mean"),
                           per_channel(cp, invstd, C, "invstd"))


def bn_forward_apply(x, scale, shift):
    """``y = x*scale[c] + shift[c]`` (x's dtype)."""
    cp = cupy()
    x = float_input(cp, x, "x")
    N, C, S = ncs(x.shape)
    y = cp.empty_like(x)
    T = ctype(x.dtype, "pointwise")
    launch(kernel("pointwise", f"bn_forward_apply<{T}>"), x.size,
           (x, y, per_channel(cp, scale, C, "scale"), per_channel(cp, shift, C, "shift"))
           + i64(C, S, x.size))
    return y


def bn_backward_apply(dy, x, mean, invstd, gamma, mean_dy, mean_dy_xhat):
    """``dx = gamma[c]*invstd[c]*(dy - mean_dy[c] - xhat*mean_dy_xhat[c])``,
    ``xhat = (x - mean[c])*invstd[c]`` (x's dtype)."""
    cp = cupy()
    dy, x = float_pair(cp, dy, x, "x")
    N, C, S = ncs(x.shape)
    dx = cp.empty_like(x)
    T = ctype(x.dtype, "pointwise")
    params = tuple(per_channel(cp, v, C, n) for v, n in (
        (mean, "mean"), (invstd, "invstd"), (gamma, "gamma"), (mean_dy, "mean_dy"),
        (mean_dy_xhat, "mean_dy_xhat")))
    launch(kernel("pointwise", f"bn_backward_apply<{T}>"), x.size,
           (dy, x, dx) + params + i64(C, S, x.size))
    return dx
