"""CPU convolution kernels (per rank, no MPI): im2col + BLAS GEMM in bounded tiles, Numba packs.

Contract (shared with :mod:`.gpu`): exactly three spatial axes, layout ``(N, C, D, H, W)``;
``stride``, ``dilation``, ``pad_lo``, ``pad_hi`` are 3-tuples of ints, padding may be
asymmetric and is zero; cross-correlation as in PyTorch, ``w`` of shape
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
:mod:`.microbatch` chooses between them per layer, pass and micro-batch.
"""
from __future__ import annotations

import os
import threading

import numpy as np
from numba import njit, prange

__all__ = ["conv_forward", "conv_backward_data", "conv_backward_filter", "conv_out_shape",
           "conv_forward_batched", "conv_backward_data_batched", "conv_backward_filter_batched",
           "tiled_workspace_bytes", "batched_workspace_bytes"]


def _workspace_bytes() -> int:
    return int(float(os.environ.get("DISTTENSOR_CONV_WORKSPACE_MB", "64")) * 2**20)


_scratch = threading.local()


def _workspace(nelems: int, dtype) -> np.ndarray:
    """A reusable 1-d scratch buffer of at least ``nelems`` (per thread and dtype): a fresh
    64 MiB buffer per call costs its page faults every time (~25 ms here)."""
    key = np.dtype(dtype).str
    bufs = getattr(_scratch, "bufs", None)
    if bufs is None:
        bufs = _scratch.bufs = {}
    buf = bufs.get(key)
    if buf is None or buf.size < nelems:
        buf = bufs[key] = np.empty(nelems, dtype=dtype)
    return buf[:nelems]


def conv_out_shape(in_spatial, kernel, stride, dilation, pad_lo, pad_hi) -> tuple[int, ...]:
    out = []
    for n, k, s, d, lo, hi in zip(in_spatial, kernel, stride, dilation, pad_lo, pad_hi):
        if s < 1 or d < 1 or k < 1:
            raise ValueError(f"stride {s}, dilation {d} and kernel extent {k} must be >= 1")
        span = d * (k - 1) + 1
        if n + lo + hi < span:
            raise ValueError(f"input extent {n} padded by ({lo}, {hi}) is shorter than the "
                             f"kernel span {span}")
        out.append((n + lo + hi - span) // s + 1)
    return tuple(out)


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


def float_dtype(*arrays) -> np.dtype:
    """The common dtype of the operands, which the CPU kernels take as float32 or float64."""
    dtype = np.result_type(*(a.dtype for a in arrays))
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"CPU convolution kernels take float32 or float64 arrays, got "
                        f"{', '.join(str(a.dtype) for a in arrays)} (use astype; float16 and "
                        "bfloat16 are for GPU blocks)")
    return dtype


def check_shapes(x_shape, w_shape, groups) -> None:
    """Raise ``ValueError`` unless ``x_shape`` is ``(N, C, D, H, W)``, ``w_shape`` a 5-d
    ``(Cout, C // groups, kD, kH, kW)`` and ``groups`` divides both channel counts."""
    if len(x_shape) != 5 or len(w_shape) != 5:
        raise ValueError(f"local conv kernels take (N, C, D, H, W) inputs and 5-d weights, got "
                         f"{tuple(x_shape)} and {tuple(w_shape)}")
    if groups < 1 or x_shape[1] % groups or w_shape[0] % groups:
        raise ValueError(f"groups={groups} must divide the input channels {x_shape[1]} and the "
                         f"output channels {w_shape[0]}")
    if w_shape[1] * groups != x_shape[1]:
        raise ValueError(f"weight {tuple(w_shape)} expects {w_shape[1] * groups} input channels "
                         f"with groups={groups}, input has {x_shape[1]}")


def _ints(*tuples) -> tuple:
    return tuple(tuple(int(v) for v in t) for t in tuples)


