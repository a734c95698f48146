"""CPU convolution kernels (per rank, no MPI): im2col + BLAS GEMM in bounded tiles, Numba packs.

Contract (shared with :mod:`disttensor.ops.local.gpu`): exactly three spatial axes, layout
``(N, C, D, H, W)``; ``stride``, ``dilation``, ``pad_lo``, ``pad_hi`` are 3-tuples of ints,
padding may be asymmetric and is zero; cross-correlation as in PyTorch, ``w`` of shape
``(Cout, Cin // groups, kD, kH, kW)``; output extent per axis
``(n + lo + hi - dilation*(k-1) - 1) // stride + 1``.  Results have the input's dtype
(float32 or float64).

How: for each sample and group the output is computed in tiles of whole output depth planes.
A tile's column matrix ``cols[(c, kd, kh, kw), (od, oh, ow)]`` (at most
``DISTTENSOR_CONV_WORKSPACE_MB`` MiB, default 64, or one plane) is packed by a parallel Numba
loop, then one GEMM does ``y_tile = w.reshape(Cout_g, K) @ cols`` (NumPy's BLAS).  Backward
data computes ``dcols = w^T @ dy_tile`` and scatters it back (col2im, parallel over input
channels so no two threads add into the same cell); backward filter accumulates
``dy_tile @ cols^T``.  Compared with building the whole column matrix at once (the
straightforward im2col), the workspace is bounded and stays in cache-sized pieces.

The ``*_batched`` variants (same contracts) pack the columns of all N samples of a group side
by side into one ``(K, N*P)`` column matrix and run one GEMM per group: for layers with few
output positions ``P`` per sample and many channels one big GEMM beats N small ones, at the
price of a workspace that grows with N (:func:`batched_workspace_bytes`).  The planner in
:mod:`disttensor.ops.local.microbatch` chooses between them per layer, pass and micro-batch.
"""
from __future__ import annotations

import math
import os
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from .conv_cost import MEM_BW, gemm_seconds
from .conv_operands import conv_out_shape, data_operands, filter_operands, forward_operands
from .scratch import ScratchBuffers

__all__ = ["conv_forward", "conv_backward_data", "conv_backward_filter", "conv_out_shape",
           "conv_forward_batched", "conv_backward_data_batched", "conv_backward_filter_batched",
           "tiled_workspace_bytes", "batched_workspace_bytes", "tiled_seconds",
           "batched_seconds"]


def _workspace_bytes() -> int:
    return int(float(os.environ.get("DISTTENSOR_CONV_WORKSPACE_MB", "64")) * 2**20)


_scratch = ScratchBuffers()   # the column tiles (slot "columns", shared by all tiles)


