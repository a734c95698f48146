"""Searching and counting (NumPy's "Searching" and "Counting"): ``argmin``, ``argmax``,
``nanargmin``, ``nanargmax``, ``nonzero``, ``argwhere``, ``where``, ``searchsorted`` and
``count_nonzero``.  Every function is collective over the grid of its DistArray operands.

argmin / argmax and their nan forms
-----------------------------------
Every rank finds the extremum of its block (along ``axis``, or of the whole block for
``axis=None``) with its global index; the candidates are all-gathered over the grid axes that
split the reduced axes and the best kept (NaN first, then the smaller/larger value, then the
lower global index, as NumPy).  The result is laid out like a reduction
(:mod:`disttensor.routines.reductions`).  ``nanargmin``/``nanargmax`` replace NaN by the
identity first; an all-NaN slice raises ``ValueError("All-NaN slice encountered")`` on every
rank.

where(condition, x, y)
----------------------
Elementwise under the alignment rule of :mod:`disttensor.core.array` (the result takes the
layout of the first operand of the full shape; the others are redistributed).

searchsorted(x1, x2, side="left")
---------------------------------
``x1`` is 1-D and sorted (NaNs last).  ``x2`` is brought to a layout not split over ``x1``'s
grid axis (a redistribution if it was), every rank counts with ``numpy.searchsorted`` against
its own block of ``x1``, and one all-reduce over ``x1``'s grid axis sums the counts.  The
result has ``x2``'s distribution (a NumPy ``x2`` or scalar gives a replicated NumPy result).

Data-dependent shapes
---------------------
``nonzero`` and ``argwhere`` return 1-D (``argwhere``: ``(k, ndim)``) DistArrays whose first
axis is split over the grid axis of the flattened input (``x.reshape(-1)``) with explicit
uneven ownership: rank ``c`` along it owns the hits of its own flat block, in global
row-major order (:func:`hits_distribution`; ``x[mask]`` and ``unique`` lay out their results
the same way).  Replicated inputs give replicated results.  ``count_nonzero`` is a sum of
``x != 0`` (a reduction).
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, operand_key
from ..core.backend import array_module, to_host
from ..core.comm import allreduce, mpi_type
from ..core.distribution import Distribution
from ._operands import anchor, axis_index, check_array, unsplit
from . import reductions
from .ufuncs import align, block_result, elementwise_layout

__all__ = ["argmin", "argmax", "nanargmin", "nanargmax", "nonzero", "argwhere", "where",
           "searchsorted", "count_nonzero", "hits_distribution"]


# -- argmin, argmax ---------------------------------------------------------------------------
def _better(op, v_new, i_new, v_best, i_best):
    """Where candidate (v_new, i_new) beats the current best: NaN first (as NumPy), then
    smaller (argmin) / larger (argmax) value, then lower global index; i < 0 is 'none'."""
    valid = i_new >= 0
    none_best = i_best < 0
    if v_new.dtype.kind in "fc":
        nan_new, nan_best = np.isnan(v_new), np.isnan(v_best)
    else:
        nan_new = nan_best = np.zeros(v_new.shape, bool)
    with np.errstate(invalid="ignore"):
        strictly = (v_new < v_best) if op == "min" else (v_new > v_best)
        equal = v_new == v_best
    plain = ~nan_new & ~nan_best & (strictly | (equal & (i_new < i_best)))
    nans = nan_new & (~nan_best | (i_new < i_best))
    return valid & (none_best | nans | plain)


def _arg(x: DistArray, axis, keepdims: bool, op: str) -> DistArray:
    with reductions._agreed(f"arg{op}", x, axis, keepdims):
        if axis is not None and not isinstance(axis, (int, np.integer)):
            raise TypeError(f"'{type(axis).__name__}' object cannot be interpreted as an integer")
        if axis is not None and x.ndim == 0:
            # 0 and -1 are fine (as NumPy), anything else raises AxisError
            reductions._axes(x, axis)
            axis = None
        # NumPy raises only when the reduced axis (or the whole array) is empty; an empty
        # result along other axes is fine
        if (x.size == 0) if axis is None else (x.shape[reductions._axes(x, axis)[0]] == 0):
            raise ValueError(f"attempt to get arg{op} of an empty sequence")
    loc = to_host(x.local)
    box = x.distribution.block_box(x.grid.coords)
    if axis is None:
        flat = loc.reshape(-1)
        if flat.size:
            k = int(np.argmin(flat) if op == "min" else np.argmax(flat))
            val = flat[k:k + 1]
            gidx = np.ravel_multi_index(
                tuple(s + i for s, i in zip(box.start, np.unravel_index(k, loc.shape))), x.shape)
            idx = np.array([gidx], dtype=np.int64)
        else:
            val = np.zeros(1, dtype=x.dtype)
            idx = np.array([-1], dtype=np.int64)
        comm = x.grid.cart
        axes = tuple(range(x.ndim))
    else:
        (a,) = reductions._axes(x, axis)
        axes = (a,)
        if loc.shape[a]:
            k = (np.argmin if op == "min" else np.argmax)(loc, axis=a, keepdims=True)
            val = np.take_along_axis(loc, k, axis=a)
            idx = k.astype(np.int64) + box.start[a]
        else:
            shape = tuple(1 if t == a else n for t, n in enumerate(loc.shape))
            val = np.zeros(shape, dtype=x.dtype)
            idx = np.full(shape, -1, dtype=np.int64)
        comm = reductions._comm(x, axes)
    if comm is not None and comm.size > 1:
        vals = np.empty((comm.size,) + val.shape, dtype=val.dtype)
        idxs = np.empty((comm.size,) + idx.shape, dtype=np.int64)
        vt = mpi_type(val.dtype)  # explicit: MPI has no name for float16 (moved as bytes)
        comm.Allgather([np.ascontiguousarray(val), vt], [vals, vt])
        comm.Allgather(np.ascontiguousarray(idx), idxs)
        bv, bi = vals[0].copy(), idxs[0].copy()
        for r in range(1, comm.size):
            upd = _better(op, vals[r], idxs[r], bv, bi)
            bv[upd] = vals[r][upd]
            bi[upd] = idxs[r][upd]
        idx = bi
    xp = array_module(x.local)
    if axis is None:
        res = idx.reshape((1,) * x.ndim) if keepdims else idx.reshape(())
        d = reductions._result_dist(x, axes, keepdims)
        return DistArray(xp.asarray(res) if xp is not np else res, d, x.grid)
    return reductions._finish(x, xp.asarray(idx) if xp is not np else idx, axes, keepdims)


@collective_entry
def argmin(x: DistArray, axis=None, keepdims=False) -> DistArray:
    """``int64`` index of the minimum (the first one; NaN counts as the minimum, as NumPy):
    of the flattened array for ``axis=None``, else along ``axis``."""
    return _arg(x, axis, keepdims, "min")


@collective_entry
def argmax(x: DistArray, axis=None, keepdims=False) -> DistArray:
    """``int64`` index of the maximum (the first one; NaN counts as the maximum, as NumPy)."""
    return _arg(x, axis, keepdims, "max")


def _nanarg(call, x, axis, keepdims, op: str) -> DistArray:
    """``nanargmin``/``nanargmax``: the all-NaN check (agreed), then the plain one with NaN
    replaced by the identity of ``op``."""
    reductions._nan_prep(call, x, None if axis is None else axis, keepdims)
    plain = argmin if op == "min" else argmax
    if x.dtype.kind not in "fc":
        return plain(x, axis, keepdims)
    axes = tuple(range(x.ndim)) if axis is None else (axis_index(axis, x.ndim),)
    if x.size and all(x.shape[t] for t in axes):
        c = reductions._nancount(x, axes)
        bad = np.asarray(bool((c.local == 0).any()))
        if x.grid.size > 1:
            bad = allreduce(x.grid.cart, bad, "lor")
        if bool(bad):
            raise ValueError("All-NaN slice encountered")
    return plain(reductions._nan_filled(x, op), axis, keepdims)


@collective_entry
def nanargmin(x: DistArray, axis=None, keepdims=False) -> DistArray:
    """Index of the minimum ignoring NaN; ``ValueError`` on every rank for an all-NaN slice."""
    return _nanarg("nanargmin", x, axis, keepdims, "min")


@collective_entry
def nanargmax(x: DistArray, axis=None, keepdims=False) -> DistArray:
    """Index of the maximum ignoring NaN; ``ValueError`` on every rank for an all-NaN slice."""
    return _nanarg("nanargmax", x, axis, keepdims, "max")


# -- where, searchsorted ----------------------------------------------------------------------
@collective_entry
def where(condition, x=None, y=None) -> DistArray:
    """Elements of ``x`` where ``condition`` holds, else of ``y`` (the alignment rule of
    :mod:`disttensor.core.array`; NumPy arrays and scalars are replicated values).  The
    one-argument form ``where(condition)`` is :func:`nonzero` (a tuple of index arrays laid
    out as the module docstring says)."""
    ops = [np.asarray(o) if isinstance(o, (list, tuple)) else o for o in (condition, x, y)]
    first = anchor(ops)
    with agreed(None if first is None else first.grid.cart, "where",
                condition=operand_key(ops[0]), x=operand_key(ops[1]), y=operand_key(ops[2])):
        if (x is None) != (y is None):
            raise ValueError("either both or neither of x and y should be given")
        if x is None:
            check_array(condition, "condition")
        else:
            grid, dist, device = elementwise_layout(ops)
    if x is None:
        return nonzero(condition)
    locs = [align(o, grid, dist, device) for o in ops]
    xp = np if device == "cpu" else array_module(next(v for v in locs if hasattr(v, "shape")))
    return block_result(xp.where(*locs), grid, dist)


@collective_entry
def searchsorted(x1: DistArray, x2, /, *, side="left", sorter=None):
    """Insertion indices of ``x2``'s elements into the sorted 1-D ``x1`` (collective).
    Returns ``int64`` with ``x2``'s distribution, or a NumPy array / integer (replicated) for a
    NumPy / scalar ``x2``."""
    check_array(x1, "x1")
    with agreed(x1.grid.cart, "searchsorted", x1=x1, x2=operand_key(x2), side=side,
                sorter=sorter is None):
        if x1.ndim != 1:
            raise ValueError(f"searchsorted: x1 must be 1-D, got {x1.ndim}-d")
        if side not in ("left", "right"):
            raise ValueError(f"side must be 'left' or 'right', got {side!r}")
        if sorter is not None:
            raise TypeError("searchsorted: sorter= is not supported for DistArrays")
        if isinstance(x2, DistArray) and not x2.grid.compatible(x1.grid):
            raise ValueError("searchsorted: x2 lives on a grid over other ranks than x1's")
    g = x1.split[0]
    loc1 = x1.local
    if not isinstance(x2, DistArray):
        v = np.asarray(x2)
        part = np.asarray(np.searchsorted(to_host(loc1), v, side=side), dtype=np.int64)
        if g is not None and x1.grid.dims[g] > 1:
            part = allreduce(x1.grid.sub_comm([g]), part, "sum")
        part = np.asarray(part).reshape(v.shape)
        return part if v.ndim else int(part)
    y = x2
    if x2.grid is not x1.grid:  # another grid over the same ranks: replicate x2 on x1's
        y = x2.redistribute(grid=x1.grid, split=(None,) * x2.ndim)
    elif g is not None and g in x2.split:
        y = unsplit(x2, (x2.split.index(g),))
    xp = x1.xp
    part = xp.asarray(xp.searchsorted(loc1, xp.asarray(y.local), side=side), dtype=np.int64)
    if g is not None and x1.grid.dims[g] > 1:
        part = allreduce(x1.grid.sub_comm([g]), part, "sum").reshape(y.local.shape)
    r = DistArray(part, y.distribution, x1.grid)
    return r if y is x2 else r.redistribute(grid=x2.grid, distribution=x2.distribution)


# -- non-zero elements -----------------------------------------------------------------------
def _flat(x: DistArray) -> DistArray:
    return x if x.ndim == 1 else x.reshape(-1)


def hits_distribution(y: DistArray, count: int, extra=()) -> Distribution:
    """Distribution of ``count`` local hits of the 1-D ``y`` per rank (uneven along its grid
    axis; replicated when ``y`` is)."""
    g = y.split[0]
    if g is None:
        return Distribution((count,) + tuple(extra), y.grid.dims, (None,) * (1 + len(extra)))
    sizes = y.grid.sub_comm([g]).allgather(int(count))
    return Distribution((sum(sizes),) + tuple(extra), y.grid.dims,
                        (g,) + (None,) * len(extra), [sizes] + [None] * len(extra))


def _flat_hits(x: DistArray):
    """(flattened x, global flat indices of its local non-zeros, their distribution)."""
    y = _flat(x)
    loc = y.local
    off = y.distribution.offsets[0][y.distribution.axis_coord(0, y.grid.coords)]
    xp = y.xp
    idx = xp.flatnonzero(loc).astype(np.int64) + off
    return y, idx, hits_distribution(y, int(idx.shape[0]))


@collective_entry
def nonzero(x: DistArray) -> tuple:
    """Tuple of ``x.ndim`` 1-D ``int64`` DistArrays with the indices of the non-zero elements
    in row-major order (uneven distribution: see the module docstring)."""
    check_array(x)
    with agreed(x.grid.cart, "nonzero", x=x):
        if x.ndim == 0:
            raise ValueError("Calling nonzero on 0d arrays is not allowed. Use "
                             "np.atleast_1d(scalar).nonzero() instead.")
    y, idx, d = _flat_hits(x)
    xp = y.xp
    coords = xp.unravel_index(idx, x.shape) if x.ndim > 1 else (idx,)
    return tuple(DistArray(c.astype(np.int64), d, y.grid) for c in coords)


@collective_entry
def argwhere(x: DistArray) -> DistArray:
    """``(k, x.ndim)`` ``int64`` indices of the non-zero elements (rows in row-major order;
    the first axis distributed as :func:`nonzero`'s results)."""
    check_array(x)
    with agreed(x.grid.cart, "argwhere", x=x):
        pass
    z = x.reshape(1) if x.ndim == 0 else x
    y, idx, d = _flat_hits(z)
    xp = y.xp
    nd = x.ndim
    if nd == 0:
        loc = xp.zeros((idx.shape[0], 0), dtype=np.int64)
    else:
        loc = xp.stack(xp.unravel_index(idx, x.shape), axis=1).astype(np.int64) \
            if idx.shape[0] else xp.zeros((0, nd), dtype=np.int64)
    d2 = Distribution(d.shape + (nd,), d.grid_dims, d.split + (None,),
                      list(d.split_sizes) + [None])
    return DistArray(loc, d2, y.grid)


@collective_entry
def count_nonzero(x: DistArray, axis=None, *, keepdims=False):
    """Number of non-zero elements (an ``int`` for ``axis=None`` without ``keepdims``, as
    NumPy; else an ``int64`` DistArray laid out like a reduction)."""
    check_array(x)
    with agreed(x.grid.cart, "count_nonzero", x=x, axis=canon(axis), keepdims=bool(keepdims)):
        reductions._axes(x, axis)
    r = reductions.sum(x != 0, axis=axis, dtype=np.int64, keepdims=keepdims)
    return int(r.item()) if axis is None and not keepdims else r

