"""im2col + cuBLAS convolution on CuPy arrays: the GPU fallback where cuDNN is unavailable or
has no engine, and the ``im2col`` algorithm of the micro-batch planner.

The column transforms are the RawKernels ``im2col3d`` / ``col2im3d`` of ``kernels/im2col.cu``;
the products are ``cupy.matmul`` (cuBLAS), batched over the groups.  The batch (and, for big
samples, the output depth) is cut in chunks so the column buffer stays under a budget: the
planner's workspace limit, else ``DISTTENSOR_IM2COL_WORKSPACE_MIB`` (default 256).

Operands are already checked (``(N, C, D, H, W)`` C-contiguous, one float dtype, geometry
normalized by :func:`.operands.conv_args`); per rank, no MPI.
"""
from __future__ import annotations

import math
import os

import numpy as np

from .operands import conv_args, pass_shapes
from .rawmodules import CTYPES, ctype, cupy, i64, kernel, launch


def _im2col_budget_elems(itemsize, budget_bytes=None):
    if budget_bytes is None:
        budget_bytes = float(os.environ.get("DISTTENSOR_IM2COL_WORKSPACE_MIB", "256")) * 2**20
    return max(1, int(budget_bytes) // itemsize)


def _chunks(N, oD, per_plane, itemsize, budget_bytes=None):
    """(n0, nb, od0, ndp) chunks: whole samples while one fits the column budget
    (``budget_bytes``, None: ``DISTTENSOR_IM2COL_WORKSPACE_MIB``), else one sample and as many
    output-depth planes as fit (at least one)."""
    budget = _im2col_budget_elems(itemsize, budget_bytes)
    per_sample = per_plane * oD
    if per_sample <= budget:
        nb = max(1, min(N, budget // max(per_sample, 1)))
        return [(n0, min(nb, N - n0), 0, oD) for n0 in range(0, N, nb)]
    ndp = max(1, budget // max(per_plane, 1))
    return [(n, 1, od0, min(ndp, oD - od0)) for n in range(N) for od0 in range(0, oD, ndp)]


def _im2col(T, x_chunk, col, G, Cg, spatial, kern, out_hw, od0, ndp, stride, dilation, lo,
            transposed):
    nb = x_chunk.shape[0]
    args = (x_chunk, col) + i64(nb, G, Cg, *spatial, *kern, *out_hw, od0, ndp,
                                *stride, *dilation, *lo) + (np.int32(transposed),)
    launch(kernel("im2col", f"im2col3d<{T}>"), col.size, args)


def im2col_forward(cp, x, w, y_shape, stride, dilation, lo, G, budget_bytes=None):
    """``y`` of shape ``y_shape`` (x's dtype): the convolution of ``x`` with ``w``."""
    T = ctype(x.dtype, "im2col")
    y = cp.empty(y_shape, x.dtype)
    N, Cin = x.shape[:2]
    Cout, Cg = w.shape[:2]
    kern = w.shape[2:]
    K = Cg * math.prod(kern)
    oD, oH, oW = y.shape[2:]
    wg = w.reshape(G, Cout // G, K)
    yv = y.reshape(N, Cout, oD, oH * oW)
    for n0, nb, od0, ndp in _chunks(N, oD, Cin * math.prod(kern) * oH * oW, x.itemsize,
                                    budget_bytes):
        col = cp.empty((nb, G, K, ndp * oH * oW), x.dtype)
        _im2col(T, x[n0:n0 + nb], col, G, Cg, x.shape[2:], kern, (oH, oW), od0, ndp,
                stride, dilation, lo, 0)
        out = cp.matmul(wg, col)  # (G, Coutg, K) @ (nb, G, K, Q) -> (nb, G, Coutg, Q)
        yv[n0:n0 + nb, :, od0:od0 + ndp, :] = out.reshape(nb, Cout, ndp, oH * oW)
    return y


def im2col_backward_data(cp, dy, w, dx_shape, stride, dilation, lo, G, budget_bytes=None):
    """``dx`` of shape ``dx_shape`` (dy's dtype): the gradient of :func:`im2col_forward` with
    respect to ``x``."""
    T = ctype(dy.dtype, "im2col")
    dx = cp.zeros(dx_shape, dy.dtype)
    N, Cin, D, H, W = dx.shape
    Cout, Cg = w.shape[:2]
    kern = w.shape[2:]
    K = Cg * math.prod(kern)
    oD, oH, oW = dy.shape[2:]
    wt = w.reshape(G, Cout // G, K).transpose(0, 2, 1)  # (G, K, Coutg)
    dyv = dy.reshape(N, Cout, oD, oH * oW)
    col2im = kernel("im2col", f"col2im3d<{T}>")
    for n0, nb, od0, ndp in _chunks(N, oD, Cin * math.prod(kern) * oH * oW, dy.itemsize,
                                    budget_bytes):
        # input depth rows the planes [od0, od0 + ndp) reach
        id0 = max(0, od0 * stride[0] - lo[0])
        id1 = min(D, (od0 + ndp - 1) * stride[0] - lo[0] + dilation[0] * (kern[0] - 1) + 1)
        if id1 <= id0:
            continue
        dyc = cp.ascontiguousarray(dyv[n0:n0 + nb, :, od0:od0 + ndp, :])
        dyc = dyc.reshape(nb, G, Cout // G, ndp * oH * oW)
        dcol = cp.ascontiguousarray(cp.matmul(wt, dyc))  # (nb, G, K, Q)
        args = (dcol, dx[n0:n0 + nb]) + i64(nb, G, Cg, D, H, W, *kern, oH, oW, od0, ndp,
                                              id0, id1 - id0, *stride, *dilation, *lo)
        launch(col2im, nb * Cin * (id1 - id0) * H * W, args)
    return dx


def im2col_backward_filter(cp, x, dy, dw_shape, stride, dilation, lo, G, budget_bytes=None):
    """``dw`` of shape ``dw_shape`` (x's dtype): the gradient of :func:`im2col_forward` with
    respect to ``w``.

    Every product and sum is in float32 for float16 operands (float64 for float64): the column
    chunk and ``dy`` are widened before the GEMM, so no chunk's partial sum over its output
    positions is ever rounded to float16 (it was: a float16 GEMM output per chunk, 11-bit
    partial sums and overflow past 65504 on large outputs).  The column budget counts the
    widened copy too."""
    T = ctype(x.dtype, "im2col")
    N, Cin = x.shape[:2]
    Cout, Cg = dw_shape[:2]
    kern = dw_shape[2:]
    K = Cg * math.prod(kern)
    oD, oH, oW = dy.shape[2:]
    acc = np.dtype(np.float64 if x.dtype == np.float64 else np.float32)
    widen = np.dtype(x.dtype) != acc
    dw = cp.zeros((G, Cout // G, K), acc)
    dyv = dy.reshape(N, Cout, oD, oH * oW)
    col_itemsize = x.itemsize + (acc.itemsize if widen else 0)
    for n0, nb, od0, ndp in _chunks(N, oD, Cin * math.prod(kern) * oH * oW, col_itemsize,
                                    budget_bytes):
        Q = ndp * oH * oW
        colT = cp.empty((nb, G, Q, K), x.dtype)
        _im2col(T, x[n0:n0 + nb], colT, G, Cg, x.shape[2:], kern, (oH, oW), od0, ndp,
                stride, dilation, lo, 1)
        dyc = cp.ascontiguousarray(dyv[n0:n0 + nb, :, od0:od0 + ndp, :], dtype=acc)
        dyc = dyc.reshape(nb, G, Cout // G, Q)
        if widen:
            colT = colT.astype(acc)
        part = cp.matmul(dyc, colT)  # (nb, G, Coutg, Q) @ (nb, G, Q, K) -> (nb, G, Coutg, K)
        dw += part.sum(axis=0, dtype=acc)
    return dw.astype(x.dtype, copy=False).reshape(dw_shape)


class Im2colGpu:
    """im2col + cuBLAS with the column chunk bounded by ``budget_bytes``, as a micro-batch
    planner algorithm (:mod:`..microbatch` protocol)."""

    def __init__(self, budget_bytes):
        self.budget_bytes = int(budget_bytes)

    def supports(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups, dtype):
        return np.dtype(dtype).name in CTYPES

    def workspace_bytes(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                        dtype):
        """The largest chunk's column buffer plus its GEMM output (and, for the filter
        gradient, the per-sample partial products)."""
        item = np.dtype(dtype).itemsize
        _, _, out = pass_shapes(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi)
        N, Cin = int(x_shape[0]), int(x_shape[1])
        Cout, kk = int(w_shape[0]), math.prod(w_shape[2:])
        plane = out[3] * out[4]
        worst = 0
        for _, nb, _, ndp in _chunks(N, out[2], Cin * kk * plane, item, self.budget_bytes):
            col = nb * Cin * kk * ndp * plane
            res = nb * Cout * ndp * plane
            if pass_ == "backward_filter":
                res += nb * Cout * int(w_shape[1]) * kk
            worst = max(worst, col + res)
        return worst * item

    def estimate_seconds(self, problem):
        return 2.0 * problem.flops() / 2e13 + 1e-4

    def forward(self, x, w, stride, dilation, pad_lo, pad_hi, groups):
        s, d, lo, hi, G = conv_args(stride, dilation, pad_lo, pad_hi, groups)
        y_shape = pass_shapes("forward", x.shape, w.shape, s, d, lo, hi)[2]
        return im2col_forward(cupy(), x, w, y_shape, s, d, lo, G, self.budget_bytes)

    def backward_data(self, dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups):
        s, d, lo, hi, G = conv_args(stride, dilation, pad_lo, pad_hi, groups)
        dx_shape = (dy.shape[0], w.shape[1] * G) + tuple(in_spatial)
        return im2col_backward_data(cupy(), dy, w, dx_shape, s, d, lo, G, self.budget_bytes)

    def backward_filter(self, x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups):
        s, d, lo, hi, G = conv_args(stride, dilation, pad_lo, pad_hi, groups)
        dw_shape = (dy.shape[1], x.shape[1] // G) + tuple(kernel)
        return im2col_backward_filter(cupy(), x, dy, dw_shape, s, d, lo, G, self.budget_bytes)