@njit(cache=True, inline="always")
def _valid_range(o_n, k_off, stride, pad, n):
    """Outputs ``o`` in ``[0, o_n)`` with ``0 <= o*stride - pad + k_off < n``, as a range."""
    base = k_off - pad
    lo = 0 if base >= 0 else (-base + stride - 1) // stride
    top = n - 1 - base
    hi = -1 if top < 0 else min(o_n - 1, top // stride)
    if hi < lo:
        return 0, 0
    return lo, hi + 1


@njit(parallel=True, cache=True)
def _im2col(x, cols, d0, d1, oh_n, ow_n, kd_n, kh_n, kw_n, sd, sh, sw, dd, dh, dw, pd, ph, pw):
    """cols[(c, kd, kh, kw), (od - d0, oh, ow)] = x[c, od*sd - pd + kd*dd, ...] (0 outside).

    One thread per row; a row is runs of ``ow``, each a (strided) copy of an input row between
    its two zero-padded ends, whose bounds are computed once per kernel offset."""
    c_n, d_n, h_n, w_n = x.shape
    kk = kd_n * kh_n * kw_n
    xf = x.reshape(-1)  # x is C-contiguous: flat indexing lets LLVM vectorize unit strides
    for r in prange(c_n * kk):
        c = r // kk
        rem = r - c * kk
        kd = rem // (kh_n * kw_n)
        rem -= kd * kh_n * kw_n
        kh = rem // kw_n
        kw = rem - kh * kw_n
        row = cols[r]
        w_lo, w_hi = _valid_range(ow_n, kw * dw, sw, pw, w_n)
        m = w_hi - w_lo
        i_w0 = w_lo * sw - pw + kw * dw
        p = 0
        for od in range(d0, d1):
            i_d = od * sd - pd + kd * dd
            for oh in range(oh_n):
                i_h = oh * sh - ph + kh * dh
                if i_d < 0 or i_d >= d_n or i_h < 0 or i_h >= h_n:
                    for j in range(ow_n):
                        row[p + j] = 0
                else:
                    for j in range(w_lo):
                        row[p + j] = 0
                    q = ((c * d_n + i_d) * h_n + i_h) * w_n + i_w0
                    o = p + w_lo
                    if sw == 1:
                        for j in range(m):
                            row[o + j] = xf[q + j]
                    else:
                        for j in range(m):
                            row[o + j] = xf[q + j * sw]
                    for j in range(w_hi, ow_n):
                        row[p + j] = 0
                p += ow_n


@njit(parallel=True, cache=True)
def _col2im(cols, dx, d0, d1, oh_n, ow_n, kd_n, kh_n, kw_n, sd, sh, sw, dd, dh, dw, pd, ph, pw):
    """dx[c, od*sd - pd + kd*dd, ...] += cols[(c, kd, kh, kw), (od - d0, oh, ow)] (adjoint of
    :func:`_im2col`); one thread per input channel, so no two threads add into one cell."""
    c_n, d_n, h_n, w_n = dx.shape
    kk = kd_n * kh_n * kw_n
    dxf = dx.reshape(-1)  # dx is C-contiguous
    for c in prange(c_n):
        for rem0 in range(kk):
            r = c * kk + rem0
            row = cols[r]
            kd = rem0 // (kh_n * kw_n)
            rem = rem0 - kd * kh_n * kw_n
            kh = rem // kw_n
            kw = rem - kh * kw_n
            w_lo, w_hi = _valid_range(ow_n, kw * dw, sw, pw, w_n)
            m = w_hi - w_lo
            i_w0 = w_lo * sw - pw + kw * dw
            p = 0
            for od in range(d0, d1):
                i_d = od * sd - pd + kd * dd
                for oh in range(oh_n):
                    i_h = oh * sh - ph + kh * dh
                    if 0 <= i_d < d_n and 0 <= i_h < h_n:
                        q = ((c * d_n + i_d) * h_n + i_h) * w_n + i_w0
                        o = p + w_lo
                        if sw == 1:
                            for j in range(m):
                                dxf[q + j] += row[o + j]
                        else:
                            for j in range(m):
                                dxf[q + j * sw] += row[o + j]
                    p += ow_n



def _tile_planes(out_spatial, k_rows: int, dtype, workspace_bytes=None) -> int:
    """Output depth planes per tile: as many as fit ``workspace_bytes`` (None: the
    ``DISTTENSOR_CONV_WORKSPACE_MB`` bound), at least one, at most all."""
    od_n, oh_n, ow_n = out_spatial
    limit = _workspace_bytes() if workspace_bytes is None else int(workspace_bytes)
    step = limit // max(1, k_rows * oh_n * ow_n * np.dtype(dtype).itemsize)
    return max(1, min(step, od_n))


def _column_tiles(out_spatial, k_rows: int, dtype, workspace_bytes=None) -> list:
    """``((d0, d1), columns, cols)`` per tile of whole output depth planes ``[d0, d1)`` whose
    column matrix fits the workspace bound (:func:`_tile_planes`): ``columns`` slices the
    tile's output positions (``d0*H*W`` to ``d1*H*W``) and ``cols`` is a
    ``(k_rows, d1*H*W - d0*H*W)`` view of the shared workspace (all tiles share it: use one at
    a time)."""
    od_n, oh_n, ow_n = out_spatial
    plane = oh_n * ow_n
    step = _tile_planes(out_spatial, k_rows, dtype, workspace_bytes)
    buf = _scratch.get("columns", (k_rows * step * plane,), dtype)
    return [((d0, d1), slice(d0 * plane, d1 * plane),
             buf[:k_rows * (d1 - d0) * plane].reshape(k_rows, (d1 - d0) * plane))
            for d0, d1 in ((d0, min(d0 + step, od_n)) for d0 in range(0, od_n, step))]


# -- the three passes' operands ---------------------------------------------------------------
class _Sizes(NamedTuple):
    """One convolution's sizes as the im2col kernels use them."""

    n_n: int        # samples
    cg: int         # input channels per group
    cog: int        # output channels per group
    k_rows: int     # rows of the column matrix, cg * prod(kernel)
    out_sp: tuple   # output spatial extent
    geo: tuple      # kernel, stride, dilation, pad_lo: the geometry arguments of _im2col/_col2im


def _sizes(n_n, cin, cout, groups, kernel, out_sp, stride, dilation, pad_lo) -> _Sizes:
    cg, cog = cin // groups, cout // groups
    return _Sizes(n_n, cg, cog, cg * int(np.prod(kernel)), tuple(out_sp),
                  (*kernel, *stride, *dilation, *pad_lo))


def _forward_setup(x, w, stride, dilation, pad_lo, pad_hi, groups):
    """``(x, w, y, sizes)``: the checked operands, the uninitialised output and the sizes."""
    x, w, dtype, (stride, dilation, pad_lo, pad_hi), out_sp = forward_operands(
        x, w, stride, dilation, pad_lo, pad_hi, groups)
    n_n, cin = x.shape[:2]
    cout = w.shape[0]
    y = np.empty((n_n, cout) + out_sp, dtype=dtype)
    return x, w, y, _sizes(n_n, cin, cout, groups, w.shape[2:], out_sp, stride, dilation, pad_lo)


def _data_setup(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups):
    """``(dy, w, dx, sizes)``: the checked operands, the zeroed input gradient and the sizes."""
    dy, w, dtype, in_spatial, (stride, dilation, pad_lo, pad_hi) = data_operands(
        dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups)
    n_n, cout = dy.shape[:2]
    cin = w.shape[1] * groups
    dx = np.zeros((n_n, cin) + in_spatial, dtype=dtype)
    return dy, w, dx, _sizes(n_n, cin, cout, groups, w.shape[2:], dy.shape[2:], stride,
                             dilation, pad_lo)


def _filter_setup(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups):
    """``(x, dy, dw, sizes)``: the checked operands, the zeroed filter gradient as ``(groups,
    Cout/groups, K)`` and the sizes."""
    x, dy, dtype, kernel, (stride, dilation, pad_lo, pad_hi), out_sp = filter_operands(
        x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups)
    n_n, cin = x.shape[:2]
    s = _sizes(n_n, cin, dy.shape[1], groups, kernel, out_sp, stride, dilation, pad_lo)
    return x, dy, np.zeros((groups, s.cog, s.k_rows), dtype=dtype), s


def _filter_result(dw, dy, kernel, s: _Sizes):
    """``dw`` of :func:`_filter_setup` as ``(Cout, Cin // groups, *kernel)``."""
    return dw.reshape((dy.shape[1], s.cg) + tuple(int(k) for k in kernel))


def _transposed_weights(w, groups, s: _Sizes):
    """``w`` as ``(groups, K, Cout/groups)`` matrices, C-contiguous (backward data's GEMM)."""
    return np.ascontiguousarray(w.reshape(groups, s.cog, s.k_rows).transpose(0, 2, 1))


# -- tiled im2col: one GEMM per sample, group and column tile ---------------------------------
def conv_forward(x, w, stride, dilation, pad_lo, pad_hi, groups=1, *, workspace_bytes=None):
    """``y[n, co] = sum_{ci in group(co), k} w[co, ci, k] * xpad[n, ci, o*stride + k*dilation]``.

    ``workspace_bytes``: bound on the column tile (None: ``DISTTENSOR_CONV_WORKSPACE_MB``);
    a tile holds at least one output depth plane, whatever the bound."""
    x, w, y, s = _forward_setup(x, w, stride, dilation, pad_lo, pad_hi, groups)
    if y.size == 0:
        return y
    cg, cog, out_sp = s.cg, s.cog, s.out_sp
    wmat = w.reshape(groups, cog, s.k_rows)
    ymat = y.reshape(s.n_n, groups, cog, -1)
    tiles = _column_tiles(out_sp, s.k_rows, y.dtype, workspace_bytes)
    for n in range(s.n_n):
        for g in range(groups):
            xg = x[n, g * cg:(g + 1) * cg]
            for (d0, d1), cs, cols in tiles:
                _im2col(xg, cols, d0, d1, out_sp[1], out_sp[2], *s.geo)
                np.matmul(wmat[g], cols, out=ymat[n, g, :, cs])
    return y


def conv_backward_data(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups=1, *,
                       workspace_bytes=None):
    """Gradient of ``sum(conv_forward(x, w) * dy)`` with respect to ``x`` (N, Cin, *in_spatial).
    ``workspace_bytes`` as in :func:`conv_forward`."""
    dy, w, dx, s = _data_setup(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups)
    if dy.size == 0 or dx.size == 0:
        return dx
    cg, cog, out_sp = s.cg, s.cog, s.out_sp
    wmat_t = _transposed_weights(w, groups, s)
    dymat = dy.reshape(s.n_n, groups, cog, -1)
    tiles = _column_tiles(out_sp, s.k_rows, dx.dtype, workspace_bytes)
    for n in range(s.n_n):
        for g in range(groups):
            dxg = dx[n, g * cg:(g + 1) * cg]
            for (d0, d1), cs, cols in tiles:
                np.matmul(wmat_t[g], dymat[n, g, :, cs], out=cols)
                _col2im(cols, dxg, d0, d1, out_sp[1], out_sp[2], *s.geo)
    return dx


def conv_backward_filter(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups=1, *,
                         workspace_bytes=None):
    """Gradient of ``sum(conv_forward(x, w) * dy)`` with respect to ``w``
    (Cout, Cin // groups, *kernel).  ``workspace_bytes`` as in :func:`conv_forward`."""
    x, dy, dw, s = _filter_setup(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups)
    if dy.size and x.size:
        cg, cog, out_sp = s.cg, s.cog, s.out_sp
        dymat = dy.reshape(s.n_n, groups, cog, -1)
        tiles = _column_tiles(out_sp, s.k_rows, dw.dtype, workspace_bytes)
        part = np.empty((cog, s.k_rows), dtype=dw.dtype)
        for n in range(s.n_n):
            for g in range(groups):
                xg = x[n, g * cg:(g + 1) * cg]
                for (d0, d1), cs, cols in tiles:
                    _im2col(xg, cols, d0, d1, out_sp[1], out_sp[2], *s.geo)
                    np.matmul(dymat[n, g, :, cs], cols.T, out=part)
                    dw[g] += part
    return _filter_result(dw, dy, kernel, s)


# -- batched im2col: one GEMM per group over all samples --------------------------------------
def _batched_buffers(s: _Sizes, dtype):
    """Views ``cols (k_rows, N*P)`` and ``packed (cog, N*P)`` of this thread's scratch."""
    cols = s.n_n * int(np.prod(s.out_sp))
    buf = _scratch.get("columns", ((s.k_rows + s.cog) * cols,), dtype)
    split = s.k_rows * cols
    return buf[:split].reshape(s.k_rows, cols), buf[split:].reshape(s.cog, cols)


def conv_forward_batched(x, w, stride, dilation, pad_lo, pad_hi, groups=1):
    """:func:`conv_forward` with the columns of all samples in one GEMM per group."""
    x, w, y, s = _forward_setup(x, w, stride, dilation, pad_lo, pad_hi, groups)
    if y.size == 0:
        return y
    cg, cog, out_sp, n_n = s.cg, s.cog, s.out_sp, s.n_n
    p_n = int(np.prod(out_sp))
    wmat = w.reshape(groups, cog, s.k_rows)
    cols, packed = _batched_buffers(s, y.dtype)
    yv = y.reshape(n_n, groups, cog, p_n)
    for g in range(groups):
        for n in range(n_n):
            _im2col(x[n, g * cg:(g + 1) * cg], cols[:, n * p_n:(n + 1) * p_n], 0, out_sp[0],
                    out_sp[1], out_sp[2], *s.geo)
        np.matmul(wmat[g], cols, out=packed)
        yv[:, g] = packed.reshape(cog, n_n, p_n).transpose(1, 0, 2)
    return y


def conv_backward_data_batched(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups=1):
    """:func:`conv_backward_data` with one ``w^T @ dy`` GEMM per group over all samples."""
    dy, w, dx, s = _data_setup(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups)
    if dy.size == 0 or dx.size == 0:
        return dx
    cg, cog, out_sp, n_n = s.cg, s.cog, s.out_sp, s.n_n
    p_n = int(np.prod(out_sp))
    wmat_t = _transposed_weights(w, groups, s)
    cols, packed = _batched_buffers(s, dx.dtype)
    dyv = dy.reshape(n_n, groups, cog, p_n)
    for g in range(groups):
        packed.reshape(cog, n_n, p_n)[...] = dyv[:, g].transpose(1, 0, 2)
        np.matmul(wmat_t[g], packed, out=cols)
        for n in range(n_n):
            _col2im(cols[:, n * p_n:(n + 1) * p_n], dx[n, g * cg:(g + 1) * cg], 0, out_sp[0],
                    out_sp[1], out_sp[2], *s.geo)
    return dx


def conv_backward_filter_batched(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups=1):
    """:func:`conv_backward_filter` with one ``dy @ cols^T`` GEMM per group over all samples."""
    x, dy, dw, s = _filter_setup(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups)
    if dy.size and x.size:
        cg, cog, out_sp, n_n = s.cg, s.cog, s.out_sp, s.n_n
        p_n = int(np.prod(out_sp))
        cols, packed = _batched_buffers(s, dw.dtype)
        dyv = dy.reshape(n_n, groups, cog, p_n)
        for g in range(groups):
            for n in range(n_n):
                _im2col(x[n, g * cg:(g + 1) * cg], cols[:, n * p_n:(n + 1) * p_n], 0,
                        out_sp[0], out_sp[1], out_sp[2], *s.geo)
            packed.reshape(cog, n_n, p_n)[...] = dyv[:, g].transpose(1, 0, 2)
            np.matmul(packed, cols.T, out=dw[g])
    return _filter_result(dw, dy, kernel, s)


# -- workspace sizes and modelled times (the planner's view) ----------------------------------
def _geometry_sizes(x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups):
    """``(k_rows, cog, out_spatial)`` of a convolution (k_rows = Cin/groups * prod(kernel))."""
    kernel = tuple(int(k) for k in w_shape[2:])
    out_sp = conv_out_shape(tuple(x_shape[2:]), kernel, stride, dilation, pad_lo, pad_hi)
    return int(w_shape[1]) * int(np.prod(kernel)), int(w_shape[0]) // groups, out_sp


def tiled_workspace_bytes(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                          dtype, workspace_bytes=None) -> int:
    """Scratch bytes :func:`conv_forward` / :func:`conv_backward_data` /
    :func:`conv_backward_filter` (``pass_`` ``"forward"``, ``"backward_data"``,
    ``"backward_filter"``) use for these shapes with tile bound ``workspace_bytes``: one column
    tile (independent of N), plus the ``(Cout/groups, K)`` partial product of backward filter."""
    k_rows, cog, out_sp = _geometry_sizes(x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                                          groups)
    item = np.dtype(dtype).itemsize
    planes = _tile_planes(out_sp, k_rows, dtype, workspace_bytes)
    extra = cog * k_rows if pass_ == "backward_filter" else 0
    return (k_rows * planes * out_sp[1] * out_sp[2] + extra) * item


def tiled_seconds(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups, dtype,
                  workspace_bytes=None) -> float:
    """Modelled seconds of the tiled kernels (:mod:`.conv_cost` units): per sample and group,
    one GEMM per column tile plus packing the columns."""
    k_rows, cog, out_sp = _geometry_sizes(x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                                          groups)
    plane = out_sp[1] * out_sp[2]
    planes = _tile_planes(out_sp, k_rows, np.dtype(dtype), workspace_bytes)
    tiles = -(-out_sp[0] // planes)
    per_tile = gemm_seconds(cog, k_rows, planes * plane)
    pack = k_rows * out_sp[0] * plane * np.dtype(dtype).itemsize / MEM_BW
    return int(x_shape[0]) * groups * (tiles * per_tile + pack)


def batched_workspace_bytes(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                            dtype) -> int:
    """Scratch bytes of the ``*_batched`` kernels for ``x_shape`` (its N samples at once): the
    ``(K, N*P)`` column matrix and the ``(Cout/groups, N*P)`` packed output (or ``dy``)."""
    k_rows, cog, out_sp = _geometry_sizes(x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                                          groups)
    cols = int(x_shape[0]) * int(np.prod(out_sp))
    return (k_rows + cog) * cols * np.dtype(dtype).itemsize


def batched_seconds(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                    dtype) -> float:
    """Modelled seconds of the ``*_batched`` kernels (:mod:`.conv_cost` units): one GEMM per
    group over the columns of all samples, plus packing columns and output."""
    k_rows, cog, out_sp = _geometry_sizes(x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                                          groups)
    cols = int(x_shape[0]) * math.prod(out_sp)
    pack = (k_rows + 2 * cog) * cols * np.dtype(dtype).itemsize / MEM_BW
    return groups * (gemm_seconds(cog, k_rows, cols) + pack)
