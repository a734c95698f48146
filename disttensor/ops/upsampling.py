"""Distributed nearest and (bi/tri)linear upsampling by integer factors, forward and backward.

Output ownership is the input ownership times the factor (a block ``[a, b)`` owns outputs
``[a*f, b*f)``), so nearest upsampling needs no message.  Linear upsampling follows PyTorch with
``align_corners=False``: output ``o`` reads ``src = (o + 0.5)/f - 0.5`` clamped below at 0,
``i0 = floor(src)``, ``i1 = min(i0 + 1, n - 1)``, weight ``src - i0`` on ``i1``; a block's
outputs read at most one input cell beyond each side, so split axes get a halo of 1.  The op is
separable: it is applied one spatial axis at a time on the halo'd buffer (whose corners the
exchange fills), and the backward applies the per-axis adjoints in reverse order (segment sums)
and returns halo cells to their owners with the reverse exchange.

Both entry points agree on their arguments (mode, scale, the arrays' metadata) before any
message, nearest mode too: it sends none, but a scale that differed between ranks would give
the output inconsistent global metadata.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, collective_entry
from ..core.backend import array_module
from ..core.comm import collective
from ..core.distribution import Distribution
from .window import normalize_tuple
from ._spatial import check_extents, check_gradient_layout, check_layout, meaning

__all__ = ["upsample", "upsample_forward", "upsample_backward", "UpsampleSaved",
           "linear_taps"]


def linear_taps(o0: int, o1: int, n: int, f: int):
    """Global taps ``(i0, i1, lam)`` (NumPy arrays) of outputs ``[o0, o1)`` of a length-``n``
    axis upsampled linearly by ``f`` (PyTorch, ``align_corners=False``)."""
    o = np.arange(o0, o1, dtype=np.float64)
    src = np.maximum((o + 0.5) / f - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n - 1)
    i1 = np.minimum(i0 + 1, n - 1)
    lam = src - i0
    return i0, i1, lam


@dataclass
class UpsampleSaved:
    x_dist: Distribution
    out_dist: Distribution
    mode: str
    scale: tuple
    halo: tuple
    taps: tuple            # per spatial axis: (i0, i1, lam) as buffer indices, or None
    buf_shape: tuple


def _out_dist(d: Distribution, scale) -> Distribution:
    shape = list(d.shape)
    sizes = [list(d.sizes(t)) if g is not None else None for t, g in enumerate(d.split)]
    for i, f in enumerate(scale):
        t = 2 + i
        shape[t] *= f
        if sizes[t] is not None:
            sizes[t] = [v * f for v in sizes[t]]
    return Distribution(shape, d.grid_dims, d.split, sizes)


def _apply_axis(a, t: int, i0, i1, lam, xp):
    shape = [1] * a.ndim
    shape[t] = -1
    lam = xp.asarray(lam, dtype=a.dtype).reshape(shape)
    a0 = xp.take(a, xp.asarray(i0), axis=t)
    a1 = xp.take(a, xp.asarray(i1), axis=t)
    return a0 + lam * (a1 - a0)


def _segment_add(g, t: int, idx, length: int, xp):
    """``out[..., j, ...] = sum over k with idx[k] == j of g[..., k, ...]`` along axis ``t``;
    ``idx`` is non-decreasing."""
    out_shape = list(g.shape)
    out_shape[t] = length
    out = xp.zeros(out_shape, dtype=g.dtype)
    if g.shape[t] == 0:
        return out
    idx = np.asarray(idx)
    sel = [slice(None)] * g.ndim
    if xp is not np:
        import cupyx
        sel[t] = xp.asarray(idx)
        cupyx.scatter_add(out, tuple(sel), g)
        return out
    starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
    sums = np.add.reduceat(g, starts, axis=t)
    sel[t] = idx[starts]
    out[tuple(sel)] = sums
    return out


@collective_entry
def upsample_forward(x: DistArray, scale, mode: str = "nearest"):
    """Upsample ``x`` ``(N, C, *S)`` by integer ``scale`` (int or per spatial axis);
    ``mode`` ``'nearest'`` or ``'linear'`` (bi/trilinear, ``align_corners=False``).
    Collective (the ranks agree on the arguments; ``'linear'`` on split spatial axes
    exchanges halos).  Returns ``(y, saved)``."""
    with agreed(x.grid.cart, "upsample_forward", x=x, mode=mode,
                scale=meaning(normalize_tuple, scale, x.ndim - 2, "scale")):
        if mode not in ("nearest", "linear"):
            raise ValueError(f"upsample mode must be 'nearest' or 'linear', got {mode!r}")
        nd = check_layout(x, "upsample")
        check_extents(x, "upsample")
        scale = normalize_tuple(scale, nd, "scale")
        if any(f < 1 for f in scale):
            raise ValueError(f"upsample scale factors must be positive integers, got {scale}")
    d = x.distribution
    out_dist = _out_dist(d, scale)
    xp = x.xp
    if mode == "nearest":
        y = x.local
        for i, f in enumerate(scale):
            if f > 1:
                y = xp.repeat(y, f, axis=2 + i)
        saved = UpsampleSaved(d, out_dist, mode, scale, (), (), ())
        return DistArray(xp.ascontiguousarray(y), out_dist, x.grid), saved
    halo = tuple((1, 1) if (t >= 2 and d.split[t] is not None and d.shape[t] > 0) else (0, 0)
                 for t in range(x.ndim))
    box = d.block_box(x.grid.coords)
    taps = []
    for i, f in enumerate(scale):
        t = 2 + i
        a, b = box.start[t], box.stop[t]
        i0, i1, lam = linear_taps(a * f, b * f, d.shape[t], f)
        off = a - halo[t][0]
        taps.append((i0 - off, i1 - off, lam))
    if any(h != (0, 0) for h in halo):
        xin = x.with_halo(halo)
        xin.halo_exchange("zero").exchange()
        buf = xin.buffer
    else:
        buf = x.local
    y = buf
    with collective(x.grid.cart):  # a failure on one rank raises on all
        for i, (i0, i1, lam) in enumerate(taps):
            y = _apply_axis(y, 2 + i, i0, i1, lam, xp)
    # the non-interpolated axes 0, 1 carry no halo; spatial halos were consumed by the taps
    saved = UpsampleSaved(d, out_dist, mode, scale, halo, tuple(taps), tuple(buf.shape))
    return DistArray(xp.ascontiguousarray(y), out_dist, x.grid), saved


@collective_entry
def upsample_backward(saved: UpsampleSaved, dy: DistArray) -> DistArray:
    """Gradient with respect to the upsampling input (collective: the ranks agree on ``dy``'s
    metadata; linear mode on split axes sends halo gradients back with the reverse exchange).
    The local part runs inside the agreeing block."""
    xp = array_module(dy.local)
    g = dy.local
    with agreed(dy.grid.cart, "upsample_backward", rank_local=saved.mode == "linear", dy=dy,
                mode=saved.mode):
        check_gradient_layout(dy, saved.out_dist, "upsampling")
        if saved.mode == "nearest":
            for i, f in enumerate(saved.scale):
                t = 2 + i
                if f > 1:
                    shape = g.shape[:t] + (g.shape[t] // f, f) + g.shape[t + 1:]
                    g = g.reshape(shape).sum(axis=t + 1)
        else:
            g = _linear_backward_local(saved, g, xp)
    if saved.mode == "nearest":
        return DistArray(xp.ascontiguousarray(g), saved.x_dist, dy.grid)
    gd = DistArray(g, saved.x_dist, dy.grid, saved.halo)
    if any(h != (0, 0) for h in saved.halo):
        gd.halo_exchange("zero").reverse()
    return DistArray(xp.ascontiguousarray(gd.local), saved.x_dist, dy.grid)


def _linear_backward_local(saved: UpsampleSaved, g, xp):
    """Adjoint of the per-axis interpolation on this rank's block: the gradient of the halo'd
    input buffer (no message)."""
    for i in reversed(range(len(saved.taps))):
        t = 2 + i
        i0, i1, lam = saved.taps[i]
        shape = [1] * g.ndim
        shape[t] = -1
        lam_a = xp.asarray(lam, dtype=g.dtype).reshape(shape)
        length = saved.buf_shape[t]
        g = _segment_add(g * (1 - lam_a), t, i0, length, xp) + _segment_add(g * lam_a, t, i1,
                                                                           length, xp)
    return g


def upsample(x: DistArray, scale, mode: str = "nearest") -> DistArray:
    """:func:`upsample_forward` without the saved state."""
    return upsample_forward(x, scale, mode)[0]
