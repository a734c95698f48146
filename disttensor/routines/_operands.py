"""Operand checks and layout helpers shared by the routines.

* :func:`check_array`, :func:`axis_index`, :func:`axis_tuple`, :func:`anchor`: pure checks of
  arguments (they raise NumPy's exceptions; call them inside the agreement block).
* :func:`unsplit`: the operand with some tensor axes whole on every rank (a redistribution
  along the grid axes that split them; collective over the grid when anything moves).
* :func:`cut_balanced`: the inverse without messages: a local block whole along some axes is
  cut into balanced blocks over free grid axes (every rank keeps its own piece).

Routines that gather an axis, work on it locally and cut it again (``repeat``, ``pad``,
``take``) use the pair: memory ``O(n)`` along the gathered axis per rank.
"""
from __future__ import annotations

import operator

from ..core.array import DistArray
from ..core.backend import array_module
from ..core.distribution import Distribution, balanced_sizes

__all__ = ["check_array", "axis_index", "axis_tuple", "anchor", "unsplit", "cut_balanced"]


def check_array(x, name: str | None = "x") -> None:
    """``TypeError`` unless ``x`` is a DistArray: "<name> must be a DistArray, got <type>", or
    "expected a DistArray, got <type>" for ``name=None``."""
    if not isinstance(x, DistArray):
        what = "expected a DistArray" if name is None else f"{name} must be a DistArray"
        raise TypeError(f"{what}, got {type(x).__name__}")


def axis_index(axis, nd: int) -> int:
    """``axis`` (an integer, negative counts from the end) as an index in ``range(nd)``;
    ``TypeError`` for a non-integer, ``AxisError`` out of range (as NumPy)."""
    from numpy.lib.array_utils import normalize_axis_index
    return normalize_axis_index(operator.index(axis), nd)


def axis_tuple(axis, nd: int) -> tuple[int, ...]:
    """An integer or a sequence of them as a tuple of axis indices (``ValueError`` for a
    repeated axis, as NumPy)."""
    from numpy.lib.array_utils import normalize_axis_tuple
    return tuple(normalize_axis_tuple(axis, nd))


def anchor(values):
    """The first DistArray among ``values`` (whose grid a mixed-operand call agrees over), or
    ``None``."""
    return next((v for v in values if isinstance(v, DistArray)), None)


def held_whole(x: DistArray, axes) -> bool:
    """Whether every rank holds ``x`` whole along tensor ``axes`` (each unsplit, or split over
    a grid axis of one rank): NumPy can then work on the local blocks with no message."""
    return all(x.split[t] is None or x.grid.dims[x.split[t]] == 1 for t in axes)


def unsplit(x: DistArray, axes) -> DistArray:
    """``x`` with tensor ``axes`` not split (other axes keep split and sizes); ``x`` itself
    when they are not split already (a redistribution otherwise)."""
    d = x.distribution
    if all(d.split[t] is None for t in axes):
        return x
    split = [None if t in axes else g for t, g in enumerate(d.split)]
    sizes = [None if (t in axes or g is None) else d.sizes(t) for t, g in enumerate(d.split)]
    return x.redistribute(distribution=Distribution(d.shape, d.grid_dims, split, sizes))


def cut_balanced(local, shape, d: Distribution, grid, resplit: dict) -> DistArray:
    """Wrap ``local`` (whole along the keys of ``resplit``, otherwise the block of ``d`` with
    shape ``shape``) and cut it into balanced blocks over the grid axes ``resplit[t]`` (free
    grid axes of ``d``; ``None`` leaves axis ``t`` whole), without messages."""
    split = list(d.split)
    sizes = [d.sizes(t) if g is not None else None for t, g in enumerate(d.split)]
    idx = [slice(None)] * len(shape)
    for t, g in resplit.items():
        if g is None:
            continue
        bs = balanced_sizes(shape[t], d.grid_dims[g])
        c = grid.coords[g]
        lo = sum(bs[:c])
        idx[t] = slice(lo, lo + bs[c])
        split[t], sizes[t] = g, None
    nd = Distribution(shape, d.grid_dims, split, sizes)
    loc = local[tuple(idx)] if resplit else local
    return DistArray(array_module(loc).ascontiguousarray(loc), nd, grid)
