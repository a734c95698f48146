"""Indexing of DistArrays (NumPy's "Indexing routines"): ``x[key]`` / ``x[key] = value`` with
integers, slices (any step), ``...``, ``None`` and full-shape boolean masks, and ``take`` /
``take_along_axis``.  Every function is collective over the grid of ``x`` (the ranks agree on
the key; a rank-dependent index raises).

Basic indexing: ``x[key]`` returns a new DistArray (a copy, unlike NumPy's view).  Slices with
a positive step need no communication: every rank keeps the selected elements it owns, and the
result gets explicit (possibly uneven or empty) ownership sizes.  A negative step is the
positive-step selection followed by a flip (each block goes to the mirrored grid coordinate).
An integer index drops its axis; the element row is sent from its owner to the ranks that now
replicate it.  ``x[key] = value`` writes a scalar, a NumPy array (replicated) or a DistArray
(aligned to the selection by the rule of :mod:`disttensor.core.array`).  The key logic is
pure (:func:`normalize_key`).

Boolean masks: ``x[mask]`` (``mask`` a DistArray or NumPy array of ``x``'s shape) returns the
selected elements in row-major order, 1-D, split over the grid axis of the flattened ``x``
with explicit uneven ownership: rank ``c`` along it owns the hits of its own flat block
(:func:`disttensor.routines.searching.hits_distribution`).  ``x[mask] = v`` writes in place
(``v`` a scalar, a NumPy array of length ``count_nonzero(mask)``, or a 1-D DistArray).

Index arrays and boolean masks over some of the axes (``x[idx]``, ``X[X[:, 0] > 0]``) go to
:mod:`disttensor.routines.fancy_indexing` (gather / scatter with ``MPI_Alltoallv``).

``take``: the indices are replicated (a DistArray of indices is gathered), the input is made
whole along ``axis``, taken locally and cut into balanced blocks again.  ``take_along_axis``:
both arrays whole along ``axis`` in the layout of ``indices``, taken locally, redistributed
back to the layout of ``indices``.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, operand_key
from ..core.backend import array_module
from ..core.comm import collective
from ..core.distribution import Distribution
from ._operands import axis_index, check_array, cut_balanced, unsplit
from .manipulation.rearrange import flip
from .searching import hits_distribution
from .ufuncs import align, operand_shape

__all__ = ["AxisSelection", "normalize_key", "getitem", "setitem", "mask_getitem",
           "mask_setitem", "take", "take_along_axis"]


@dataclass(frozen=True)
class AxisSelection:
    """What a key does to one input axis: select ``range(start, stop, step)`` (``step > 0``),
    then reverse it if ``flip``; ``drop`` for an integer index (then ``stop = start + 1``)."""

    start: int
    stop: int
    step: int
    flip: bool = False
    drop: bool = False

    @property
    def count(self) -> int:
        return len(range(self.start, self.stop, self.step))


def normalize_key(key, shape) -> tuple[list[AxisSelection], list[int]]:
    """Per-axis selections and the positions of new (``None``) axes in the result."""
    if not isinstance(key, tuple):
        key = (key,)
    nd = len(shape)
    for k in key:
        if isinstance(k, (bool, np.bool_)) or not (
                k is None or k is Ellipsis or isinstance(k, (slice, numbers.Integral))):
            msg = ("only integers, slices (`:`), ellipsis (`...`) and None are valid "
                   f"DistArray indices (advanced indexing is not supported), got {k!r}")
            if isinstance(k, (bool, np.bool_, list, tuple)) or hasattr(k, "shape"):
                raise TypeError(msg)  # advanced indexing: NumPy would accept it
            raise IndexError(msg)  # a float, a string...: NumPy raises IndexError too
    if sum(k is Ellipsis for k in key) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(1 for k in key if k is not None and k is not Ellipsis)
    if used > nd:
        raise IndexError(f"too many indices for array: array is {nd}-dimensional, but {used} "
                         "were indexed")
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (nd - used) + key[i + 1:]
    else:
        key = key + (slice(None),) * (nd - used)
    sels: list[AxisSelection] = []
    new_axes: list[int] = []
    out_pos = 0
    for k in key:
        if k is None:
            new_axes.append(out_pos)
            out_pos += 1
            continue
        a = len(sels)
        n = shape[a]
        if isinstance(k, numbers.Integral):
            i = int(k)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {a} with size {n}")
            i %= n
            sels.append(AxisSelection(i, i + 1, 1, drop=True))
            continue
        start, stop, step = k.indices(n)
        cnt = len(range(start, stop, step))
        if step > 0:
            sels.append(AxisSelection(start, start + (cnt - 1) * step + 1, step) if cnt
                        else AxisSelection(0, 0, 1))
        else:
            if cnt == 0:
                sels.append(AxisSelection(0, 0, 1))
            else:
                last = start + (cnt - 1) * step
                sels.append(AxisSelection(last, start + 1, -step, flip=True))
        out_pos += 1
    return sels, new_axes


def _local_slice(sel: AxisSelection, a: int, b: int) -> slice:
    """Local slice of block ``[a, b)`` picking the selected indices it owns."""
    lo, hi = max(a, sel.start), min(b, sel.stop)
    if lo >= hi:
        return slice(0, 0)
    first = sel.start + -(-(lo - sel.start) // sel.step) * sel.step
    if first >= hi:
        return slice(0, 0)
    return slice(first - a, hi - a, sel.step)


def _selection(x: DistArray, sels):
    """(local slices, distribution of the positive-step selection, all axes kept)."""
    dist = x.distribution
    box = dist.block_box(x.grid.coords)
    local = tuple(_local_slice(s, a, b) for s, a, b in zip(sels, box.start, box.stop))
    for t, s in enumerate(sels):
        dist = (dist.slice_axis(t, s.start, s.stop, s.step) if s.count
                else dist.slice_axis(t, 0, 0, 1))
    return local, dist


@collective_entry
def getitem(x: DistArray, key) -> DistArray:
    """``x[key]`` (collective: the ranks agree on the key; a rank-dependent index raises).
    A boolean mask (DistArray or NumPy array of ``x``'s shape) selects as
    :func:`mask_getitem`."""
    if _is_mask(key, x.shape):
        return mask_getitem.__wrapped__(x, key)  # this entry point's agreement is its own
    from .fancy_indexing import fancy_getitem, is_fancy_key
    if is_fancy_key(key):  # index arrays, partial masks: routines/fancy_indexing.py
        return fancy_getitem.__wrapped__(x, key)
    with agreed(x.grid.cart, "getitem", x=x, key=key):
        sels, new_axes = normalize_key(key, x.shape)
    local_sl, dist = _selection(x, sels)
    # `...`: a 0-d block stays an array
    y = DistArray(x.local[local_sl + (Ellipsis,)].copy(), dist, x.grid)
    flips = [t for t, s in enumerate(sels) if s.flip]
    if flips:
        y = flip(y, flips)
    drops = [t for t, s in enumerate(sels) if s.drop]
    if drops:
        y = unsplit(y, drops)
        keep = [t for t in range(y.ndim) if t not in drops]
        loc = y.local.reshape(tuple(y.local.shape[t] for t in keep))
        y = DistArray(loc, y.distribution.drop_axes(drops), y.grid)
    if new_axes:
        y = _insert_axes(y, new_axes)
    return y


def _is_mask(key, shape) -> bool:
    """A boolean mask (DistArray or NumPy array) of the indexed array's whole ``shape``."""
    if isinstance(key, DistArray):
        return key.dtype == np.bool_ and key.shape == tuple(shape)
    return (isinstance(key, np.ndarray) and key.dtype == np.bool_ and key.ndim >= 1
            and key.shape == tuple(shape))


def _insert_axes(y: DistArray, positions) -> DistArray:
    d = y.distribution
    shape, split, sizes = list(d.shape), list(d.split), list(d.split_sizes)
    for p in sorted(positions):
        shape.insert(p, 1)
        split.insert(p, None)
        sizes.insert(p, None)
    nd = Distribution(shape, d.grid_dims, split, sizes)
    return DistArray(y.local.reshape(nd.block_shape(y.grid.coords)), nd, y.grid)


@collective_entry
def setitem(x: DistArray, key, value) -> None:
    """``x[key] = value`` (collective: the ranks agree on the key and on the value's
    metadata; a scalar value is data, agreed by type)."""
    from ..core.array import _check_grids
    if _is_mask(key, x.shape):
        return mask_setitem.__wrapped__(x, key, value)
    from .fancy_indexing import fancy_setitem, is_fancy_key
    if is_fancy_key(key):
        return fancy_setitem.__wrapped__(x, key, value)
    if isinstance(value, (list, tuple)):  # nested sequences are arrays, as in NumPy
        value = np.asarray(value)
    with agreed(x.grid.cart, "setitem", x=x, key=key, value=operand_key(value)):
        sels, new_axes = normalize_key(key, x.shape)
        # shape the value must broadcast to (NumPy's result shape of x[key])
        res_shape = [s.count for s in sels if not s.drop]
        for p in sorted(new_axes):
            res_shape.insert(p, 1)
        vshape = operand_shape(value)
        try:
            if np.broadcast_shapes(vshape, tuple(res_shape)) != tuple(res_shape):
                raise ValueError
        except ValueError:
            raise ValueError(f"could not broadcast input array from shape {vshape} into shape "
                             f"{tuple(res_shape)}") from None
        if isinstance(value, DistArray):
            _check_grids(value.grid, x.grid)
    local_sl, dist = _selection(x, sels)
    if not vshape:  # scalar or 0-d
        v = value.item() if isinstance(value, DistArray) else value
        x.local[local_sl] = v
        return
    # bring the value to the selection's axes: drop new axes, insert the integer-indexed ones
    full = (1,) * (len(res_shape) - len(vshape)) + tuple(vshape)
    sel_shape = [v for i, v in enumerate(full) if i not in set(new_axes)]
    it = iter(sel_shape)
    target = tuple(1 if s.drop else next(it) for s in sels)
    if isinstance(value, DistArray):
        v = value if value.shape == target else value.reshape(target)
        flips = [t for t, s in enumerate(sels) if s.flip and target[t] > 1]
        if flips:
            v = flip(v, flips)
    else:
        v = value.reshape(target)
        for t, s in enumerate(sels):
            if s.flip and target[t] > 1:
                v = array_module(v).flip(v, axis=t)
    x.local[local_sl] = align(v, x.grid, dist, x.device)


# -- boolean masks ----------------------------------------------------------------------------
def _mask_operand(x: DistArray, mask):
    """Validate a boolean mask of ``x``'s shape; a NumPy mask becomes a DistArray laid out as
    ``x``."""
    if isinstance(mask, DistArray):
        if mask.dtype != np.bool_:
            raise IndexError("a DistArray index must be a boolean mask")
        if not mask.grid.compatible(x.grid):
            raise ValueError("the mask lives on a grid over other ranks")
    else:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise IndexError("arrays used as indices must be boolean masks of the array's shape")
    if tuple(mask.shape) != x.shape:
        raise IndexError(f"boolean index of shape {tuple(mask.shape)} does not match the "
                         f"indexed array of shape {x.shape} (only full-shape masks)")
    return mask


def _aligned_mask(mask, y: DistArray):
    """The local block of ``mask`` under ``y``'s distribution and grid."""
    if isinstance(mask, DistArray):
        m = mask if mask.ndim == y.ndim and mask.shape == y.shape else mask.reshape(y.shape)
        if m.distribution != y.distribution or m.grid is not y.grid:
            m = m.redistribute(grid=y.grid, distribution=y.distribution)
        return m.local
    return y.xp.asarray(np.asarray(mask).reshape(y.shape)[y.local_slices])


@collective_entry
def mask_getitem(x: DistArray, mask) -> DistArray:
    """``x[mask]`` for a boolean ``mask`` (DistArray or NumPy) of ``x``'s shape: the selected
    elements in row-major order, 1-D with uneven distribution (module docstring)."""
    check_array(x)
    with agreed(x.grid.cart, "getitem[mask]", x=x, mask=operand_key(mask)):
        mask = _mask_operand(x, mask)
    y = x.reshape(-1) if x.ndim != 1 else x
    m = _aligned_mask(mask, y)
    loc = y.local[m]
    return DistArray(loc, hits_distribution(y, int(loc.shape[0])), y.grid)


@collective_entry
def mask_setitem(x: DistArray, mask, value) -> None:
    """``x[mask] = value`` in place: ``value`` a scalar (or 0-d), or 1-D with one element per
    selected position (NumPy array, replicated; or a DistArray)."""
    check_array(x)
    with agreed(x.grid.cart, "setitem[mask]", x=x, mask=operand_key(mask),
                value=operand_key(value)):
        mask = _mask_operand(x, mask)
        vshape = tuple(getattr(value, "shape", ()))
        if len(vshape) > 1:
            raise ValueError(f"NumPy boolean array indexing assignment cannot assign "
                             f"{len(vshape)}-d input values")
        if isinstance(value, DistArray) and not value.grid.compatible(x.grid):
            raise ValueError("the value lives on a grid over other ranks")
    if len(vshape) == 0 or vshape == (1,):
        v = value.item() if isinstance(value, DistArray) else np.asarray(value).reshape(())[()]
        m = _aligned_mask(mask, x) if x.ndim else None
        if x.ndim == 0:
            if bool(mask.item() if isinstance(mask, DistArray) else np.asarray(mask)):
                x.local[...] = v
        else:
            x.local[m] = v
        return
    y = x.reshape(-1) if x.ndim != 1 else x
    m = _aligned_mask(mask, y)
    cnt = int(m.sum())
    d = hits_distribution(y, cnt)
    with collective(x.grid.cart):
        if vshape[0] != d.shape[0]:
            raise ValueError(f"NumPy boolean array indexing assignment cannot assign "
                             f"{vshape[0]} input values to the {d.shape[0]} output values "
                             "where the mask is true")
    if isinstance(value, DistArray):
        vl = value.redistribute(grid=y.grid, distribution=d).local
    else:
        start = d.offsets[0][d.axis_coord(0, y.grid.coords)]
        vl = y.xp.asarray(np.asarray(value)[start:start + cnt])
    y.local[m] = vl
    if y is not x:
        back = y.reshape(x.shape)
        if back.distribution != x.distribution:
            back = back.redistribute(distribution=x.distribution)
        x.local[...] = back.local


# -- take -------------------------------------------------------------------------------------
@collective_entry
def take(x: DistArray, indices, axis=None) -> DistArray:
    """Elements of ``x`` at integer ``indices`` (replicated; a DistArray is gathered) along
    ``axis`` (``None``: of the flattened array).  Negative indices count from the end."""
    check_array(x)
    if isinstance(indices, DistArray):
        indices = indices.to_numpy()
    idx = np.asarray(indices)
    if idx.size == 0 and not isinstance(indices, np.ndarray):
        idx = idx.astype(np.intp)  # NumPy takes an empty list (float64 to asarray) as indices
    with agreed(x.grid.cart, "take", x=x, indices=canon(idx), axis=canon(axis)):
        if idx.dtype.kind not in "iu":
            raise IndexError("arrays used as indices must be of integer type")
        ax = None if axis is None else axis_index(axis, x.ndim)
        n = x.size if ax is None else x.shape[ax]
        if idx.size and (idx.max() >= n or idx.min() < -n):
            raise IndexError(f"index out of range for axis of size {n}")
    if ax is None:
        return take(x.reshape(-1), idx, 0)
    g = x.split[ax]
    y = unsplit(x, (ax,))
    xp = y.xp
    loc = xp.take(y.local, xp.asarray(idx.reshape(-1)), axis=ax)
    loc = loc.reshape(y.local.shape[:ax] + idx.shape + y.local.shape[ax + 1:])
    d = y.distribution
    shape = d.shape[:ax] + idx.shape + d.shape[ax + 1:]
    split = d.split[:ax] + (None,) * idx.ndim + d.split[ax + 1:]
    sz = [d.sizes(t) if s is not None else None for t, s in enumerate(d.split)]
    sizes = sz[:ax] + [None] * idx.ndim + sz[ax + 1:]
    base = Distribution(shape, d.grid_dims, split, sizes)
    return cut_balanced(loc, shape, base, x.grid, {ax: g} if idx.ndim == 1 else {})


@collective_entry
def take_along_axis(x: DistArray, indices: DistArray, axis=-1) -> DistArray:
    """``numpy.take_along_axis``: ``indices`` has ``x``'s number of axes and broadcasts
    against it off ``axis``; the result has the layout of ``indices``."""
    check_array(x)
    check_array(indices, "indices")
    with agreed(x.grid.cart, "take_along_axis", x=x, indices=indices, axis=canon(axis)):
        if indices.dtype.kind not in "iu":
            raise IndexError("`indices` must be an integer array")
        if indices.ndim != x.ndim:
            raise ValueError("`indices` and `arr` must have the same number of dimensions")
        ax = axis_index(axis, x.ndim)
        for t in range(x.ndim):
            if t != ax and x.shape[t] != indices.shape[t]:
                raise ValueError("`indices` and `arr` must have the same shape off `axis`")
    iw = unsplit(indices, (ax,))
    d = iw.distribution
    shape = list(d.shape)
    shape[ax] = x.shape[ax]
    xd = Distribution(shape, d.grid_dims, d.split,
                      [d.sizes(t) if g is not None else None for t, g in enumerate(d.split)])
    xl = align(x, indices.grid, xd, x.device)
    il = iw.local
    n = x.shape[ax]
    bad = bool(il.size and (il.max() >= n or il.min() < -n))
    with collective(x.grid.cart):
        if bad:
            raise IndexError(f"index out of range for axis of size {n}")
    loc = x.xp.take_along_axis(xl, il % n if n else il, axis=ax)
    r = DistArray(loc, d, indices.grid)
    return r if d == indices.distribution else r.redistribute(distribution=indices.distribution)

