"""Changing the number of dimensions (NumPy's "Changing number of dimensions"):
``expand_dims``, ``squeeze``, ``broadcast_to``, ``broadcast_arrays``, ``atleast_1d``,
``atleast_2d``, ``atleast_3d``.

* ``expand_dims``: a new length-1 axis, not split; the local block is reshaped (no messages).
* ``squeeze``: the removed length-1 axes are first made unsplit (a redistribution that only
  moves the one row from its owner to the ranks along that grid axis), then dropped locally.
* ``atleast_1d/2d/3d``: NumPy's new length-1 axes by ``expand_dims`` (whole, no messages);
  an operand that already has enough axes is returned itself (as NumPy returns its input).
* ``broadcast_to`` / ``broadcast_arrays``: the result layout follows the alignment rule of
  :mod:`disttensor.core.array`; broadcast (new or length-1) axes are replicated, the block is
  materialized (a copy, unlike NumPy's read-only view).

All collective over the operands' grid; the ranks agree on the axes and shapes first.
"""
from __future__ import annotations

import numbers

import numpy as np

from ...core.array import DistArray
from ...core.entry import agreed, canon, collective_entry, operand_key
from ...core.backend import array_module
from ...core.distribution import Distribution
from .._operands import anchor, axis_tuple, check_array, unsplit
from ..ufuncs import align, operand_shape, result_layout

__all__ = ["expand_dims", "squeeze", "broadcast_to", "broadcast_arrays", "atleast_1d",
           "atleast_2d", "atleast_3d"]


@collective_entry
def expand_dims(x: DistArray, axis=0) -> DistArray:
    """New length-1 axes at ``axis`` (int or tuple, positions in the result), not split."""
    check_array(x)
    with agreed(x.grid.cart, "expand_dims", x=x, axis=canon(axis)):
        n_new = len(axis) if isinstance(axis, (tuple, list)) else 1
        pos = axis_tuple(axis, x.ndim + n_new)
    d = x.distribution
    shape, split, sizes = [], [], []
    it = iter(range(x.ndim))
    for u in range(x.ndim + n_new):
        if u in pos:
            shape.append(1), split.append(None), sizes.append(None)
        else:
            t = next(it)
            shape.append(d.shape[t]), split.append(d.split[t])
            sizes.append(d.sizes(t) if d.split[t] is not None else None)
    nd = Distribution(shape, d.grid_dims, split, sizes)
    return DistArray(x.local.reshape(nd.block_shape(x.grid.coords)).copy(), nd, x.grid)


@collective_entry
def squeeze(x: DistArray, axis=None) -> DistArray:
    """Remove length-1 axes (all of them for ``axis=None``); ``ValueError`` for an axis whose
    length is not 1."""
    check_array(x)
    with agreed(x.grid.cart, "squeeze", x=x, axis=canon(axis)):
        if axis is None:
            axes = tuple(t for t, n in enumerate(x.shape) if n == 1)
        else:
            axes = axis_tuple(axis, x.ndim)
            for t in axes:
                if x.shape[t] != 1:
                    raise ValueError("cannot select an axis to squeeze out which has size "
                                     "not equal to one")
    y = unsplit(x, axes)
    nd = y.distribution.drop_axes(axes)
    loc = y.local.reshape(nd.block_shape(x.grid.coords))
    return DistArray(loc.copy() if y is x else loc, nd, x.grid)


@collective_entry
def broadcast_to(x: DistArray, shape) -> DistArray:
    """``x`` broadcast to ``shape`` (a materialized copy): axes of ``x`` that keep their
    length keep their split; new and stretched axes are replicated."""
    check_array(x)
    with agreed(x.grid.cart, "broadcast_to", x=x, shape=canon(shape)):
        shape = (int(shape),) if isinstance(shape, numbers.Integral) else tuple(shape)
        np.broadcast_shapes(x.shape, shape)
        if np.broadcast_shapes(x.shape, shape) != shape:
            raise ValueError(f"cannot broadcast a array of shape {x.shape} to shape {shape}")
    d = x.distribution
    off = len(shape) - x.ndim
    split = [None] * len(shape)
    sizes = [None] * len(shape)
    for t in range(x.ndim):
        if x.shape[t] == shape[t + off] and d.split[t] is not None:
            split[t + off], sizes[t + off] = d.split[t], d.sizes(t)
    nd = Distribution(shape, d.grid_dims, split, sizes)
    loc = align(x, x.grid, nd, x.device)
    return DistArray(x.xp.broadcast_to(loc, nd.block_shape(x.grid.coords)).copy(), nd, x.grid)


@collective_entry
def broadcast_arrays(*arrays) -> tuple:
    """The operands broadcast against each other, all in one layout (the alignment rule)."""
    first = anchor(arrays)
    with agreed(None if first is None else first.grid.cart, "broadcast_arrays",
                arrays=tuple(operand_key(a) for a in arrays)):
        if first is None:
            raise TypeError("broadcast_arrays needs at least one DistArray")
        shape = np.broadcast_shapes(*[operand_shape(a) for a in arrays])
        grid, dist = result_layout(list(arrays), shape)
    block = dist.block_shape(grid.coords)
    out = []
    for a in arrays:
        loc = align(a, grid, dist, first.device)
        xp = array_module(loc) if hasattr(loc, "shape") else np
        out.append(DistArray(xp.broadcast_to(xp.asarray(loc), block).copy(), dist, grid))
    return tuple(out)



def _atleast(arys, call: str, new_axes):
    """``new_axes(ndim)``: the positions of the length-1 axes that make one operand
    ``call``-dimensional (NumPy's rule); one result per operand, a single one unwrapped."""
    first = anchor(arys)
    with agreed(None if first is None else first.grid.cart, call,
                arys=tuple(operand_key(a) for a in arys)):
        for a in arys:
            check_array(a, None)
    out = [expand_dims(a, new_axes(a.ndim)) if new_axes(a.ndim) else a for a in arys]
    return out[0] if len(out) == 1 else tuple(out)


@collective_entry
def atleast_1d(*arys):
    """``numpy.atleast_1d`` of DistArrays: a 0-d operand becomes shape ``(1,)``."""
    return _atleast(arys, "atleast_1d", lambda nd: (0,) if nd == 0 else ())


@collective_entry
def atleast_2d(*arys):
    """``numpy.atleast_2d`` of DistArrays: ``()`` -> ``(1, 1)``, ``(N,)`` -> ``(1, N)`` (the
    ``N`` axis keeps its split)."""
    return _atleast(arys, "atleast_2d", lambda nd: {0: (0, 1), 1: (0,)}.get(nd, ()))


@collective_entry
def atleast_3d(*arys):
    """``numpy.atleast_3d`` of DistArrays: ``()`` -> ``(1, 1, 1)``, ``(N,)`` -> ``(1, N, 1)``,
    ``(M, N)`` -> ``(M, N, 1)`` (existing axes keep their split)."""
    return _atleast(arys, "atleast_3d",
                    lambda nd: {0: (0, 1, 2), 1: (0, 2), 2: (2,)}.get(nd, ()))
