"""Distributed adaptive average and max pooling (1-D, 2-D, 3-D), forward and backward.

PyTorch's ``adaptive_{avg,max}_pool{1,2,3}d``: along an axis of ``n`` cells, output ``o`` of
``m`` pools the bin ``floor(o n / m) .. ceil((o + 1) n / m)`` (``m > n`` is allowed, as in
PyTorch: bins then repeat cells; ``m = 0`` gives an empty output).  Bin ``o`` is computed by
the block owning its centre cell ``(lo + hi - 1) // 2`` (:mod:`.resample_index`), so the
output's ownership follows the input's, uneven and empty blocks included.

* **Average** (a linear map, separable per axis): every rank sums, for each bin its cells
  meet, its own cells' share (the sum over its part of the bin divided by the bin's size),
  into an output buffer with an *output halo*; the reverse halo exchange of that buffer adds
  the shares into the bins' owners.  A rank therefore sends a few partial bins, never input
  cells: global average pooling (``output_size=1``) moves ``C`` numbers per sample and rank.
  The backward is the adjoint: the forward halo exchange of the output gradient, then each
  rank spreads every bin's gradient over its cells.
* **Max**: the bin's owner reads the whole bin through an input halo (the window plan of
  :mod:`._spatial`), takes PyTorch's maximum (first of equal maxima, a NaN wins) and
  remembers its cell; the backward adds each output's gradient into that cell of the read
  window and the reverse halo exchange returns halo cells' gradients to their owners.
  ``return_indices`` is not supported (indices into a distributed input).

Both entry points agree on their arguments before any message (one all-reduce each).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.array import DistArray
from ..core.comm import collective
from ..core.distribution import Distribution
from ..core.entry import agreed, canon, collective_entry, nested
from ..core.halo import HaloExchange
from ._spatial import (WindowPlan, check_extents, check_gradient_layout, check_layout,
                       halo_gradient, halo_input, lift, unlift)
from .resample_index import AxisMap, adaptive_map


def _cpu():
    """The CPU kernels (:mod:`.local.cpu.resample`, Numba), imported on first use so that
    importing the ops does not load Numba."""
    from .local.cpu import resample
    return resample


__all__ = ["adaptive_pool_forward", "adaptive_pool_backward", "adaptive_pool",
           "AdaptivePoolSaved", "normalize_output_size", "resample_dist"]


def normalize_output_size(output_size, spatial: tuple) -> tuple[int, ...]:
    """``output_size`` (an int, or one int or ``None`` per spatial axis: ``None`` keeps the
    input's extent) as a tuple of ints (``ValueError`` for a wrong count, a negative size)."""
    nd = len(spatial)
    if output_size is None or isinstance(output_size, (int, np.integer)):
        sizes = (output_size,) * nd
    else:
        sizes = tuple(output_size)
        if len(sizes) != nd:
            raise ValueError(f"output_size {tuple(output_size)} needs {nd} entries (one per "
                             f"spatial axis of the input, shape {spatial})")
    out = []
    for s, n in zip(sizes, spatial):
        if s is None:
            out.append(int(n))
            continue
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"output_size entries must be ints or None, got {s!r}")
        if s < 0:
            raise ValueError(f"output_size entries must be >= 0, got {tuple(sizes)}")
        out.append(int(s))
    return tuple(out)


def resample_dist(d: Distribution, maps: tuple[AxisMap, ...]) -> Distribution:
    """The output distribution of a resampling op with ``maps[i]`` on spatial axis ``i``:
    split axes get the ownership of :meth:`AxisMap.output_offsets`."""
    out = d
    for i, amap in enumerate(maps):
        t = 2 + i
        if d.split[t] is None:
            out = out.with_sizes(t, None, extent=amap.m)
        else:
            offs = amap.output_offsets(d.offsets[t])
            out = out.with_sizes(t, [q - p for p, q in zip(offs[:-1], offs[1:])],
                                 extent=amap.m)
    return out


def window_plan_of(d: Distribution, maps: tuple[AxisMap, ...], coords) -> WindowPlan:
    """The window plan (input halo, read window) of an op reading ``maps``' ranges (pure)."""
    out_dist = resample_dist(d, maps)
    halo = [(0, 0), (0, 0)]
    read = [slice(None), slice(None)]
    has_output = all(n > 0 for n in out_dist.block_shape(coords))
    for i, amap in enumerate(maps):
        t = 2 + i
        a, _ = d.block_range(t, d.axis_coord(t, coords))
        hl, hh = amap.halo(d.offsets[t]) if d.split[t] is not None else (0, 0)
        halo.append((hl, hh))
        o0, o1 = out_dist.block_range(t, out_dist.axis_coord(t, coords))
        if o1 > o0:
            r0, r1 = amap.read_range(o0, o1)
            read.append(slice(r0 - a + hl, r1 - a + hl))
        else:
            read.append(slice(hl, hl))
    nd = len(maps)
    return WindowPlan(out_dist, tuple(halo), tuple(read), (0,) * nd, (0,) * nd, has_output)


