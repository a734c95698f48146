"""Distributed ops with a Compressed Sparse Blocks weight (:class:`disttensor.sparse.CSBMatrix`),
forward and backward side by side: the kernels of pruned layers.

* :func:`sparse_dense_forward` / :func:`sparse_dense_backward`: ``y = x @ W.T + b`` on
  ``(N, F)`` blocks (features whole, samples possibly split), computed on the ``(features,
  batch)`` layout as ``Y.T = W @ X.T`` (CSB block-rows), the data gradient as ``W.T @ dY.T``
  (block-columns of the same structure) and the weight gradient as SDDMM: the values of
  ``dY.T @ X`` at W's nonzeros, in W's storage order.
* :func:`sparse_conv_forward` / :func:`sparse_conv_backward`: a 3-D convolution (stride,
  padding, dilation; ``groups=1``) with a CSB weight of shape ``(Cout, Cin * prod(K))``
  (PyTorch's weight ``(Cout, Cin, *K)`` flattened).  A 1x1x1 kernel multiplies the local
  block directly (no halo: the block is the read window); other kernels exchange the halo
  the window needs (:func:`disttensor.ops._spatial.halo_input`, adjoint
  :func:`~disttensor.ops._spatial.halo_gradient`) and run per sample the library's im2col
  (:mod:`disttensor.ops.local.cpu.conv_im2col`, CPU), ``W @ cols``, and for the backward
  ``W.T @ dY`` with col2im and SDDMM against the columns.

Weight-value gradients are summed over the ranks that hold different parts of ``x``
(:func:`~disttensor.ops._spatial.param_comm`) unless ``reduce=False`` (per-rank partial sums
for a bucketing reducer).  Every entry point agrees its arguments (arrays' metadata, the
weight's shape, nnz and dtype, the geometry) before any message; collective.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.array import DistArray
from ..core.backend import array_module
from ..core.comm import allreduce, collective
from ..core.distribution import Distribution
from ..core.entry import agreed, collective_entry
from ..ops._spatial import (array_key, check_gradient_layout, halo_gradient, halo_input,
                            param_comm, spatial_windows, window_plan, with_channels)
from ..ops.window import normalize_padding, normalize_tuple
from ..sparse import CSBMatrix, sddmm

__all__ = ["SparseDenseSaved", "sparse_dense_forward", "sparse_dense_backward",
           "SparseConvSaved", "sparse_conv_forward", "sparse_conv_backward", "csb_key"]


def csb_key(a) -> str:
    """A CSB weight as the ranks agree on it (shape, nnz, dtype)."""
    if not isinstance(a, CSBMatrix):
        return f"not a CSBMatrix: {type(a).__name__}"
    return f"CSB(shape={a.shape}, nnz={a.nnz}, dtype={a.dtype.name})"


def _as_dtype(a: CSBMatrix, dtype) -> CSBMatrix:
    return a if a.dtype == dtype else a.astype(dtype)


def _reduce(g, x: DistArray, reduce: bool):
    return allreduce(param_comm(x), g, "sum") if reduce else g


# -- dense (fully connected) --------------------------------------------------------------------
@dataclass
class SparseDenseSaved:
    x: DistArray
    a: CSBMatrix
    has_bias: bool


def _dense_out(d: Distribution, fout: int) -> Distribution:
    return Distribution((d.shape[0], fout), d.grid_dims, d.split, [d.split_sizes[0], None])


@collective_entry
def sparse_dense_forward(x: DistArray, a: CSBMatrix, b=None):
    """``y = x @ a.T + b`` for ``x`` ``(N, F)`` (feature axis whole), ``a`` a CSB ``(Fout,
    F)``, ``b`` ``(Fout,)``; ``y`` ``(N, Fout)`` split like ``x``.  Returns ``(y, saved)``."""
    with agreed(x.grid.cart, "sparse_dense_forward", x=x, a=csb_key(a), b=array_key(b)):
        if not isinstance(a, CSBMatrix):
            raise TypeError(f"sparse_dense: the weight must be a CSBMatrix, got "
                            f"{type(a).__name__}")
        if x.ndim != 2 or x.split[1] is not None:
            raise ValueError(f"sparse_dense needs (N, F) input with the feature axis not "
                             f"split, got shape {x.shape} split {x.split}")
        if a.shape[1] != x.shape[1]:
            raise ValueError(f"sparse_dense: weight {a.shape} does not fit {x.shape[1]} "
                             "features")
        if b is not None and tuple(b.shape) != (a.shape[0],):
            raise ValueError(f"sparse_dense: bias must have shape ({a.shape[0]},), got "
                             f"{tuple(b.shape)}")
    xp = array_module(x.local)
    a = _as_dtype(a, x.dtype)
    y = xp.ascontiguousarray((a @ xp.ascontiguousarray(x.local.T)).T)
    if b is not None:
        y += b.astype(x.dtype, copy=False)
    return DistArray(y, _dense_out(x.distribution, a.shape[0]), x.grid), \
        SparseDenseSaved(x, a, b is not None)


@collective_entry
def sparse_dense_backward(saved: SparseDenseSaved, dy: DistArray, need_dx: bool = True,
                          need_dw: bool = True, reduce: bool = True):
    """``(dx, dvalues, db)``: ``dx = dy @ a`` (via ``a.T @ dy.T``), ``dvalues`` the SDDMM
    ``(dy.T @ x)`` at ``a``'s nonzeros (storage order), ``db = dy.sum(0)``; the last two
    summed over the ranks holding different samples unless ``reduce=False``."""
    x, a = saved.x, saved.a
    with agreed(dy.grid.cart, "sparse_dense_backward", dy=dy, need_dx=bool(need_dx),
                need_dw=bool(need_dw), reduce=bool(reduce)):
        check_gradient_layout(dy, _dense_out(x.distribution, a.shape[0]), "sparse_dense")
    xp = array_module(dy.local)
    dyt = xp.ascontiguousarray(dy.local.T)
    dx = DistArray(xp.ascontiguousarray((a.T @ dyt).T), x.distribution, x.grid) \
        if need_dx else None
    dv = db = None
    if need_dw:
        dv = _reduce(sddmm(a, dyt, xp.ascontiguousarray(x.local.T)), x, reduce)
        if saved.has_bias:
            db = _reduce(dy.local.sum(axis=0), x, reduce)
    return dx, dv, db


# -- 3-D convolution ----------------------------------------------------------------------------
@dataclass
class SparseConvSaved:
    xin: DistArray          # the input with its halo (the input itself for 1x1x1)
    x_dist: Distribution
    plan: object            # WindowPlan
    a: CSBMatrix
    kernel: tuple
    geo: tuple              # stride, dilation (3 each)
    has_bias: bool


def _im2col_kernels():
    from ..ops.local.cpu import conv_im2col
    return conv_im2col


def _columns(xs, kernel, out_sp, geo, pad_lo):
    """``(Cin * prod(kernel), prod(out_sp))`` columns of one sample's read window ``xs``."""
    c = xs.shape[0]
    cols = np.empty((c * int(np.prod(kernel)), int(np.prod(out_sp))), dtype=xs.dtype)
    if cols.size:
        _im2col_kernels()._im2col(np.ascontiguousarray(xs), cols, 0, out_sp[0], out_sp[1],
                                  out_sp[2], *kernel, *geo[0], *geo[1], *pad_lo)
    return cols


