"""Padding arrays (NumPy's "Padding arrays"): ``pad``, and the halo padding it shares with
:mod:`disttensor.ops.pad` (``torch.nn.functional.pad``).

**Halo padding** (:func:`halo_pad`, adjoint :func:`halo_pad_adjoint`): negative widths crop
(each block keeps its part of the kept range, no message); the ``lo`` pad cells then go to the
first block of the axis and the ``hi`` cells to the last (empty blocks included), the other
blocks keeping their ownership.  Constant padding is local; ``edge``, ``reflect``,
``symmetric`` and ``wrap`` give the cropped array a halo of ``(lo, hi)`` on each padded axis,
filled by the halo exchange (periodic for ``wrap``) and, beyond the global boundary, by
:class:`disttensor.core.halo.EdgeFill`, which fetches the cells from their owners; the first
and last blocks cut their output from that buffer.  Only pad cells and halo faces move.  It
takes widths up to the (cropped) extent, below it for ``reflect``.

``pad`` takes the halo path where it applies (a scalar constant, widths within those limits);
otherwise the padded axes are gathered whole on the ranks along their grid axes (memory
``O(n)`` along each padded axis per rank), padded locally with ``numpy.pad`` and cut into
balanced blocks over their original grid axes (no messages).  Collective over the grid of
``x``; the ranks agree on the widths, the mode and the constant values.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, nested
from ..core.distribution import Distribution
from ..core.halo import EdgeFill, HaloExchange
from ._operands import check_array, cut_balanced, unsplit

__all__ = ["pad", "halo_pad", "halo_pad_adjoint", "halo_pad_fits", "HaloPad",
           "padded_distribution"]

# np.pad mode -> EdgeFill mode of the halo path (None: nothing to fill beyond the boundary)
_EDGE = {"constant": None, "edge": "nearest", "reflect": "mirror", "symmetric": "reflect",
         "wrap": None}


@collective_entry
def pad(x: DistArray, pad_width, mode="constant", constant_values=0) -> DistArray:
    """``numpy.pad`` for the modes ``constant``, ``edge``, ``reflect``, ``symmetric`` and
    ``wrap`` (``pad_width`` as NumPy: an int, a pair, or one pair per axis)."""
    check_array(x)
    modes = ("constant", "edge", "reflect", "symmetric", "wrap")
    with agreed(x.grid.cart, "pad", x=x, pad_width=canon(pad_width), mode=mode,
                constant_values=np.asarray(constant_values)):
        if mode not in modes:
            raise ValueError(f"mode {mode!r} is not supported (one of {modes})")
        pw = np.broadcast_to(np.asarray(pad_width), (x.ndim, 2))
        if pw.dtype.kind not in "iu":
            raise TypeError("`pad_width` must be of integral type.")
        if np.any(pw < 0):
            raise ValueError("index can't contain negative values")
        pw = [(int(a), int(b)) for a, b in pw]
        for t, (a, b) in enumerate(pw):
            if (a or b) and x.shape[t] == 0 and mode != "constant":
                raise ValueError(f"can't extend empty axis {t} using modes other than "
                                 "'constant' or 'empty'")
    if np.ndim(constant_values) == 0 and halo_pad_fits(x.shape, pw, mode):
        with nested():
            return halo_pad(x, pw, mode, constant_values)[0]
    axes = tuple(t for t, (a, b) in enumerate(pw) if a or b)
    y = unsplit(x, axes)
    kw = {"constant_values": constant_values} if mode == "constant" else {}
    loc = y.xp.pad(y.local, pw, mode=mode, **kw)
    shape = tuple(n + a + b for n, (a, b) in zip(x.shape, pw))
    d = y.distribution
    base = Distribution(shape, d.grid_dims, d.split,
                        [d.sizes(t) if g is not None else None for t, g in enumerate(d.split)])
    return cut_balanced(loc, shape, base, x.grid, {t: x.split[t] for t in axes})



def halo_pad_fits(shape, pairs, mode: str) -> bool:
    """Whether :func:`halo_pad` takes these ``(lo, hi)`` widths (negative: crop) in the
    ``numpy.pad`` ``mode`` (pure)."""
    if mode not in _EDGE:
        return False
    for n, (lo, hi) in zip(shape, pairs):
        kept = n + min(lo, 0) + min(hi, 0)
        w = max(lo, hi, 0)
        if kept < 0 or (mode != "constant" and w and (kept == 0 or w > kept
                                                      or (mode == "reflect" and w >= kept))):
            return False
    return True


def padded_distribution(d: Distribution, pairs) -> Distribution:
    """The distribution :func:`halo_pad` gives its result: each block keeps its part of the
    kept range; the first block of a split axis gets the ``lo`` cells, the last the ``hi``."""
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
class HaloPad:
    """What :func:`halo_pad_adjoint` needs of a :func:`halo_pad` call."""

    x_dist: Distribution
    out_dist: Distribution
    crop: tuple            # per axis: slice of x's block that is kept
    cropped: Distribution  # the distribution after cropping
    halo: tuple            # per axis: the halo of the padding buffer
    out_slices: tuple      # per axis: slice of the buffer that is the output block
    mode: str
    local_pads: tuple      # constant mode: per axis (lo, hi) this block pads


def _boundary(mode, halo):
    return tuple("periodic" if mode == "wrap" and (lo or hi) else "zero" for lo, hi in halo)


def halo_pad(x: DistArray, pairs, mode: str, value=0.0):
    """``x`` padded by ``pairs`` (one ``(lo, hi)`` per axis; negative crops) in the
    ``numpy.pad`` ``mode`` (``constant`` with the scalar ``value``, ``edge``, ``reflect``,
    ``symmetric``, ``wrap``) through the halo exchange (module docstring); ``(y, state)``.
    Collective; no agreement of its own (call it inside an agreed entry point that agreed
    ``x``, ``pairs``, ``mode`` and ``value``, after :func:`halo_pad_fits`)."""
    d, coords = x.distribution, x.grid.coords
    crop, cut_pairs = [], []
    cropped = d
    for t, (lo, hi) in enumerate(pairs):
        a, b = d.block_range(t, d.axis_coord(t, coords))
        k0, k1 = max(-lo, 0), d.shape[t] - max(-hi, 0)
        c0 = min(max(k0, a), b)
        crop.append(slice(c0 - a, max(min(k1, b), c0) - a))
        if lo < 0 or hi < 0:
            cropped = cropped.restrict(t, k0, k1)
        cut_pairs.append((max(lo, 0), max(hi, 0)))
    out_dist = padded_distribution(d, pairs)
    xc = x.local[tuple(crop)]
    first_last = [(cropped.axis_coord(t, coords) == 0,
                   cropped.axis_coord(t, coords) == (cropped.grid_dims[g] - 1
                                                    if g is not None else 0))
                  for t, g in enumerate(cropped.split)]
    mine = tuple((lo if f else 0, hi if last else 0)
                 for (lo, hi), (f, last) in zip(cut_pairs, first_last))
    xp = x.xp
    if mode == "constant":
        y = xp.pad(xc, mine, mode="constant", constant_values=value) if any(
            lo or hi for lo, hi in mine) else xp.array(xc, copy=True)
        state = HaloPad(d, out_dist, tuple(crop), cropped, (), (), mode, mine)
        return DistArray(xp.ascontiguousarray(y), out_dist, x.grid), state
    halo = tuple(cut_pairs)
    with nested():
        xin = DistArray(xp.ascontiguousarray(xc), cropped, x.grid).with_halo(halo)
        HaloExchange(xin, _boundary(mode, halo), persistent=False).exchange()
        if _EDGE[mode] is not None:
            EdgeFill(xin, [(_EDGE[mode] if (lo or hi) else None) for lo, hi in halo]).run()
    out_slices = tuple(slice(0 if f else lo, (lo + n + hi) if last else lo + n)
                       for (lo, hi), (f, last), n in zip(halo, first_last, xc.shape))
    y = xp.ascontiguousarray(xin.buffer[out_slices])
    state = HaloPad(d, out_dist, tuple(crop), cropped, halo, out_slices, mode, mine)
    return DistArray(y, out_dist, x.grid), state


def halo_pad_adjoint(state: HaloPad, dy: DistArray) -> DistArray:
    """The adjoint of :func:`halo_pad` (the constant counts as zero): ``dy`` (distributed as
    its result) placed in a zero buffer, ``EdgeFill.reverse`` and the reverse halo exchange
    add the pad cells into the cells they copy.  Collective; no agreement of its own."""
    xp = dy.xp
    if state.mode == "constant":
        inner = tuple(slice(lo, g - hi) for (lo, hi), g in zip(state.local_pads, dy.local.shape))
        gc = dy.local[inner]
    else:
        block = state.cropped.block_shape(dy.grid.coords)
        buf = xp.zeros(tuple(lo + n + hi for (lo, hi), n in zip(state.halo, block)),
                       dtype=dy.dtype)
        buf[state.out_slices] = dy.local
        g = DistArray(buf, state.cropped, dy.grid, state.halo)
        with nested():
            if _EDGE[state.mode] is not None:
                EdgeFill(g, [(_EDGE[state.mode] if (lo or hi) else None)
                             for lo, hi in state.halo]).reverse()
            HaloExchange(g, _boundary(state.mode, state.halo), persistent=False).reverse()
        gc = g.local
    dx = xp.zeros(state.x_dist.block_shape(dy.grid.coords), dtype=dy.dtype)
    dx[state.crop] = gc
    return DistArray(dx, state.x_dist, dy.grid)
