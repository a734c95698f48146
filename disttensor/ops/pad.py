"""Distributed padding (``torch.nn.functional.pad``), forward and backward.

``pad`` lists ``(lo, hi)`` pairs from the *last* axis backwards, as PyTorch's; negative entries
crop.  Modes ``'constant'`` (any axis, ``value`` default 0), ``'reflect'`` (the edge cell not
repeated: ``np.pad``'s ``'reflect'``), ``'replicate'`` and ``'circular'`` (every spatial axis
of an ``(N, C, *S)`` array, no more and no fewer, as PyTorch for batched input).

**Who holds what.**  Cropping keeps each block's part of the kept range (no message, possibly
empty blocks).  Padding then adds the ``lo`` cells to the first block of the axis and the
``hi`` cells to the last (empty blocks included), so the other blocks keep their ownership.
Constant padding is local.  The other modes read cells that may live elsewhere: the input gets
a halo of ``(lo, hi)`` on each padded axis, filled by the halo exchange (periodic on circular
axes) and, beyond the global boundary, by :class:`disttensor.core.halo.EdgeFill`
(``'mirror'`` for reflect, ``'nearest'`` for replicate), which fetches the cells from their
owners.  The first and last blocks then cut their output from that buffer.  The backward is
the adjoint: the output gradient placed in a zero buffer, ``EdgeFill.reverse`` and the
reverse halo exchange add the padded cells' gradients into the cells they copy.

Bad input raises on every rank: reflect padding not narrower than the (cropped) axis,
circular wider than it (PyTorch: "wrapping around more than once"), replicate wider than the
axis (here only: one halo exchange fetches the padding), a value with a non-constant mode.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.array import DistArray
from ..core.distribution import Distribution
from ..core.entry import agreed, canon, collective_entry, nested
from ..core.halo import EdgeFill, HaloExchange
from ._spatial import check_gradient_layout

__all__ = ["pad_forward", "pad_backward", "pad", "PadSaved", "normalize_pad"]

MODES = ("constant", "reflect", "replicate", "circular")
_EDGE = {"reflect": "mirror", "replicate": "nearest"}


def normalize_pad(pad, shape, mode: str) -> tuple[tuple[int, int], ...]:
    """PyTorch's ``pad`` sequence as one ``(lo, hi)`` pair per tensor axis (pure; raises as
    PyTorch on a bad sequence or mode)."""
    if mode not in MODES:
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    pad = tuple(pad)
    for v in pad:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"pad must be a tuple of ints, but found element of type "
                            f"{type(v).__name__}")
    ndim = len(shape)
    if len(pad) % 2:
        raise ValueError("Padding length must be divisible by 2")
    if len(pad) // 2 > ndim:
        raise ValueError("Padding length should be less than or equal to two times the "
                         f"input dimension but got padding length {len(pad)} and input of "
                         f"dimension {ndim}")
    if mode != "constant" and len(pad) != 2 * (ndim - 2):
        raise NotImplementedError(
            f"Padding size {len(pad)} is not supported for {ndim}D input tensor: mode {mode!r} "
            f"pads every spatial axis of an (N, C, *S) array (padding size {2 * (ndim - 2)})")
    pairs = [(0, 0)] * ndim
    for k in range(len(pad) // 2):
        pairs[ndim - 1 - k] = (int(pad[2 * k]), int(pad[2 * k + 1]))
    for t, (lo, hi) in enumerate(pairs):
        kept = shape[t] + min(lo, 0) + min(hi, 0)
        if kept < 0:
            raise ValueError(f"padding {(lo, hi)} crops more than the extent {shape[t]} of "
                             f"axis {t}")
        if mode == "reflect" and max(lo, hi) >= kept and (lo > 0 or hi > 0):
            raise ValueError(f"Padding size should be less than the corresponding input "
                             f"dimension, but got: padding ({lo}, {hi}) at dimension {t} of "
                             f"input {list(shape)}")
        if mode == "circular" and max(lo, hi) > kept:
            raise ValueError(f"Padding value causes wrapping around more than once: padding "
                             f"({lo}, {hi}) at dimension {t} of input {list(shape)}")
        if mode == "replicate" and max(lo, hi) > kept:
            raise ValueError(f"replicate padding ({lo}, {hi}) wider than dimension {t} "
                             f"({kept} cells) is not supported")
        if mode != "constant" and kept == 0 and (lo > 0 or hi > 0):
            raise ValueError(f"mode {mode!r} cannot pad the empty dimension {t}")
    return tuple(pairs)


def _padded_dist(d: Distribution, pairs) -> Distribution:
    out = d
    for t, (lo, hi) in enumerate(pairs):
        if lo == hi == 0:
            continue
        out = out.restrict(t, max(-lo, 0), d.shape[t] - max(-hi, 0))
        lo, hi = max(lo, 0), max(hi, 0)
        if lo or hi:
            if d.split[t] is None:
                out = out.with_sizes(t, None, extent=out.shape[t] + lo + hi)
            else:
                sizes = list(out.sizes(t))
                sizes[0] += lo
                sizes[-1] += hi
                out = out.with_sizes(t, sizes, extent=out.shape[t] + lo + hi)
    return out


@dataclass
class PadSaved:
    x_dist: Distribution
    out_dist: Distribution
    crop: tuple            # per axis: slice of x's block that is kept
    cropped: Distribution  # the distribution after cropping
    halo: tuple            # per axis: the halo of the padding buffer
    out_slices: tuple      # per axis: slice of the buffer (or the padded block) that is output
    mode: str
    local_pads: tuple      # constant mode: per axis (lo, hi) this block pads


@collective_entry
def pad_forward(x: DistArray, pad, mode: str = "constant", value=None):
    """``torch.nn.functional.pad(x, pad, mode, value)`` (see the module docstring).
    Collective.  Returns ``(y, saved)``."""
    with agreed(x.grid.cart, "pad_forward", x=x, pad=canon(pad), mode=mode,
                value=canon(value)):
        if value is not None and mode != "constant":
            raise ValueError(f'Padding mode "{mode}" doesn\'t take in value argument')
        pairs = normalize_pad(pad, x.shape, mode)
        if mode != "constant" and x.split[1] is not None:
            raise ValueError("pad: the channel axis (1) must not be split")
    d, coords = x.distribution, x.grid.coords
    crop, cut_pairs = [], []
    cropped = d
    for t, (lo, hi) in enumerate(pairs):
        a, b = d.block_range(t, d.axis_coord(t, coords))
        k0, k1 = max(-lo, 0), d.shape[t] - max(-hi, 0)
        c0, c1 = min(max(k0, a), b), max(min(k1, b), min(max(k0, a), b))
        crop.append(slice(c0 - a, c1 - a))
        if lo < 0 or hi < 0:
            cropped = cropped.restrict(t, k0, k1)
        cut_pairs.append((max(lo, 0), max(hi, 0)))
    out_dist = _padded_dist(d, pairs)
    xc = x.local[tuple(crop)]
    first_last = [(cropped.axis_coord(t, coords) == 0,
                   cropped.axis_coord(t, coords) == (cropped.grid_dims[g] - 1
                                                    if g is not None else 0))
                  for t, g in enumerate(cropped.split)]
    mine = tuple((lo if f else 0, hi if last else 0)
                 for (lo, hi), (f, last) in zip(cut_pairs, first_last))
    xp = x.xp
    if mode == "constant":
        fill = 0.0 if value is None else value
        y = xp.pad(xc, mine, mode="constant", constant_values=fill) if any(
            lo or hi for lo, hi in mine) else xp.array(xc, copy=True)
        saved = PadSaved(d, out_dist, tuple(crop), cropped, (), (), mode, mine)
        return DistArray(xp.ascontiguousarray(y), out_dist, x.grid), saved
    halo = tuple(cut_pairs)
    with nested():   # the agreed arguments fix the halo: no agreement of its own
        xin = DistArray(xp.ascontiguousarray(xc), cropped, x.grid).with_halo(halo)
        boundary = tuple("periodic" if mode == "circular" and (lo or hi) else "zero"
                         for lo, hi in halo)
        HaloExchange(xin, boundary, persistent=False).exchange()
        if mode in _EDGE:
            EdgeFill(xin, [(_EDGE[mode] if (lo or hi) else None) for lo, hi in halo]).run()
    out_slices = tuple(slice(0 if f else lo, (lo + n + hi) if last else lo + n)
                       for (lo, hi), (f, last), n in zip(halo, first_last, xc.shape))
    y = xp.ascontiguousarray(xin.buffer[out_slices])
    saved = PadSaved(d, out_dist, tuple(crop), cropped, halo, out_slices, mode, mine)
    return DistArray(y, out_dist, x.grid), saved


@collective_entry
def pad_backward(saved: PadSaved, dy: DistArray) -> DistArray:
    """Gradient with respect to the padding input for the output gradient ``dy``
    (distributed like the output).  Collective (the adjoint exchanges of the forward)."""
    with agreed(dy.grid.cart, "pad_backward", dy=dy, mode=saved.mode):
        check_gradient_layout(dy, saved.out_dist, "pad")
    xp = dy.xp
    if saved.mode == "constant":
        inner = tuple(slice(lo, g - hi) for (lo, hi), g in zip(saved.local_pads, dy.local.shape))
        gc = dy.local[inner]
    else:
        block = saved.cropped.block_shape(dy.grid.coords)
        buf = xp.zeros(tuple(lo + n + hi for (lo, hi), n in zip(saved.halo, block)),
                       dtype=dy.dtype)
        buf[saved.out_slices] = dy.local
        g = DistArray(buf, saved.cropped, dy.grid, saved.halo)
        with nested():
            if saved.mode in _EDGE:
                EdgeFill(g, [(_EDGE[saved.mode] if (lo or hi) else None)
                             for lo, hi in saved.halo]).reverse()
            boundary = tuple("periodic" if saved.mode == "circular" and (lo or hi) else "zero"
                             for lo, hi in saved.halo)
            HaloExchange(g, boundary, persistent=False).reverse()
        gc = g.local
    dx = xp.zeros(saved.x_dist.block_shape(dy.grid.coords), dtype=dy.dtype)
    dx[saved.crop] = gc
    return DistArray(dx, saved.x_dist, dy.grid)


def pad(x: DistArray, pad, mode: str = "constant", value=None) -> DistArray:
    """:func:`pad_forward` without the saved state."""
    return pad_forward(x, pad, mode, value)[0]
