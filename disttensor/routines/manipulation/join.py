"""Joining arrays (NumPy's "Joining arrays"): ``concatenate``, ``stack`` and its inverse
``unstack``, ``vstack``, ``hstack``, ``dstack``, ``column_stack`` (splitting:
:mod:`.splitting`).

* ``concatenate``: the result has the first operand's split and grid along every axis but the
  joined one, which keeps its grid axis with the ownership sizes that follow from placing the
  operands' pieces one after the other (``Distribution.restrict``); every operand is
  redistributed to its piece of that layout (nothing moves for an operand already there).
  ``axis=None`` concatenates the flattened operands.
* ``stack``: ``expand_dims`` of every operand then ``concatenate`` along the new axis
  (operands are redistributed to the first one's layout).
* ``vstack`` / ``hstack`` / ``dstack`` / ``column_stack``: ``atleast_2d``/``atleast_1d``/
  ``atleast_3d`` (1-D operands of ``column_stack`` as ``(N, 1)`` columns) then ``concatenate``
  along axis 0 / 1 (0 for 1-D operands) / 2 / 1, so the result has the first operand's layout
  as ``concatenate`` says; the new length-1 axes of 1-D operands are whole (``vstack`` of 1-D
  arrays: rows whole, columns split like the first operand).  ``numpy.row_stack`` (deprecated
  in NumPy 2) reaches ``vstack`` through ``np.vstack``.
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
from .dims import atleast_1d, atleast_2d, atleast_3d, expand_dims

__all__ = ["concatenate", "stack", "unstack", "vstack", "hstack", "dstack", "column_stack"]


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



def _operands(tup, call: str) -> list:
    """The operands of a ``*stack`` call as a list of DistArrays, agreed; NumPy's errors for
    no operand and a non-DistArray one."""
    arrays = list(tup)
    first = anchor(arrays)
    with agreed(None if first is None else first.grid.cart, call,
                arrays=tuple(operand_key(a) for a in arrays)):
        if not arrays:
            raise ValueError("need at least one array to concatenate")
        for a in arrays:
            check_array(a, "every operand")
    return arrays


def _as_tuple(r):
    return r if isinstance(r, tuple) else (r,)


@collective_entry
def vstack(tup, *, dtype=None, casting="same_kind") -> DistArray:
    """Rows of ``atleast_2d`` operands joined (``numpy.vstack``): ``concatenate`` along axis
    0 in the first operand's layout.  ``casting`` is accepted for NumPy's signature; the cast
    to ``dtype`` is unchecked (``unsafe``)."""
    arrays = _operands(tup, "vstack")
    return concatenate(_as_tuple(atleast_2d(*arrays)), axis=0, dtype=dtype)


@collective_entry
def hstack(tup, *, dtype=None, casting="same_kind") -> DistArray:
    """Columns joined (``numpy.hstack``): 1-D operands along axis 0, others along axis 1
    (``concatenate``, first operand's layout; ``casting`` as :func:`vstack`)."""
    arrays = _as_tuple(atleast_1d(*_operands(tup, "hstack")))
    return concatenate(arrays, axis=0 if arrays[0].ndim == 1 else 1, dtype=dtype)


@collective_entry
def dstack(tup) -> DistArray:
    """``atleast_3d`` operands joined along axis 2 (``numpy.dstack``)."""
    return concatenate(_as_tuple(atleast_3d(*_operands(tup, "dstack"))), axis=2)


@collective_entry
def column_stack(tup) -> DistArray:
    """1-D operands as columns ``(N, 1)`` (the rows split like the operand) and 2-D operands
    joined along axis 1 (``numpy.column_stack``)."""
    arrays = _operands(tup, "column_stack")
    cols = [expand_dims(a, {0: (0, 1), 1: 1}[a.ndim]) if a.ndim < 2 else a for a in arrays]
    return concatenate(cols, axis=1)