def _pointwise(kernel, geo, plan) -> bool:
    return kernel == (1, 1, 1) and geo == ((1, 1, 1), (1, 1, 1)) and \
        not any(plan.pad_lo) and not any(plan.pad_hi) and not plan.needs_exchange


@collective_entry
def sparse_conv_forward(x: DistArray, a: CSBMatrix, kernel, b=None, stride=1, padding=0,
                        dilation=1):
    """Convolution of ``x`` ``(N, Cin, D, H, W)`` with the CSB weight ``a`` ``(Cout, Cin *
    prod(kernel))``; ``y`` ``(N, Cout, *out)`` distributed as :func:`disttensor.ops.conv_forward`
    distributes its output.  Returns ``(y, saved)``."""
    with agreed(x.grid.cart, "sparse_conv_forward", x=x, a=csb_key(a), b=array_key(b),
                kernel=repr(kernel), stride=repr(stride), padding=repr(padding),
                dilation=repr(dilation)):
        if not isinstance(a, CSBMatrix):
            raise TypeError(f"sparse_conv: the weight must be a CSBMatrix, got "
                            f"{type(a).__name__}")
        if x.ndim != 5 or x.split[1] is not None:
            raise ValueError(f"sparse_conv needs (N, C, D, H, W) input with the channel axis "
                             f"not split, got shape {x.shape} split {x.split}")
        kernel = normalize_tuple(kernel, 3, "kernel_size")
        stride = normalize_tuple(stride, 3, "stride")
        dilation = normalize_tuple(dilation, 3, "dilation")
        pads = normalize_padding(padding, 3, kernel, dilation)
        if a.shape[1] != x.shape[1] * int(np.prod(kernel)):
            raise ValueError(f"sparse_conv: weight {a.shape} does not fit {x.shape[1]} input "
                             f"channels and kernel {kernel}")
        if b is not None and tuple(b.shape) != (a.shape[0],):
            raise ValueError(f"sparse_conv: bias must have shape ({a.shape[0]},), got "
                             f"{tuple(b.shape)}")
        plan = window_plan(x.distribution, spatial_windows(3, kernel, stride, dilation, pads),
                           x.grid.coords)
        out_dist = with_channels(plan.out_dist, a.shape[0])
        geo = (stride, dilation)
        if not _pointwise(kernel, geo, plan) and x.device != "cpu":
            raise NotImplementedError("sparse_conv: kernels other than 1x1x1 run on the CPU "
                                      "only (im2col)")
    a = _as_dtype(a, x.dtype)
    xp = array_module(x.local)
    out_shape = out_dist.block_shape(x.grid.coords)
    if _pointwise(kernel, geo, plan):
        xin, xl = x, x.local
        n, c = xl.shape[:2]
        xm = xp.ascontiguousarray(xp.moveaxis(xl, 1, 0).reshape(c, -1))
        y = xp.ascontiguousarray(xp.moveaxis((a @ xm).reshape((a.shape[0], n) + xl.shape[2:]),
                                             0, 1))
    else:
        xin = halo_input(x, plan)
        y = np.zeros(out_shape, dtype=x.dtype)
        with collective(x.grid.cart):
            if plan.has_output and y.size:
                win = xin.buffer[plan.read]
                for s in range(win.shape[0]):
                    cols = _columns(win[s], kernel, out_shape[2:], geo, plan.pad_lo)
                    y[s] = (a @ cols).reshape(out_shape[1:])
    if b is not None and y.size:
        y += b.reshape(1, -1, 1, 1, 1).astype(y.dtype, copy=False)
    return DistArray(y, out_dist, x.grid), \
        SparseConvSaved(xin, x.distribution, plan, a, kernel, geo, b is not None)


