"""Tiling arrays (NumPy's "Tiling arrays"): ``tile`` and ``repeat``.

* ``tile``: concatenation of copies per axis (one redistribution per tiled axis, see
  :func:`~disttensor.routines.manipulation.join.concatenate`).
* ``repeat``: the repeated axis is gathered whole on the ranks along its grid axis (memory
  ``O(n)`` along that axis per rank), repeated locally, and cut again into balanced blocks
  over the same grid axis; ``axis=None`` flattens first (as NumPy).

Both collective over the grid of ``x``; the ranks agree on the repetitions and the axis.
"""
from __future__ import annotations

import numbers
import operator

import numpy as np

from ...core.array import DistArray
from ...core.entry import agreed, canon, collective_entry
from ...core.distribution import Distribution
from .._operands import axis_index, check_array, cut_balanced, unsplit
from .dims import expand_dims
from .join import concatenate

__all__ = ["tile", "repeat"]


@collective_entry
def tile(x: DistArray, reps) -> DistArray:
    """``x`` repeated ``reps[i]`` times along axis ``i`` (NumPy's rule for ``len(reps)``
    different from ``x.ndim``)."""
    check_array(x)
    with agreed(x.grid.cart, "tile", x=x, reps=canon(reps)):
        reps = (reps,) if isinstance(reps, numbers.Integral) else tuple(reps)
        reps = tuple(operator.index(r) for r in reps)
        if any(r < 0 for r in reps):
            raise ValueError("negative dimensions are not allowed")
    y = x
    if len(reps) > x.ndim:
        y = expand_dims(x, tuple(range(len(reps) - x.ndim)))
    reps = (1,) * (y.ndim - len(reps)) + reps
    for t, r in enumerate(reps):
        if r == 0:
            y = y[(slice(None),) * t + (slice(0, 0),)]
        elif r > 1:
            y = concatenate([y] * r, axis=t)
    return y.copy() if y is x else y


@collective_entry
def repeat(x: DistArray, repeats, axis=None) -> DistArray:
    """Repeat each element ``repeats`` times (an int, or one count per element along
    ``axis``: a sequence, NumPy array or DistArray, gathered on every rank)."""
    check_array(x)
    if isinstance(repeats, DistArray):
        repeats = repeats.to_numpy()
    rep = np.asarray(repeats)
    if rep.size == 0 and rep.dtype.kind == "f":  # an empty list: NumPy's float64 default
        rep = rep.astype(np.int64)
    with agreed(x.grid.cart, "repeat", x=x, repeats=canon(rep), axis=canon(axis)):
        if rep.dtype.kind not in "iu" and not (rep.dtype.kind == "b" and rep.ndim == 0):
            raise TypeError("repeats must be integers")
        if rep.ndim > 1:
            raise ValueError("repeats must be an integer or a 1-d array")
        if np.any(rep < 0):
            raise ValueError("repeats may not contain negative values.")
        ax = None if axis is None else axis_index(axis, x.ndim)
        n = x.size if ax is None else x.shape[ax]
        if rep.ndim == 1 and rep.shape[0] not in (1, n):
            raise ValueError(f"operands could not be broadcast together with shape ({n},) "
                             f"({rep.shape[0]},)")
    if ax is None:
        return repeat(x.reshape(-1), rep, 0)
    g = x.split[ax]
    y = unsplit(x, (ax,))
    loc = y.xp.repeat(y.local, y.xp.asarray(rep), axis=ax)
    shape = list(y.shape)
    shape[ax] = loc.shape[ax]
    d = y.distribution
    sizes = [d.sizes(t) if s is not None else None for t, s in enumerate(d.split)]
    base = Distribution(shape, d.grid_dims, d.split, sizes)
    return cut_balanced(loc, tuple(shape), base, x.grid, {ax: g})

