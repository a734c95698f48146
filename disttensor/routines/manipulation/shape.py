"""Shape manipulation: transpose, moveaxis, reshape, concatenate, where.

``transpose``/``moveaxis`` only permute metadata and the local block (a view, no messages).
``reshape`` works locally whenever every group of merged/split axes holds at most one split
axis, which is the group's leading axis, and the block boundaries fall on whole rows of the
new leading axis; otherwise the offending groups are first made whole on every rank along
their grid axes (a redistribution that gathers those axes), reshaped, and split again
(balanced) on the group's new leading axis.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ...core.array import DistArray
from ...core.entry import agreed, canon, collective_entry, dtype_key, operand_key
from ...core.backend import array_module
from ...core.distribution import Distribution, balanced_sizes, offsets_from_sizes

__all__ = ["transpose", "moveaxis", "swapaxes", "reshape", "concatenate", "where",
           "reshape_groups"]


def _check(x) -> None:
    if not isinstance(x, DistArray):
        raise TypeError(f"expected a DistArray, got {type(x).__name__}")


@collective_entry
def transpose(x: DistArray, axes=None) -> DistArray:
    from numpy.lib.array_utils import normalize_axis_index
    _check(x)
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
    from numpy.lib.array_utils import normalize_axis_tuple
    _check(x)
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
    from numpy.lib.array_utils import normalize_axis_index
    _check(x)
    with agreed(x.grid.cart, "swapaxes", x=x, axis1=canon(a), axis2=canon(b)):
        a = normalize_axis_index(a, x.ndim, "axis1")
        b = normalize_axis_index(b, x.ndim, "axis2")
    order = list(range(x.ndim))
    order[a], order[b] = order[b], order[a]
    return transpose(x, order)


def reshape_groups(old, new) -> list[tuple[list[int], list[int]]]:
    """Pair runs of old and new axes with equal products (pure; both sizes non-zero)."""
    i = j = 0
    groups = []
    while i < len(old) or j < len(new):
        oa, na, po, pn = [], [], 1, 1
        if i < len(old):
            oa.append(i); po *= old[i]; i += 1
        if j < len(new):
            na.append(j); pn *= new[j]; j += 1
        while po != pn:
            if po < pn and i < len(old):
                oa.append(i); po *= old[i]; i += 1
            elif pn < po and j < len(new):
                na.append(j); pn *= new[j]; j += 1
            else:
                raise ValueError(f"cannot reshape array of shape {tuple(old)} into shape {tuple(new)}")
        # absorb trailing length-1 axes into this group
        groups.append((oa, na))
    return groups


def _normalize_shape(shape, size) -> tuple[int, ...]:
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    shape = [int(s) for s in shape]
    if shape.count(-1) > 1:
        raise ValueError("can only specify one unknown dimension")
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        if rest == 0 or size % rest:
            raise ValueError(f"cannot reshape array of size {size} into shape {tuple(shape)}")
        shape[shape.index(-1)] = size // rest
    if any(s < 0 for s in shape) or math.prod(shape) != size:
        raise ValueError(f"cannot reshape array of size {size} into shape {tuple(shape)}")
    return tuple(shape)


def _shape_key(shape):
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        return (int(shape),)
    return canon(shape)


@collective_entry
def reshape(x: DistArray, shape) -> DistArray:
    _check(x)
    with agreed(x.grid.cart, "reshape", x=x, shape=_shape_key(shape)):
        new = _normalize_shape(shape, x.size)
        if x.size:
            reshape_groups(x.shape, new)  # ValueError for shapes that do not pair up
    old = x.shape
    if new == old:
        return x.copy()
    d = x.distribution
    if x.size == 0:
        from ..creation import empty
        split = [None] * len(new)
        return empty(new, dtype=x.dtype, grid=x.grid, split=split, device=x.device)
    groups = reshape_groups(old, new)
    new_split: list = [None] * len(new)
    new_sizes: list = [None] * len(new)
    gather_axes: list[int] = []   # tensor axes to make whole first
    resplit: list[tuple[int, int]] = []  # (new axis, grid axis) to split again after
    for oa, na in groups:
        split_axes = [t for t in oa if d.split[t] is not None]
        if not split_axes:
            continue
        lead_new = next((u for u in na if new[u] > 1), None)
        ok = False
        if len(split_axes) == 1 and lead_new is not None:
            t = split_axes[0]
            if all(old[s] == 1 for s in oa if s < t):
                r_old = math.prod(old[s] for s in oa if s > t)
                r_new = math.prod(new[u] for u in na if u > lead_new)
                offs = d.offsets[t]
                if all((o * r_old) % r_new == 0 for o in offs):
                    ok = True
                    new_split[lead_new] = d.split[t]
                    new_sizes[lead_new] = [(b - a) * r_old // r_new for a, b in zip(offs[:-1], offs[1:])]
        if not ok:
            gather_axes += split_axes
            if lead_new is not None:
                resplit.append((lead_new, d.split[split_axes[0]]))
    y = x
    if gather_axes:
        split = [None if t in gather_axes else g for t, g in enumerate(d.split)]
        sizes = [None if (t in gather_axes or g is None) else d.sizes(t) for t, g in enumerate(d.split)]
        y = x.redistribute(distribution=Distribution(old, d.grid_dims, split, sizes))
    for u, g in resplit:
        new_split[u] = g
    nd = Distribution(new, d.grid_dims, new_split, new_sizes)
    # local shape with re-split axes still whole, then cut them
    whole = list(nd.block_shape(x.grid.coords))
    for u, _ in resplit:
        whole[u] = new[u]
    loc = y.local.reshape(tuple(whole))
    if resplit:
        idx = [slice(None)] * len(new)
        for u, g in resplit:
            offs = offsets_from_sizes(balanced_sizes(new[u], x.grid.dims[g]))
            c = x.grid.coords[g]
            idx[u] = slice(offs[c], offs[c + 1])
        loc = loc[tuple(idx)]
    if y is x:  # never alias the input's memory
        loc = loc.copy()
    return DistArray(loc, nd, x.grid)


@collective_entry
def concatenate(arrays, axis=0, dtype=None) -> DistArray:
    arrays = list(arrays)
    anchor = next((a for a in arrays if isinstance(a, DistArray)), None)
    with agreed(None if anchor is None else anchor.grid.cart, "concatenate",
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
def where(condition, x=None, y=None) -> DistArray:
    from ...core.array import _check_grids
    from ..ufuncs import align, operand_shape, result_layout, _device_of_operands
    ops = [np.asarray(o) if isinstance(o, (list, tuple)) else o for o in (condition, x, y)]
    anchor = next((o for o in ops if isinstance(o, DistArray)), None)
    with agreed(None if anchor is None else anchor.grid.cart, "where",
                condition=operand_key(ops[0]), x=operand_key(ops[1]), y=operand_key(ops[2])):
        if x is None or y is None:
            raise TypeError("where(condition) without x and y (nonzero) is not supported for "
                            "DistArray")
        shape = np.broadcast_shapes(*[operand_shape(o) for o in ops])
        grid, dist = result_layout(ops, shape)
        device = _device_of_operands([o for o in ops if isinstance(o, DistArray)])
        for o in ops:
            if isinstance(o, DistArray):
                _check_grids(o.grid, grid)
    locs = [align(o, grid, dist, device) for o in ops]
    xp = np if device == "cpu" else array_module(next(l for l in locs if hasattr(l, "shape")))
    r = xp.where(*locs)
    block = dist.block_shape(grid.coords)
    if tuple(r.shape) != block:
        r = xp.broadcast_to(r, block).copy()
    return DistArray(r, dist, grid)
