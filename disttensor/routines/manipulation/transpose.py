"""Transpose-like operations (NumPy's "Transpose-like operations"): ``transpose``,
``moveaxis``, ``swapaxes``.

They permute the distribution's metadata and the local block (``Distribution.transpose``):
the result keeps every axis's split and ownership sizes under its new position, and no data
moves.  Collective only in that the ranks agree on the axes.
"""
from __future__ import annotations

from ...core.array import DistArray
from ...core.entry import agreed, canon, collective_entry
from .._operands import check_array

__all__ = ["transpose", "moveaxis", "swapaxes"]


@collective_entry
def transpose(x: DistArray, axes=None) -> DistArray:
    """``x`` with its axes permuted (``None``: reversed); no messages."""
    from numpy.lib.array_utils import normalize_axis_index
    check_array(x, None)
    nd = x.ndim
    with agreed(x.grid.cart, "transpose", x=x, axes=canon(axes)):
        if axes is None:
            axes = tuple(reversed(range(nd)))
        else:
            axes = tuple(axes)
            if len(axes) != nd:
                raise ValueError("axes don't match array")
            axes = tuple(normalize_axis_index(int(a), nd) for a in axes)  # AxisError as NumPy
        if sorted(axes) != list(range(nd)):
            raise ValueError("repeated axis in transpose")
    return DistArray(x.local.transpose(axes), x.distribution.transpose(axes), x.grid)


@collective_entry
def moveaxis(x: DistArray, source, destination) -> DistArray:
    """``x`` with axes ``source`` moved to positions ``destination``, the others in order."""
    from numpy.lib.array_utils import normalize_axis_tuple
    check_array(x, None)
    with agreed(x.grid.cart, "moveaxis", x=x, source=canon(source),
                destination=canon(destination)):
        src = normalize_axis_tuple(source, x.ndim, "source")
        dst = normalize_axis_tuple(destination, x.ndim, "destination")
        if len(src) != len(dst):
            raise ValueError("`source` and `destination` arguments must have the same number "
                             "of elements")
    order = [n for n in range(x.ndim) if n not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(x, order)


@collective_entry
def swapaxes(x: DistArray, a: int, b: int) -> DistArray:
    """``x`` with axes ``a`` and ``b`` interchanged."""
    from numpy.lib.array_utils import normalize_axis_index
    check_array(x, None)
    with agreed(x.grid.cart, "swapaxes", x=x, axis1=canon(a), axis2=canon(b)):
        a = normalize_axis_index(a, x.ndim, "axis1")
        b = normalize_axis_index(b, x.ndim, "axis2")
    order = list(range(x.ndim))
    order[a], order[b] = order[b], order[a]
    return transpose(x, order)