@dataclass
class AdaptivePoolSaved:
    x_dist: Distribution
    out_dist: Distribution
    mode: str
    nd: int
    plan: WindowPlan | None      # max: the input window plan
    out_halo: tuple              # avg: the output halo per tensor axis
    csrs: tuple                  # avg: per spatial axis, the (block -> buffer) CSR and extents
    argmax: object               # max: local argmax (into the read window) or None
    read_shape: tuple            # max: spatial shape of the read window


def _avg_csrs(d: Distribution, out_dist: Distribution, maps, coords, out_halo):
    """Per spatial axis: ``(csr, rows, cells)``, the map from this block's cells to the output
    buffer (owned bins plus the output halo) holding each bin's share of the block."""
    res = []
    for i, amap in enumerate(maps):
        t = 2 + i
        a, b = d.block_range(t, d.axis_coord(t, coords))
        o0, o1 = out_dist.block_range(t, out_dist.axis_coord(t, coords))
        hl, hh = out_halo[t]
        rows = []
        for r in range(o0 - hl, o1 + hh):
            lo, hi = (amap.lo[r], amap.hi[r]) if 0 <= r < amap.m else (0, 0)
            c0, c1 = max(lo, a), min(hi, b)
            if c1 > c0:
                rows.append((np.arange(c0 - a, c1 - a), np.full(c1 - c0, 1.0 / (hi - lo))))
            else:
                rows.append(((), ()))
        res.append((_cpu().csr_from_rows(rows), o1 - o0 + hl + hh, b - a))
    return tuple(res)


def _geometry(x: DistArray, mode: str, output_size):
    if mode not in ("avg", "max"):
        raise ValueError(f"adaptive pooling mode must be 'avg' or 'max', got {mode!r}")
    what = f"adaptive_{mode}_pool"
    nd = check_layout(x, what)
    check_extents(x, what)
    sizes = normalize_output_size(output_size, x.shape[2:])
    maps = tuple(adaptive_map(n, m) if n > 0 else _empty_map(m)
                 for n, m in zip(x.shape[2:], sizes))
    return nd, maps


def _empty_map(m: int) -> AxisMap:
    # an empty batch with zero spatial extent: no bins read anything
    return AxisMap(0, (0,) * m, (0,) * m, (0,) * m)


@collective_entry
def adaptive_pool_forward(x: DistArray, mode: str, output_size):
    """Adaptive ``mode`` (``'avg'`` or ``'max'``) pooling of ``x`` ``(N, C, *S)`` to
    ``output_size`` (an int, or per spatial axis an int or ``None``).  The output is split
    like ``x`` with the bins owned by the blocks holding their centres.  Collective.
    Returns ``(y, saved)``."""
    # average pooling runs its local kernel before any message: inside the agreeing block,
    # so one all-reduce agrees on the arguments and on a kernel failure
    buf = None
    with agreed(x.grid.cart, "adaptive_pool_forward", rank_local=mode == "avg", x=x,
                mode=mode, output_size=canon(output_size)):
        nd, maps = _geometry(x, mode, output_size)
        d, coords = x.distribution, x.grid.coords
        if mode == "avg":
            out_dist = resample_dist(d, maps)
            out_halo = ((0, 0), (0, 0)) + tuple(
                amap.out_halo(d.offsets[2 + i]) if d.split[2 + i] is not None else (0, 0)
                for i, amap in enumerate(maps))
            csrs = _avg_csrs(d, out_dist, maps, coords, out_halo)
            single = _single_bins(csrs)
            if single is not None:   # global pooling: one reduction of the block
                buf = _single_bin_forward(x.local, single, csrs)
            else:
                buf = x.local
                for i, (csr, rows, _) in enumerate(csrs):
                    buf = _cpu().apply_axis(buf, 2 + i, csr, rows)
    if mode == "max":
        plan = window_plan_of(d, maps, coords)
        xin = halo_input(x, plan)
        with collective(x.grid.cart):
            y, am, read_shape = _max_local(xin, plan, maps, nd, coords)
        saved = AdaptivePoolSaved(d, plan.out_dist, mode, nd, plan, (), (), am, read_shape)
        return DistArray(y, plan.out_dist, x.grid), saved
    y = DistArray(buf, out_dist, x.grid, out_halo)
    if any(h != (0, 0) for h in out_halo):
        with nested():
            HaloExchange(y, "zero", persistent=False).reverse()
        y = DistArray(x.xp.ascontiguousarray(y.local), out_dist, x.grid)
    return y, AdaptivePoolSaved(d, out_dist, mode, nd, None, out_halo, csrs, None, ())