@collective_entry
def sparse_conv_backward(saved: SparseConvSaved, dy: DistArray, need_dx: bool = True,
                         need_dw: bool = True, reduce: bool = True):
    """``(dx, dvalues, db)`` of :func:`sparse_conv_forward`: ``dx`` through ``a.T @ dY`` (and
    col2im plus the reverse halo exchange), ``dvalues`` by SDDMM against the input columns,
    summed over the ranks holding different parts of ``x`` unless ``reduce=False``."""
    a, plan, x = saved.a, saved.plan, saved.xin
    out_dist = with_channels(plan.out_dist, a.shape[0])
    with agreed(dy.grid.cart, "sparse_conv_backward", dy=dy, need_dx=bool(need_dx),
                need_dw=bool(need_dw), reduce=bool(reduce)):
        check_gradient_layout(dy, out_dist, "sparse_conv")
    xp = array_module(dy.local)
    g = dy.local
    dx = dv = db = None
    if _pointwise(saved.kernel, saved.geo, plan):
        n, co = g.shape[:2]
        gm = xp.ascontiguousarray(xp.moveaxis(g, 1, 0).reshape(co, -1))
        if need_dx:
            xl = x.local
            dxm = (a.T @ gm).reshape((a.shape[1], n) + xl.shape[2:])
            dx = DistArray(xp.ascontiguousarray(xp.moveaxis(dxm, 0, 1)), saved.x_dist, dy.grid)
        if need_dw:
            xm = xp.ascontiguousarray(xp.moveaxis(x.local, 1, 0).reshape(a.shape[1], -1))
            dv = sddmm(a, gm, xm)
    else:
        win = x.buffer[plan.read] if plan.has_output else None
        dwin = np.zeros(win.shape, dtype=g.dtype) if need_dx and win is not None else None
        dv = np.zeros(a.nnz, dtype=a.dtype) if need_dw else None
        with collective(dy.grid.cart):
            if win is not None and g.size:
                k = _im2col_kernels()
                out_sp = g.shape[2:]
                for s in range(g.shape[0]):
                    gs = np.ascontiguousarray(g[s].reshape(a.shape[0], -1))
                    if need_dw:
                        dv += sddmm(a, gs, _columns(win[s], saved.kernel, out_sp, saved.geo,
                                                    plan.pad_lo))
                    if need_dx:
                        k._col2im(np.ascontiguousarray(a.T @ gs), dwin[s], 0, out_sp[0],
                                  out_sp[1], out_sp[2], *saved.kernel, *saved.geo[0],
                                  *saved.geo[1], *plan.pad_lo)
        if need_dx:
            local = dwin if dwin is not None else np.zeros((0,) * 5, dtype=g.dtype)
            dx = halo_gradient(local, saved.x_dist, dy.grid, plan)
    if need_dw:
        dv = _reduce(dv, x, reduce)
        if saved.has_bias:
            db = _reduce(g.sum(axis=(0, 2, 3, 4)), x, reduce)
    return dx, dv, db