def forward_operands(x, w, stride, dilation, pad_lo, pad_hi, groups):
    """The checked operands of a forward call, shared by every CPU algorithm:
    ``(x, w, dtype, (stride, dilation, pad_lo, pad_hi), out_spatial)`` with ``x`` and ``w``
    C-contiguous in their common float dtype and the geometry as int tuples."""
    check_shapes(x.shape, w.shape, groups)
    dtype = float_dtype(x, w)
    x = np.ascontiguousarray(x, dtype=dtype)
    w = np.ascontiguousarray(w, dtype=dtype)
    geo = _ints(stride, dilation, pad_lo, pad_hi)
    return x, w, dtype, geo, conv_out_shape(x.shape[2:], w.shape[2:], *geo)


def data_operands(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups):
    """The checked operands of a backward-data call: ``(dy, w, dtype, in_spatial, geo)``
    (``dy`` must have the convolution's output extent)."""
    dtype = float_dtype(dy, w)
    dy = np.ascontiguousarray(dy, dtype=dtype)
    w = np.ascontiguousarray(w, dtype=dtype)
    in_spatial, = _ints(in_spatial)
    geo = _ints(stride, dilation, pad_lo, pad_hi)
    check_shapes((dy.shape[0], w.shape[1] * groups) + in_spatial, w.shape, groups)
    out_sp = conv_out_shape(in_spatial, w.shape[2:], *geo)
    if tuple(dy.shape[2:]) != out_sp:
        raise ValueError(f"dy has spatial shape {dy.shape[2:]}, the convolution gives {out_sp}")
    return dy, w, dtype, in_spatial, geo


