"""Distributed interpolation (``torch.nn.functional.interpolate``), forward and backward.

Modes ``'nearest'``, ``'nearest-exact'``, ``'linear'``/``'bilinear'``/``'trilinear'`` (one,
two, three spatial axes) with ``align_corners`` ``True`` or ``False``, and ``'area'``
(PyTorch's adaptive average pooling, :mod:`.adaptive_pool`); ``size=`` or ``scale_factor=``
(fractional, per axis), ``recompute_scale_factor``, PyTorch's source coordinates and its
scale rules: with a scale factor the output extent is ``floor(n * scale)`` and the kernel maps
back with ``1 / scale`` unless ``recompute_scale_factor=True`` (then, as with ``size=``, with
``n / m``); see :mod:`.resample_index`.

**Who computes what.**  Output ``o`` along an axis belongs to the block holding the centre of
the output cell in the input's coordinates (for an integer factor ``f`` the block ``[a, b)``
owns ``[a f, b f)``, as :func:`disttensor.ops.upsample_forward`).  A block reads its outputs'
taps through an input halo (a cell or so past its ends; nearest modes usually none) filled
by the halo exchange of a window plan; the per-axis maps are sparse matrices applied to the
read window (the last spatial axis first, PyTorch's order of the weighted sums) by the local
kernels.  The backward applies the transposed matrices and returns halo cells' gradients to
their owners with the reverse halo exchange: the adjoint of the forward.

Both entry points agree on their arguments before any message (one all-reduce each).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.array import DistArray
from ..core.comm import collective
from ..core.distribution import Distribution
from ..core.entry import agreed, canon, collective_entry
from ._spatial import (WindowPlan, check_extents, check_gradient_layout, check_layout,
                       halo_gradient, halo_input)
from .adaptive_pool import adaptive_pool_backward, adaptive_pool_forward, window_plan_of
from .resample_index import interp_map, linear_taps, nearest_index


def _cpu():
    """The CPU kernels (:mod:`.local.cpu.resample`, Numba), imported on first use so that
    importing the ops does not load Numba."""
    from .local.cpu import resample
    return resample


__all__ = ["interpolate_forward", "interpolate_backward", "interpolate", "InterpolateSaved",
           "interpolate_geometry"]

_LINEAR = {"linear": 1, "bilinear": 2, "trilinear": 3}
_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear", "area")


def _per_axis(value, nd: int, what: str, kind):
    if isinstance(value, (list, tuple)):
        value = tuple(value)
        if len(value) != nd:
            raise ValueError(f"Input and {what} must have the same number of spatial "
                             f"dimensions, but got input with {nd} spatial dimensions and "
                             f"{what} {value}")
    else:
        value = (value,) * nd
    for v in value:
        if isinstance(v, bool) or not isinstance(v, kind):
            names = "ints" if kind is not float else "numbers"
            raise TypeError(f"{what} must be {names} (one or one per spatial axis), got "
                            f"{v!r} of type {type(v).__name__}")
    return value


def interpolate_geometry(shape, size=None, scale_factor=None, mode="nearest",
                         align_corners=None, recompute_scale_factor=None, antialias=False):
    """Validated ``(base_mode, out_sizes, kernel_scales, align_corners)`` of an interpolation
    of an ``(N, C, *S)`` array of global ``shape`` (pure; PyTorch's checks and messages)."""
    nd = len(shape) - 2
    if mode not in _MODES:
        raise NotImplementedError(f"interpolate: mode {mode!r} is not supported; one of "
                                  f"{', '.join(_MODES)}")
    if mode in _LINEAR and _LINEAR[mode] != nd:
        raise NotImplementedError(f"Got {nd + 2}D input, but {mode} mode needs "
                                  f"{_LINEAR[mode] + 2}D input")
    linear = mode in _LINEAR
    if align_corners is not None and not linear:
        raise ValueError("align_corners option can only be set with the interpolating modes: "
                         "linear | bilinear | bicubic | trilinear")
    if antialias:
        raise ValueError("Anti-alias option is restricted to bilinear, bicubic, and lanczos "
                         "modes and requires a 4-D tensor as input (not supported here)")
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is None and scale_factor is None:
        raise ValueError("either size or scale_factor should be defined")
    spatial = tuple(shape[2:])
    if size is not None:
        out = tuple(int(v) for v in _per_axis(size, nd, "output size", (int, np.integer)))
        scales = None
    else:
        sfs = tuple(float(v) for v in _per_axis(scale_factor, nd, "scale_factor",
                                                 (int, float, np.integer, np.floating)))
        out = tuple(int(math.floor(float(n) * s)) for n, s in zip(spatial, sfs))
        scales = None if recompute_scale_factor else sfs
    if any(m <= 0 for m in out) or any(n <= 0 for n in spatial):
        raise RuntimeError(f"Input and output sizes should be greater than 0, but got input "
                           f"{spatial} and output {out}")
    if mode == "area":
        return "area", out, None, False
    return ("linear" if linear else mode), out, scales, bool(align_corners)


@dataclass
class InterpolateSaved:
    x_dist: Distribution
    plan: WindowPlan | None
    csrs: tuple          # per spatial axis: (csr, rows, cells) of the read window's map
    area: object = None  # mode 'area': the adaptive pooling's saved state


@collective_entry
def interpolate_forward(x: DistArray, size=None, scale_factor=None, mode: str = "nearest",
                        align_corners=None, recompute_scale_factor=None, antialias=False):
    """``torch.nn.functional.interpolate`` of ``x`` ``(N, C, *S)`` (see the module docstring).
    The output is split like ``x``.  Collective.  Returns ``(y, saved)``."""
    # the plan first (pure), so that the ranks know whether a halo exchange comes before the
    # kernel: when none does (nearest modes, mostly), the kernel runs inside the agreeing
    # block (one all-reduce agrees on the arguments and on a kernel failure)
    try:
        geometry, err = _plan(x, size, scale_factor, mode, align_corners,
                              recompute_scale_factor, antialias), None
    except Exception as e:  # noqa: BLE001 - raised inside the agreed block, on every rank
        geometry, err = None, e
    direct = geometry is not None and geometry[0] != "area" and \
        not geometry[-1].needs_exchange
    y = csrs = None
    with agreed(x.grid.cart, "interpolate_forward", rank_local=direct, x=x, size=canon(size),
                scale_factor=canon(scale_factor), mode=mode, align_corners=canon(align_corners),
                recompute_scale_factor=canon(recompute_scale_factor),
                antialias=canon(antialias)):
        if err is not None:
            raise err
        base, out, scales, align, shortcuts, maps, plan = geometry
        if direct:
            y, csrs = _interp_local(x, plan, base, maps, scales, align, shortcuts)
    if base == "area":
        y, saved = adaptive_pool_forward(x, "avg", out)
        return y, InterpolateSaved(x.distribution, None, (), saved)
    if not direct:
        xin = halo_input(x, plan)
        with collective(x.grid.cart):
            y, csrs = _interp_local(xin, plan, base, maps, scales, align, shortcuts)
    return DistArray(y, plan.out_dist, x.grid), InterpolateSaved(x.distribution, plan, csrs)


def _plan(x, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias):
    """Validated geometry and window plan of an interpolation (pure; raises on bad input)."""
    check_layout(x, "interpolate")
    check_extents(x, "interpolate")
    base, out, scales, align = interpolate_geometry(
        x.shape, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    if base == "area":
        return base, out, None, False, False, (), None
    shortcuts = x.ndim == 4   # PyTorch's 2-D nearest kernel (see nearest_index)
    maps = tuple(interp_map(n, m, base, None if scales is None else scales[i], align,
                            shortcuts) for i, (n, m) in enumerate(zip(x.shape[2:], out)))
    return base, out, scales, align, shortcuts, maps, window_plan_of(x.distribution, maps,
                                                                     x.grid.coords)


def _interp_local(xin: DistArray, plan, base, maps, scales, align, shortcuts):
    """This rank's output block from the (halo'd) input, and the per-axis CSR maps."""
    coords = xin.grid.coords
    if not plan.has_output:
        return xin.xp.zeros(plan.out_dist.block_shape(coords), dtype=xin.dtype), ()
    win = xin.buffer[plan.read]
    csrs = []
    for i, amap in enumerate(maps):
        t = 2 + i
        o0, o1 = plan.out_dist.block_range(t, plan.out_dist.axis_coord(t, coords))
        csr = _taps(base, amap.n, amap.m, o0, o1, amap.lo[o0],
                    None if scales is None else scales[i], align, shortcuts)
        csrs.append((csr, o1 - o0, win.shape[t]))
    y = win
    for i in reversed(range(len(maps))):
        y = _cpu().apply_axis(y, 2 + i, csrs[i][0], csrs[i][1])
    return y, tuple(csrs)


def _taps(mode, n, m, o0, o1, r0, scale, align, shortcuts):
    """CSR of outputs ``[o0, o1)`` of an ``n -> m`` axis, indices relative to ``r0``."""
    rows = o1 - o0
    if mode == "linear":
        i0, i1, w0, w1 = (v[o0:o1] for v in linear_taps(n, m, scale, align))
        indptr = np.arange(0, 2 * rows + 1, 2, dtype=np.int64)
        return (indptr, np.stack([i0 - r0, i1 - r0], 1).reshape(-1),
                np.stack([w0, w1], 1).reshape(-1))
    idx = nearest_index(n, m, scale, mode == "nearest-exact", shortcuts)[o0:o1] - r0
    return np.arange(rows + 1, dtype=np.int64), idx.astype(np.int64), np.ones(rows)


@collective_entry
def interpolate_backward(saved: InterpolateSaved, dy: DistArray) -> DistArray:
    """Gradient with respect to the interpolation input for the output gradient ``dy``
    (distributed like the output).  Collective (reverse halo exchange)."""
    if saved.area is not None:
        return adaptive_pool_backward(saved.area, dy)
    plan = saved.plan
    with agreed(dy.grid.cart, "interpolate_backward", rank_local=True, dy=dy):
        check_gradient_layout(dy, plan.out_dist, "interpolation")
        if plan.has_output:
            g = dy.local
            for i, (csr, _, cells) in enumerate(saved.csrs):
                g = _cpu().apply_axis(g, 2 + i, _cpu().transpose_csr(csr, cells), cells)
        else:
            g = dy.local[:0]
    return halo_gradient(g, saved.x_dist, dy.grid, plan)


def interpolate(x: DistArray, size=None, scale_factor=None, mode: str = "nearest",
                align_corners=None, recompute_scale_factor=None, antialias=False) -> DistArray:
    """:func:`interpolate_forward` without the saved state."""
    return interpolate_forward(x, size, scale_factor, mode, align_corners,
                               recompute_scale_factor, antialias)[0]
