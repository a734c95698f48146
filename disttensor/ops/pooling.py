"""Distributed max and average pooling (1-D, 2-D, 3-D), forward and backward.

Same decomposition as :mod:`.convolution`: outputs are owned by the block owning their window
centre (kernel != stride and windows crossing block boundaries are fine), each rank exchanges the halo
its outputs read and pads only at global boundaries (``-inf`` for max, zero for average, as
PyTorch).  Backward routes gradients into the rank's read window, halo cells included (a max
that sits in a neighbour's cell), and the reverse halo exchange adds them to their owners.

``ceil_mode`` is extra padding past the high side (the last window must start inside the input
or the low padding, PyTorch's rule); average windows that reach into it divide by the cells up
to the declared padding only (a per-output factor, as ``divisor_override``).  Max pooling with
``dilation`` runs the dilated-window kernel of :mod:`.local.cpu.resample` (the argmax a flat
index into the read window; the last NaN of a window wins there, as PyTorch's, where the
undilated kernel keeps the first).

Both entry points agree on their arguments (mode, window geometry, the arrays' metadata) before
any message; where no halo is exchanged first (the forward of a window that reads only owned
cells, the backward always) the local kernel runs inside the agreeing block, so its failure
agreement and the argument agreement are one all-reduce.  Where no halo is exchanged at all
(windows that never cross a block boundary, such as CosmoFlow's 2x2x2 pooling of even blocks)
no data moves, and the agreement is deferred to the next one over the grid
(:func:`~disttensor.core.entry.deferrable`): no all-reduce of the pooling's own.  Where a
halo is exchanged first, a failure of the kernel after it is agreed with the next agreement
over the grid (:func:`~disttensor.core.entry.failure_deferred`): one all-reduce per call.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, deferrable, failure_deferred
from ..core.distribution import Distribution
from .local import kernels_for
from .window import normalize_padding, normalize_tuple
from ._spatial import (WindowPlan, check_extents, check_gradient_layout, check_layout,
                       halo_gradient, halo_input, lift, lift3, meaning, spatial_windows, unlift,
                       window_plan)

__all__ = ["pool", "pool_forward", "pool_backward", "PoolSaved", "max_pool", "avg_pool"]


@dataclass
class PoolSaved:
    x_dist: Distribution
    plan: WindowPlan
    mode: str
    nd: int
    kernel3: tuple
    stride3: tuple
    count_include_pad: bool
    argmax: object          # local argmax (max pooling) or None
    read_shape: tuple       # spatial shape of the read window
    factor: object = None   # avg: per-output rescaling (ceil_mode / divisor_override) or None
    dilated: bool = False   # max with dilation: argmax is a flat index into the read window


def ceil_extra(n: int, k: int, s: int, d: int, lo: int, hi: int, ceil_mode: bool) -> int:
    """Cells of extra padding past ``hi`` that PyTorch's ``ceil_mode`` adds: the output extent
    is rounded up, except that the last window must start inside the input or the low
    padding (``(m - 1) * s < n + lo``)."""
    span = d * (k - 1) + 1
    padded = n + lo + hi
    if not ceil_mode or padded < span:
        return 0
    m = -(-(padded - span) // s) + 1
    if (m - 1) * s >= n + lo:
        m -= 1
    return max(0, (m - 1) * s + span - padded)


def _avg_factor(plan: WindowPlan, coords, nd, kernel, stride, padding, extra, n_spatial,
                divisor_override, count_include_pad):
    """The per-output factor turning the kernel's average (divided by the kernel volume with
    ``count_include_pad``) into PyTorch's: windows reaching into the ``ceil_mode`` extra
    padding divide by the cells up to the declared padding only; ``divisor_override``
    divides by itself.  ``None`` where every factor is 1."""
    if divisor_override is None and (not count_include_pad or not any(extra)):
        return None
    import numpy as np
    factor = None
    for i in range(nd):
        t = 2 + i
        o0, o1 = plan.out_dist.block_range(t, plan.out_dist.axis_coord(t, coords))
        o = np.arange(o0, o1)
        start = o * stride[i] - padding[i][0]
        if divisor_override is not None:
            f = np.ones(o1 - o0)
        else:
            end = np.minimum(start + kernel[i], n_spatial[i] + padding[i][1])
            f = kernel[i] / (end - start)
        shape = [1] * (2 + nd)
        shape[t] = o1 - o0
        f = f.reshape(shape)
        factor = f if factor is None else factor * f
    if divisor_override is not None:
        factor = factor * (float(np.prod(kernel)) / divisor_override)
    return factor


def _pool_geometry(x: DistArray, mode: str, kernel, stride, padding, ceil_mode=False,
                   dilation=1, divisor_override=None):
    """Validated ``(nd, kernel, stride, padding, plan, dilation, extra)`` of a pooling (pure;
    raises on bad arguments); ``extra``: the ``ceil_mode`` padding past each high side."""
    if mode not in ("max", "avg"):
        raise ValueError(f"pooling mode must be 'max' or 'avg', got {mode!r}")
    nd = check_layout(x, f"{mode}_pool")
    check_extents(x, f"{mode}_pool")
    kernel = normalize_tuple(kernel, nd, "kernel")
    stride = kernel if stride is None else normalize_tuple(stride, nd, "stride")
    padding = normalize_padding(padding, nd, kernel)
    dilation = normalize_tuple(dilation, nd, "dilation")
    if mode == "avg" and any(d != 1 for d in dilation):
        raise ValueError("average pooling takes no dilation (as PyTorch's)")
    if divisor_override is not None and (mode != "avg" or isinstance(divisor_override, bool)
                                         or int(divisor_override) != divisor_override
                                         or divisor_override == 0):
        raise ValueError(f"divisor_override must be a non-zero int for average pooling, got "
                         f"{divisor_override!r}")
    for k, (lo, hi) in zip(kernel, padding):
        if max(lo, hi) > k // 2:
            raise ValueError(f"pooling padding {padding} must be at most half the kernel "
                             f"{kernel} on each side")
    extra = tuple(ceil_extra(n, k, s, d, lo, hi, bool(ceil_mode)) for n, k, s, d, (lo, hi)
                  in zip(x.shape[2:], kernel, stride, dilation, padding))
    padded = tuple((lo, hi + e) for (lo, hi), e in zip(padding, extra))
    windows = spatial_windows(nd, kernel, stride, dilation, padded)
    return (nd, kernel, stride, padding, window_plan(x.distribution, windows, x.grid.coords),
            dilation, extra)


def _padding_meaning(padding, nd: int, kernel):
    """``padding`` normalized against ``kernel`` (a module-level function, so that
    :func:`._spatial.meaning` caches it)."""
    return normalize_padding(padding, nd, normalize_tuple(kernel, nd, "kernel"))


def _pool_keys(x: DistArray, kernel, stride, padding, ceil_mode=False, dilation=1,
               divisor_override=None) -> dict:
    nd = x.ndim - 2
    k = meaning(normalize_tuple, kernel, nd, "kernel")
    keys = dict(kernel=k, stride=k if stride is None else meaning(normalize_tuple, stride, nd,
                                                                   "stride"),
                padding=meaning(_padding_meaning, padding, nd, kernel))
    if ceil_mode or dilation != 1 or divisor_override is not None:   # keep the common digest
        keys.update(ceil_mode=canon(ceil_mode), divisor_override=canon(divisor_override),
                    dilation=meaning(normalize_tuple, dilation, nd, "dilation"))
    return keys


@collective_entry
def pool_forward(x: DistArray, mode: str, kernel, stride=None, padding=0,
                 count_include_pad: bool = True, ceil_mode: bool = False, dilation=1,
                 divisor_override=None):
    """Pooling of ``x`` ``(N, C, *S)``: ``mode`` ``'max'`` or ``'avg'``, ``kernel`` int or per
    axis, ``stride`` defaults to ``kernel``, ``padding`` int / per-axis / (lo, hi) pairs, each
    side at most half the kernel (as PyTorch); ``ceil_mode`` (PyTorch's rule: the last window
    starts inside the input or the low padding), ``dilation`` (max pooling) and
    ``divisor_override`` (average pooling) as PyTorch's.  Collective.  Returns
    ``(y, saved)``."""
    # the geometry first (pure), so that the ranks know whether a halo exchange comes before
    # the kernel: when none does, the kernel runs inside the agreeing block (one all-reduce
    # agrees on the arguments and on a kernel failure)
    try:
        geometry, err = _pool_geometry(x, mode, kernel, stride, padding, ceil_mode, dilation,
                                       divisor_override), None
    except Exception as e:  # noqa: BLE001 - raised inside the agreed block, on every rank
        geometry, err = None, e
    direct = geometry is not None and not geometry[4].needs_exchange
    y_local = argmax = None
    read_shape = ()
    keys = {} if x.grid.cart.size <= 1 else dict(   # (one rank agrees nothing)
        x=x, mode=mode, **_pool_keys(x, kernel, stride, padding, ceil_mode, dilation,
                                     divisor_override),
        count_include_pad=canon(count_include_pad))
    # no halo (the halo width is global: alike on every rank): no data moves, the agreement
    # is deferred to the next one over the grid (a kernel failure is agreed at once)
    with (deferrable(x.grid.cart, "pool_forward", **keys) if direct
          else agreed(x.grid.cart, "pool_forward", **keys)):
        if err is not None:
            raise err
        nd, kernel, stride, padding, plan, dilation, extra = geometry
        dilated = any(d != 1 for d in dilation)
        include = count_include_pad or divisor_override is not None
        factor = _avg_factor(plan, x.grid.coords, nd, kernel, stride, padding, extra,
                             x.shape[2:], divisor_override, include) if mode == "avg" else None

        def run(xin):
            if not plan.has_output:
                return (x.xp.zeros(plan.out_dist.block_shape(x.grid.coords), dtype=x.dtype),
                        None, ())
            win = xin.buffer[plan.read]
            if dilated:
                return _dilated_max(win, plan, nd, kernel, stride, dilation, x.xp)
            y, am = kernels_for(win).pool_forward(
                lift(win, nd), mode, lift3(kernel, nd, 1), lift3(stride, nd, 1),
                lift3(plan.pad_lo, nd, 0), lift3(plan.pad_hi, nd, 0), include)
            y = unlift(y, nd)
            if factor is not None:
                y = y * x.xp.asarray(factor, dtype=y.dtype)
            return y, None if am is None else unlift(am, nd), tuple(win.shape[2:])
        if direct:
            y_local, argmax, read_shape = run(x)
    if not direct:
        xin = halo_input(x, plan)
        with failure_deferred(x.grid.cart, "pool kernel"):  # a failure raises on every rank
            y_local, argmax, read_shape = run(xin)
    y = DistArray(y_local, plan.out_dist, x.grid)
    saved = PoolSaved(x.distribution, plan, mode, nd, lift3(kernel, nd, 1), lift3(stride, nd, 1),
                      include, argmax, read_shape, factor, dilated)
    return y, saved


def _dilated_max(win, plan: WindowPlan, nd: int, kernel, stride, dilation, xp):
    """Max pooling with dilation on the read window (the CPU kernel; CuPy blocks go through
    the host): ``(y, flat argmax into the window, window spatial shape)``."""
    import numpy as np
    from .local.cpu.resample import dilated_max_forward
    host = type(win) is np.ndarray
    w = win if host else win.get()
    starts, out = [], []
    for i in range(nd):
        m = (w.shape[2 + i] + plan.pad_lo[i] + plan.pad_hi[i] - dilation[i] * (kernel[i] - 1)
             - 1) // stride[i] + 1
        out.append(max(m, 0))
        starts.append(np.arange(out[-1]) * stride[i] - plan.pad_lo[i])
    pad3 = [np.zeros(1, np.int64)] * (3 - nd)
    y, am = dilated_max_forward(lift(w, nd), (1,) * (3 - nd) + tuple(out), pad3 + starts,
                                lift3(kernel, nd, 1), lift3(dilation, nd, 1))
    y = unlift(y, nd)
    return (y if host else xp.asarray(y)), unlift(am, nd), tuple(win.shape[2:])


@collective_entry
def pool_backward(saved: PoolSaved, dy: DistArray) -> DistArray:
    """Gradient with respect to the pooling input for the output gradient ``dy`` (distributed
    like the output).  Collective (reverse halo exchange)."""
    plan, nd = saved.plan, saved.nd
    keys = dict(dy=dy, mode=saved.mode)
    with (agreed(dy.grid.cart, "pool_backward", rank_local=True, **keys)
          if plan.needs_exchange else deferrable(dy.grid.cart, "pool_backward", **keys)):
        check_gradient_layout(dy, plan.out_dist, "pooling")
        if plan.has_output and saved.dilated:
            g = _dilated_max_backward(dy.local, saved)
        elif plan.has_output:
            d = dy.local
            if saved.factor is not None:
                d = d * dy.xp.asarray(saved.factor, dtype=d.dtype)
            g = kernels_for(d).pool_backward(
                lift(d, nd), None if saved.argmax is None else lift(saved.argmax, nd),
                saved.mode, lift3(saved.read_shape, nd, 1), saved.kernel3, saved.stride3,
                lift3(plan.pad_lo, nd, 0), lift3(plan.pad_hi, nd, 0), saved.count_include_pad)
            g = unlift(g, nd)
        else:
            g = dy.local[:0]
    return halo_gradient(g, saved.x_dist, dy.grid, plan)


def _dilated_max_backward(dy, saved: PoolSaved):
    import numpy as np
    from .local.cpu.resample import adaptive_max_backward
    nd = saved.nd
    host = type(dy) is np.ndarray
    g = adaptive_max_backward(lift(dy if host else dy.get(), nd), lift(saved.argmax, nd),
                              lift3(saved.read_shape, nd, 1))
    g = unlift(g, nd)
    return g if host else __import__("cupy").asarray(g)


def pool(x: DistArray, mode: str, kernel, stride=None, padding=0,
         count_include_pad: bool = True, ceil_mode: bool = False, dilation=1,
         divisor_override=None) -> DistArray:
    """:func:`pool_forward` without the saved state."""
    return pool_forward(x, mode, kernel, stride, padding, count_include_pad, ceil_mode,
                        dilation, divisor_override)[0]


def max_pool(x: DistArray, kernel, stride=None, padding=0) -> DistArray:
    return pool(x, "max", kernel, stride, padding)


def avg_pool(x: DistArray, kernel, stride=None, padding=0, count_include_pad: bool = True
             ) -> DistArray:
    return pool(x, "avg", kernel, stride, padding, count_include_pad)
