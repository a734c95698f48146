"""Basic global indexing of DistArrays: integers, slices (any step), ``...`` and ``None``.

``x[key]`` returns a new DistArray (a copy, unlike NumPy's view).  Slices with a positive step
need no communication: every rank keeps the selected elements it owns, and the result gets
explicit (possibly uneven or empty) ownership sizes.  A negative step is the positive-step
selection followed by a flip (each block goes to the mirrored grid coordinate).  An integer
index drops its axis; the element row is sent from its owner to the ranks that now replicate
it.  ``x[key] = value`` writes a scalar, a NumPy array (replicated) or a DistArray (aligned
to the selection by the rule of :mod:`disttensor.core.array`).  The key logic is pure
(:func:`normalize_key`).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, operand_key
from ..core.backend import array_module, to_host
from ..core.distribution import Distribution

__all__ = ["AxisSelection", "normalize_key", "getitem", "setitem", "flip"]


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
        raise IndexError(f"too many indices for array: array is {nd}-dimensional, but {used} were indexed")
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
            sels.append(AxisSelection(start, start + (cnt - 1) * step + 1 if cnt else start, step) if cnt
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
        dist = dist.slice_axis(t, s.start, s.stop, s.step) if s.count else dist.slice_axis(t, 0, 0, 1)
    return local, dist


@collective_entry
def flip(x: DistArray, axis) -> DistArray:
    """Reverse ``x`` along ``axis`` (int or tuple).  Along a split axis the block of grid
    coordinate ``c`` goes to ``p-1-c`` and the ownership sizes are reversed."""
    from numpy.lib.array_utils import normalize_axis_tuple
    if not isinstance(x, DistArray):
        raise TypeError(f"expected a DistArray, got {type(x).__name__}")
    if isinstance(axis, range):
        axis = tuple(axis)
    with agreed(x.grid.cart, "flip", x=x, axis=canon(axis)):
        axes = normalize_axis_tuple(axis, x.ndim)  # AxisError / repeated-axis ValueError as NumPy
    y = x
    for t in axes:
        idx = [slice(None)] * y.ndim
        idx[t] = slice(None, None, -1)
        loc = y.local[tuple(idx)]
        dist = y.distribution
        g = dist.split[t]
        if g is None:
            y = DistArray(loc.copy(), dist, y.grid)
            continue
        sizes = dist.sizes(t)[::-1]
        new = dist.with_sizes(t, sizes)
        p = y.grid.dims[g]
        c = y.grid.coords[g]
        partner = p - 1 - c
        xp = array_module(loc)
        sub = y.grid.sub_comm([g])  # collective on first use: every rank, the middle one too
        if partner == c:
            out = loc.copy()
        else:
            shape = new.block_shape(y.grid.coords)
            send = np.ascontiguousarray(to_host(loc))
            recv = np.empty(shape, dtype=y.dtype)
            sub.Sendrecv(send, dest=partner, sendtag=17, recvbuf=recv, source=partner, recvtag=17)
            out = recv if xp is np else xp.asarray(recv)
        y = DistArray(out, new, y.grid)
    return y


@collective_entry
def getitem(x: DistArray, key) -> DistArray:
    """``x[key]`` (collective: the ranks agree on the key; a rank-dependent index raises).
    A boolean mask (DistArray or NumPy array of ``x``'s shape) selects as
    :func:`disttensor.routines.sorting.mask_getitem`."""
    if _is_mask(key):
        from .sorting import mask_getitem
        return mask_getitem.__wrapped__(x, key)  # this entry point's agreement is its own
    with agreed(x.grid.cart, "getitem", x=x, key=key):
        sels, new_axes = normalize_key(key, x.shape)
    local_sl, dist = _selection(x, sels)
    y = DistArray(x.local[local_sl + (Ellipsis,)].copy(), dist, x.grid)  # `...`: 0-d stays an array
    flips = [t for t, s in enumerate(sels) if s.flip]
    if flips:
        y = flip(y, flips)
    drops = [t for t, s in enumerate(sels) if s.drop]
    if drops:
        d = y.distribution
        if any(d.split[t] is not None for t in drops):
            split = [None if t in drops else g for t, g in enumerate(d.split)]
            sizes = [None if (t in drops or g is None) else d.sizes(t) for t, g in enumerate(d.split)]
            y = y.redistribute(distribution=Distribution(d.shape, d.grid_dims, split, sizes))
        keep = [t for t in range(y.ndim) if t not in drops]
        loc = y.local.reshape(tuple(y.local.shape[t] for t in keep))
        y = DistArray(loc, y.distribution.drop_axes(drops), y.grid)
    if new_axes:
        y = _insert_axes(y, new_axes)
    return y


def _is_mask(key) -> bool:
    """A DistArray key (masks are the DistArray keys supported) or a NumPy boolean array."""
    return isinstance(key, DistArray) or (isinstance(key, np.ndarray) and key.dtype == np.bool_
                                          and key.ndim >= 1)


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
    from .ufuncs import align, operand_shape
    if _is_mask(key):
        from .sorting import mask_setitem
        return mask_setitem.__wrapped__(x, key, value)
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
