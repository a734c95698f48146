"""Joining and splitting arrays (NumPy's "Joining arrays" and "Splitting arrays"):
``concatenate``, ``stack`` and its inverse ``unstack``.

* ``concatenate``: the result has the first operand's split and grid along every axis but the
  joined one, which keeps its grid axis with the ownership sizes that follow from placing the
  operands' pieces one after the other (``Distribution.restrict``); every operand is
  redistributed to its piece of that layout (nothing moves for an operand already there).
  ``axis=None`` concatenates the flattened operands.
* ``stack``: ``expand_dims`` of every operand then ``concatenate`` along the new axis
  (operands are redistributed to the first one's layout).
* ``unstack``: one integer index per position (:mod:`disttensor.routines.indexing`).

All collective over the operands' grid; the ranks agree on the operands' metadata and the axis.
"""
from __future__ import annotations

import numpy as np

from ...core.array import DistArray
from ...core.entry import agreed, canon, collective_entry, dtype_key, operand_key
from ...core.backend import array_module
from ...core.distribution import Distribution
from .._operands import anchor, axis_index, check_array
from .dims import expand_dims

__all__ = ["concatenate", "stack", "unstack"]


@collective_entry
def concatenate(arrays, axis=0, dtype=None) -> DistArray:
    """Join DistArrays along an existing ``axis`` (``None``: of the flattened operands), in
    the first operand's layout (module docstring); ``dtype``: of the result (default: NumPy's
    result type of the operands)."""
    arrays = list(arrays)
    owner = anchor(arrays)
    with agreed(None if owner is None else owner.grid.cart, "concatenate",
                arrays=tuple(operand_key(a) for a in arrays), axis=canon(axis),
                dtype=dtype_key(dtype)):
        if not arrays:
            raise ValueError("need at least one array to concatenate")
        if not all(isinstance(a, DistArray) for a in arrays):
            raise TypeError("concatenate of DistArrays needs every operand to be a DistArray")
        first = arrays[0]
        nd = first.ndim
        if nd == 0:
            raise ValueError("zero-dimensional arrays cannot be concatenated")
        for i, a in enumerate(arrays[1:], 1):
            if a.ndim != nd:
                raise ValueError(f"all the input arrays must have same number of dimensions, but "
                                 f"the array at index 0 has {nd} dimension(s) and the array at "
                                 f"index {i} has {a.ndim} dimension(s)")
            if not a.grid.compatible(first.grid):
                raise ValueError("the two grids are over different communicators; data cannot "
                                 "move between them")
        if axis is not None:
            if not -nd <= axis < nd:
                raise np.exceptions.AxisError(axis, nd)
            for i, a in enumerate(arrays[1:], 1):
                for t in range(nd):
                    if t != axis % nd and a.shape[t] != first.shape[t]:
                        raise ValueError(
                            "all the input array dimensions except for the concatenation axis "
                            f"must match exactly, but along dimension {t}, the array at index 0 "
                            f"has size {first.shape[t]} and the array at index {i} has size "
                            f"{a.shape[t]}")
        devices = {a.device for a in arrays}
        if len(devices) > 1:
            raise ValueError("operands live on different devices")
        out_dtype = (np.dtype(dtype) if dtype is not None
                     else np.result_type(*[a.dtype for a in arrays]))
    if axis is None:
        arrays = [a.reshape(-1) for a in arrays]
        return concatenate(arrays, 0, dtype)
    axis %= nd
    d = first.distribution
    total = sum(a.shape[axis] for a in arrays)
    shape = list(d.shape)
    shape[axis] = total
    sizes = list(d.split_sizes)
    sizes[axis] = None
    res = Distribution(shape, d.grid_dims, d.split, sizes)
    pieces, start = [], 0
    for a in arrays:
        n = a.shape[axis]
        target = res.restrict(axis, start, start + n)
        start += n
        if a.distribution == target and a.grid.dims == first.grid.dims:
            pieces.append(a.local)
        else:
            pieces.append(a.redistribute(grid=first.grid, distribution=target).local)
    xp = array_module(pieces[0])
    loc = xp.concatenate([p.astype(out_dtype, copy=False) for p in pieces], axis=axis)
    return DistArray(loc, res, first.grid)


@collective_entry
def stack(arrays, axis=0) -> DistArray:
    """Join arrays of one shape along a new axis (the layout of the first one)."""
    arrays = list(arrays)
    first = anchor(arrays)
    with agreed(None if first is None else first.grid.cart, "stack",
                arrays=tuple(operand_key(a) for a in arrays), axis=canon(axis)):
        if not arrays:
            raise ValueError("need at least one array to stack")
        for a in arrays:
            check_array(a, "every operand")
        if len({a.shape for a in arrays}) != 1:
            raise ValueError("all input arrays must have the same shape")
        ax = axis_index(axis, arrays[0].ndim + 1)
    return concatenate([expand_dims(a, ax) for a in arrays], axis=ax)


@collective_entry
def unstack(x: DistArray, axis=0) -> tuple:
    """The slices of ``x`` along ``axis``, as a tuple of DistArrays."""
    check_array(x)
    with agreed(x.grid.cart, "unstack", x=x, axis=canon(axis)):
        if x.ndim == 0:
            raise ValueError("Input array must be at least 1-d.")
        ax = axis_index(axis, x.ndim)
    pre = (slice(None),) * ax
    return tuple(x[pre + (i,)] for i in range(x.shape[ax]))