def _max_local(xin: DistArray, plan: WindowPlan, maps, nd: int, coords):
    block = plan.out_dist.block_shape(coords)
    if not plan.has_output:
        return xin.xp.zeros(block, dtype=xin.dtype), None, ()
    win = xin.buffer[plan.read]
    bins = []
    for i, amap in enumerate(maps):
        t = 2 + i
        o0, o1 = plan.out_dist.block_range(t, plan.out_dist.axis_coord(t, coords))
        r0 = amap.lo[o0]
        bins.append((np.array(amap.lo[o0:o1]) - r0, np.array(amap.hi[o0:o1]) - r0))
    bins = [(np.zeros(1, np.int64), np.ones(1, np.int64))] * (3 - nd) + bins
    y, am = _max_kernels(win).adaptive_max_forward(lift(win, nd), bins)
    return unlift(y, nd), am, tuple(win.shape[2:])


def _max_kernels(a):
    """The adaptive max kernels of ``a``'s device (:mod:`.local.cpu.resample` or
    :mod:`.local.gpu.resample`)."""
    if type(a) is np.ndarray:
        return _cpu()
    from .local.gpu import resample as gpu
    return gpu


@collective_entry
def adaptive_pool_backward(saved: AdaptivePoolSaved, dy: DistArray) -> DistArray:
    """Gradient with respect to the adaptive pooling input for the output gradient ``dy``
    (distributed like the output).  Collective (a forward halo exchange of ``dy`` for
    average pooling, the reverse exchange of the input gradient for max pooling)."""
    with agreed(dy.grid.cart, "adaptive_pool_backward", dy=dy, mode=saved.mode):
        check_gradient_layout(dy, saved.out_dist, "adaptive pooling")
    xp = dy.xp
    if saved.mode == "max":
        plan, nd = saved.plan, saved.nd
        with collective(dy.grid.cart):
            if plan.has_output:
                g = _max_kernels(dy.local).adaptive_max_backward(
                    lift(dy.local, nd), saved.argmax, (1,) * (3 - nd) + saved.read_shape)
                g = unlift(g, nd)
            else:
                g = dy.local[:0]
        return halo_gradient(g, saved.x_dist, dy.grid, plan)
    if any(h != (0, 0) for h in saved.out_halo):
        with nested():
            dyh = dy.with_halo(saved.out_halo)
            HaloExchange(dyh, "zero", persistent=False).exchange()
        g = dyh.buffer
    else:
        g = dy.local
    with collective(dy.grid.cart):
        single = _single_bins(saved.csrs)
        if single is not None:
            g = _single_bin_backward(g, single, saved.csrs, xp)
        else:
            for i, (csr, _, cells) in enumerate(saved.csrs):
                g = _cpu().apply_axis(g, 2 + i, _cpu().transpose_csr(csr, cells), cells)
    return DistArray(xp.ascontiguousarray(g), saved.x_dist, dy.grid)


def _single_bins(csrs):
    """``(row, weight)`` per spatial axis when every cell of this block falls in one bin of
    that axis with one weight (global pooling, ``output_size=1``), else ``None``."""
    out = []
    for (indptr, idx, w), _, cells in csrs:
        counts = np.diff(indptr)
        nz = np.flatnonzero(counts)
        if len(nz) != 1 or counts[nz[0]] != cells or (len(w) and np.ptp(w) != 0):
            return None
        out.append((int(nz[0]), float(w[0]) if len(w) else 0.0))
    return out


def _single_bin_forward(local, single, csrs):
    """The output buffer of :func:`_avg_csrs`' map when :func:`_single_bins` applies: the
    block's sum (float64) times the weights, in the one row of every axis."""
    xp = __import__("cupy") if type(local) is not np.ndarray else np
    nd = len(single)
    buf = xp.zeros(local.shape[:2] + tuple(rows for _, rows, _ in csrs), dtype=local.dtype)
    axes = tuple(range(2, 2 + nd))
    total = local.sum(axis=axes, dtype=np.float64) * float(np.prod([w for _, w in single]))
    buf[(slice(None), slice(None)) + tuple(r for r, _ in single)] = total
    return buf


def _single_bin_backward(g, single, csrs, xp):
    """The adjoint of :func:`_single_bin_forward`: the row's gradient times the weights,
    broadcast over the block."""
    nd = len(single)
    val = g[(slice(None), slice(None)) + tuple(r for r, _ in single)]
    val = val * xp.asarray(float(np.prod([w for _, w in single])), dtype=g.dtype)
    block = g.shape[:2] + tuple(cells for _, _, cells in csrs)
    return xp.broadcast_to(val.reshape(val.shape + (1,) * nd), block)


def adaptive_pool(x: DistArray, mode: str, output_size) -> DistArray:
    """:func:`adaptive_pool_forward` without the saved state."""
    return adaptive_pool_forward(x, mode, output_size)[0]
