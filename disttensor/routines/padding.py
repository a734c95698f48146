"""Padding arrays (NumPy's "Padding arrays"): ``pad``.

The padded axes are gathered whole on the ranks along their grid axes (memory ``O(n)`` along
each padded axis per rank), padded locally with ``numpy.pad`` (modes ``constant``, ``edge``,
``reflect``, ``symmetric``, ``wrap``), and cut into balanced blocks over their original grid
axes (no messages).  Axes without padding keep their split and ownership sizes.  Collective
over the grid of ``x``; the ranks agree on the widths, the mode and the constant values.
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry
from ..core.distribution import Distribution
from ._operands import check_array, cut_balanced, unsplit

__all__ = ["pad"]


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
    axes = tuple(t for t, (a, b) in enumerate(pw) if a or b)
    y = unsplit(x, axes)
    kw = {"constant_values": constant_values} if mode == "constant" else {}
    loc = y.xp.pad(y.local, pw, mode=mode, **kw)
    shape = tuple(n + a + b for n, (a, b) in zip(x.shape, pw))
    d = y.distribution
    base = Distribution(shape, d.grid_dims, d.split,
                        [d.sizes(t) if g is not None else None for t, g in enumerate(d.split)])
    return cut_balanced(loc, shape, base, x.grid, {t: x.split[t] for t in axes})