def filter_operands(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups):
    """The checked operands of a backward-filter call: ``(x, dy, dtype, kernel, geo,
    out_spatial)`` (``dy`` must be ``(N, Cout) + out_spatial``)."""
    dtype = float_dtype(x, dy)
    x = np.ascontiguousarray(x, dtype=dtype)
    dy = np.ascontiguousarray(dy, dtype=dtype)
    kernel, = _ints(kernel)
    geo = _ints(stride, dilation, pad_lo, pad_hi)
    n_n, cin = x.shape[:2]
    cout = dy.shape[1]
    check_shapes(x.shape, (cout, cin // max(groups, 1)) + kernel, groups)
    out_sp = conv_out_shape(x.shape[2:], kernel, *geo)
    if tuple(dy.shape[2:]) != out_sp or dy.shape[0] != n_n:
        raise ValueError(f"dy has shape {dy.shape}, the convolution gives {(n_n, cout) + out_sp}")
    return x, dy, dtype, kernel, geo, out_sp


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
    buf = _workspace(k_rows * step * plane, dtype)
    return [((d0, d1), slice(d0 * plane, d1 * plane),
             buf[:k_rows * (d1 - d0) * plane].reshape(k_rows, (d1 - d0) * plane))
            for d0, d1 in ((d0, min(d0 + step, od_n)) for d0 in range(0, od_n, step))]


def _geometry(kernel, stride, dilation, pad_lo):
    return (*kernel, *stride, *dilation, *pad_lo)


def conv_forward(x, w, stride, dilation, pad_lo, pad_hi, groups=1, *, workspace_bytes=None):
    """``y[n, co] = sum_{ci in group(co), k} w[co, ci, k] * xpad[n, ci, o*stride + k*dilation]``.

    ``workspace_bytes``: bound on the column tile (None: ``DISTTENSOR_CONV_WORKSPACE_MB``);
    a tile holds at least one output depth plane, whatever the bound."""
    x, w, dtype, (stride, dilation, pad_lo, pad_hi), out_sp = forward_operands(
        x, w, stride, dilation, pad_lo, pad_hi, groups)
    n_n, cin = x.shape[:2]
    cout = w.shape[0]
    kernel = w.shape[2:]
    y = np.empty((n_n, cout) + out_sp, dtype=dtype)
    if y.size == 0:
        return y
    cg, cog = cin // groups, cout // groups
    k_rows = cg * int(np.prod(kernel))
    wmat = w.reshape(groups, cog, k_rows)
    geo = _geometry(kernel, stride, dilation, pad_lo)
    ymat = y.reshape(n_n, groups, cog, -1)
    tiles = _column_tiles(out_sp, k_rows, dtype, workspace_bytes)
    for n in range(n_n):
        for g in range(groups):
            xg = x[n, g * cg:(g + 1) * cg]
            for (d0, d1), cs, cols in tiles:
                _im2col(xg, cols, d0, d1, out_sp[1], out_sp[2], *geo)
                np.matmul(wmat[g], cols, out=ymat[n, g, :, cs])
    return y


def conv_backward_data(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups=1, *,
                       workspace_bytes=None):
    """Gradient of ``sum(conv_forward(x, w) * dy)`` with respect to ``x`` (N, Cin, *in_spatial).
    ``workspace_bytes`` as in :func:`conv_forward`."""
    dy, w, dtype, in_spatial, (stride, dilation, pad_lo, pad_hi) = data_operands(
        dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups)
    n_n, cout = dy.shape[:2]
    cg, cog = w.shape[1], cout // groups
    cin = cg * groups
    kernel = w.shape[2:]
    out_sp = tuple(dy.shape[2:])
    dx = np.zeros((n_n, cin) + in_spatial, dtype=dtype)
    if dy.size == 0 or dx.size == 0:
        return dx
    k_rows = cg * int(np.prod(kernel))
    wmat_t = np.ascontiguousarray(w.reshape(groups, cog, k_rows).transpose(0, 2, 1))
    geo = _geometry(kernel, stride, dilation, pad_lo)
    dymat = dy.reshape(n_n, groups, cog, -1)
    tiles = _column_tiles(out_sp, k_rows, dtype, workspace_bytes)
    for n in range(n_n):
        for g in range(groups):
            dxg = dx[n, g * cg:(g + 1) * cg]
            for (d0, d1), cs, cols in tiles:
                np.matmul(wmat_t[g], dymat[n, g, :, cs], out=cols)
                _col2im(cols, dxg, d0, d1, out_sp[1], out_sp[2], *geo)
    return dx


def conv_backward_filter(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups=1, *,
                         workspace_bytes=None):
    """Gradient of ``sum(conv_forward(x, w) * dy)`` with respect to ``w``
    (Cout, Cin // groups, *kernel).  ``workspace_bytes`` as in :func:`conv_forward`."""
    x, dy, dtype, kernel, (stride, dilation, pad_lo, pad_hi), out_sp = filter_operands(
        x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups)
    n_n, cin = x.shape[:2]
    cout = dy.shape[1]
    cg, cog = cin // groups, cout // groups
    k_rows = cg * int(np.prod(kernel))
    dw = np.zeros((groups, cog, k_rows), dtype=dtype)
    if dy.size and x.size:
        geo = _geometry(kernel, stride, dilation, pad_lo)
        dymat = dy.reshape(n_n, groups, cog, -1)
        tiles = _column_tiles(out_sp, k_rows, dtype, workspace_bytes)
        part = np.empty((cog, k_rows), dtype=dtype)
        for n in range(n_n):
            for g in range(groups):
                xg = x[n, g * cg:(g + 1) * cg]
                for (d0, d1), cs, cols in tiles:
                    _im2col(xg, cols, d0, d1, out_sp[1], out_sp[2], *geo)
                    np.matmul(dymat[n, g, :, cs], cols.T, out=part)
                    dw[g] += part
    return dw.reshape((cout, cg) + kernel)


# -- workspace sizes -------------------------------------------------------------------------
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


def batched_workspace_bytes(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                            dtype) -> int:
    """Scratch bytes of the ``*_batched`` kernels for ``x_shape`` (its N samples at once): the
    ``(K, N*P)`` column matrix and the ``(Cout/groups, N*P)`` packed output (or ``dy``)."""
    k_rows, cog, out_sp = _geometry_sizes(x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                                          groups)
    cols = int(x_shape[0]) * int(np.prod(out_sp))
    return (k_rows + cog) * cols * np.dtype(dtype).itemsize


# -- batched im2col: one GEMM per group over all samples --------------------------------------
def _batched_buffers(n_n, k_rows, cog, p_n, dtype):
    """Views ``cols (k_rows, N*P)`` and ``packed (cog, N*P)`` of this thread's scratch."""
    buf = _workspace((k_rows + cog) * n_n * p_n, dtype)
    split = k_rows * n_n * p_n
    return buf[:split].reshape(k_rows, n_n * p_n), buf[split:].reshape(cog, n_n * p_n)


def conv_forward_batched(x, w, stride, dilation, pad_lo, pad_hi, groups=1):
    """:func:`conv_forward` with the columns of all samples in one GEMM per group."""
    x, w, dtype, (stride, dilation, pad_lo, pad_hi), out_sp = forward_operands(
        x, w, stride, dilation, pad_lo, pad_hi, groups)
    n_n, cin = x.shape[:2]
    cout = w.shape[0]
    kernel = w.shape[2:]
    y = np.empty((n_n, cout) + out_sp, dtype=dtype)
    if y.size == 0:
        return y
    cg, cog = cin // groups, cout // groups
    k_rows = cg * int(np.prod(kernel))
    p_n = int(np.prod(out_sp))
    wmat = w.reshape(groups, cog, k_rows)
    geo = _geometry(kernel, stride, dilation, pad_lo)
    cols, packed = _batched_buffers(n_n, k_rows, cog, p_n, dtype)
    yv = y.reshape(n_n, groups, cog, p_n)
    for g in range(groups):
        for n in range(n_n):
            _im2col(x[n, g * cg:(g + 1) * cg], cols[:, n * p_n:(n + 1) * p_n], 0, out_sp[0],
                    out_sp[1], out_sp[2], *geo)
        np.matmul(wmat[g], cols, out=packed)
        yv[:, g] = packed.reshape(cog, n_n, p_n).transpose(1, 0, 2)
    return y


def conv_backward_data_batched(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups=1):
    """:func:`conv_backward_data` with one ``w^T @ dy`` GEMM per group over all samples."""
    dy, w, dtype, in_spatial, (stride, dilation, pad_lo, pad_hi) = data_operands(
        dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups)
    n_n, cout = dy.shape[:2]
    cg, cog = w.shape[1], cout // groups
    cin = cg * groups
    kernel = w.shape[2:]
    out_sp = tuple(dy.shape[2:])
    dx = np.zeros((n_n, cin) + in_spatial, dtype=dtype)
    if dy.size == 0 or dx.size == 0:
        return dx
    k_rows = cg * int(np.prod(kernel))
    p_n = int(np.prod(out_sp))
    wmat_t = np.ascontiguousarray(w.reshape(groups, cog, k_rows).transpose(0, 2, 1))
    geo = _geometry(kernel, stride, dilation, pad_lo)
    cols, packed = _batched_buffers(n_n, k_rows, cog, p_n, dtype)
    dyv = dy.reshape(n_n, groups, cog, p_n)
    for g in range(groups):
        packed.reshape(cog, n_n, p_n)[...] = dyv[:, g].transpose(1, 0, 2)
        np.matmul(wmat_t[g], packed, out=cols)
        for n in range(n_n):
            _col2im(cols[:, n * p_n:(n + 1) * p_n], dx[n, g * cg:(g + 1) * cg], 0, out_sp[0],
                    out_sp[1], out_sp[2], *geo)
    return dx


def conv_backward_filter_batched(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups=1):
    """:func:`conv_backward_filter` with one ``dy @ cols^T`` GEMM per group over all samples."""
    x, dy, dtype, kernel, (stride, dilation, pad_lo, pad_hi), out_sp = filter_operands(
        x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups)
    n_n, cin = x.shape[:2]
    cout = dy.shape[1]
    cg, cog = cin // groups, cout // groups
    k_rows = cg * int(np.prod(kernel))
    dw = np.zeros((groups, cog, k_rows), dtype=dtype)
    if dy.size and x.size:
        p_n = int(np.prod(out_sp))
        geo = _geometry(kernel, stride, dilation, pad_lo)
        cols, packed = _batched_buffers(n_n, k_rows, cog, p_n, dtype)
        dyv = dy.reshape(n_n, groups, cog, p_n)
        for g in range(groups):
            for n in range(n_n):
                _im2col(x[n, g * cg:(g + 1) * cg], cols[:, n * p_n:(n + 1) * p_n], 0,
                        out_sp[0], out_sp[1], out_sp[2], *geo)
            packed.reshape(cog, n_n, p_n)[...] = dyv[:, g].transpose(1, 0, 2)
            np.matmul(packed, cols.T, out=dw[g])
    return dw.reshape((cout, cg) + kernel)
