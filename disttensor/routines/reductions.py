"""Reductions over DistArrays: sum, prod, mean, var, std, min, max, any, all, and the NaN-skipping
nansum, nanprod, nanmean, nanvar, nanstd, nanmin, nanmax.  (argmin/argmax and their nan forms
are in :mod:`disttensor.routines.searching`, on this module's machinery.)

Each reduces its local block, then combines the partial results with one all-reduce over the
sub-communicator of the grid axes that split the reduced tensor axes (replicas along other grid
axes are not counted twice).  The result keeps the distribution of the axes that remain; a
reduced axis kept with ``keepdims`` has length 1 and is not split.  A reduction over all axes
returns a 0-d DistArray (replicated; ``float(r)``/``r.item()`` give the value).  Every function
is collective over the grid of ``x`` (the ranks agree on the axes, dtype and ``ddof``; over the
whole grid, not only the reduced grid axes).

``var``/``nanvar`` are two-pass (mean, then squared deviations).  Float sums add the ranks'
partial sums in another order than NumPy's pairwise sum: relative error ``O(n eps)`` in the
worst case.  The nan forms skip NaN in the local partial results; ``nanmin``/``nanmax`` of an
all-NaN slice give NaN (NumPy also warns).  For non-float dtypes they are the plain reductions.
"""
from __future__ import annotations

import builtins
import contextlib
import operator

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, dtype_key
from ..core.backend import array_module
from ..core.comm import allreduce
from ..core.distribution import Distribution
from ._operands import check_array

__all__ = ["sum", "prod", "mean", "var", "std", "min", "max", "any", "all", "nansum", "nanprod",
           "nanmean", "nanvar", "nanstd", "nanmin", "nanmax"]


def _axes(x: DistArray, axis) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    if isinstance(axis, (int, np.integer)):
        if x.ndim == 0 and int(axis) in (0, -1):
            return ()  # NumPy's legacy rule: an integer axis 0 / -1 of a 0-d array is allowed
        axis = (axis,)
    out = []
    for a in axis:
        a = operator.index(a)  # TypeError for floats, as NumPy
        if not -x.ndim <= a < x.ndim:
            raise np.exceptions.AxisError(a, x.ndim)
        out.append(a % x.ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"duplicate value in 'axis': {axis}")
    return tuple(sorted(out))


def _result_dist(x: DistArray, axes, keepdims: bool) -> Distribution:
    d = x.distribution
    if keepdims:
        shape = [1 if t in axes else n for t, n in enumerate(d.shape)]
        split = [None if t in axes else g for t, g in enumerate(d.split)]
        sizes = [None if (t in axes or g is None) else d.sizes(t) for t, g in enumerate(d.split)]
        return Distribution(shape, d.grid_dims, split, sizes)
    return d.drop_axes(axes)


def _comm(x: DistArray, axes):
    gaxes = [x.split[t] for t in axes if x.split[t] is not None]
    return x.grid.sub_comm(gaxes) if gaxes else None


def _finish(x: DistArray, partial, axes, keepdims: bool) -> DistArray:
    """``partial`` has the local block's shape with reduced axes of length 1."""
    partial = array_module(partial).asarray(partial)  # 0-d arithmetic gives NumPy scalars
    if not keepdims:
        partial = partial.reshape(tuple(n for t, n in enumerate(partial.shape) if t not in axes))
    return DistArray(partial, _result_dist(x, axes, keepdims), x.grid)


def _reduce(x: DistArray, axes, op: str, partial, keepdims: bool) -> DistArray:
    comm = _comm(x, axes)
    if comm is not None and comm.size > 1:
        partial = allreduce(comm, partial, op)
    return _finish(x, partial, axes, keepdims)


def _sum_prod(x: DistArray, axis, dtype, keepdims, op: str) -> DistArray:
    axes = _axes(x, axis)
    # float16 partial results would be rounded to float16 on every rank before they are
    # combined; NumPy accumulates half in float32 and rounds once, so do the same
    acc = np.float32 if dtype is None and x.dtype == np.float16 else dtype
    part = getattr(x.local, op)(axis=axes, dtype=acc, keepdims=True)
    r = _reduce(x, axes, op, part, keepdims)
    if acc is not dtype:
        r = DistArray(r.local.astype(np.float16), r.distribution, r.grid)
    return r


@contextlib.contextmanager
def _agreed(call: str, x: DistArray, axis, keepdims, **more):
    """The agreement block of reduction ``call`` (over the whole grid, not only the reduced
    grid axes: ranks reducing different axes would wait on different communicators)."""
    check_array(x, None)
    with agreed(x.grid.cart, call, x=x, axis=canon(axis), keepdims=bool(keepdims), **more):
        yield


@collective_entry
def sum(x: DistArray, axis=None, dtype=None, keepdims=False) -> DistArray:
    with _agreed("sum", x, axis, keepdims, dtype=dtype_key(dtype)):
        axes = _axes(x, axis)
    return _sum_prod(x, axes, dtype, keepdims, "sum")


@collective_entry
def prod(x: DistArray, axis=None, dtype=None, keepdims=False) -> DistArray:
    with _agreed("prod", x, axis, keepdims, dtype=dtype_key(dtype)):
        axes = _axes(x, axis)
    return _sum_prod(x, axes, dtype, keepdims, "prod")


def _count(x: DistArray, axes) -> int:
    n = 1
    for t in axes:
        n *= x.shape[t]
    return n


def _mean_dtype(x: DistArray, dtype):
    if dtype is not None:
        return np.dtype(dtype), np.dtype(dtype)
    if x.dtype.kind in "biu":
        return np.dtype(np.float64), np.dtype(np.float64)
    if x.dtype == np.float16:
        return np.dtype(np.float16), np.dtype(np.float32)  # NumPy accumulates half in float32
    return x.dtype, x.dtype


@collective_entry
def mean(x: DistArray, axis=None, dtype=None, keepdims=False) -> DistArray:
    with _agreed("mean", x, axis, keepdims, dtype=dtype_key(dtype)):
        axes = _axes(x, axis)
        out_dt, acc_dt = _mean_dtype(x, dtype)
    s = sum(x, axis=axes, dtype=acc_dt, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = s.local / _count(x, axes)
    return _finish(x, m.astype(out_dt, copy=False), axes, keepdims)


@collective_entry
def var(x: DistArray, axis=None, dtype=None, ddof=0, keepdims=False) -> DistArray:
    """Two-pass variance (mean first, then the sum of squared deviations)."""
    with _agreed("var", x, axis, keepdims, dtype=dtype_key(dtype), ddof=ddof):
        axes = _axes(x, axis)
        out_dt, acc_dt = _mean_dtype(x, dtype)
    m = mean(x, axis=axes, dtype=acc_dt, keepdims=True)
    dev = x.local.astype(acc_dt, copy=False) - m.local
    xp = array_module(dev)
    sq = (dev * xp.conj(dev)).real if xp.iscomplexobj(dev) else dev * dev
    part = sq.sum(axis=axes, keepdims=True)
    comm = _comm(x, axes)
    if comm is not None and comm.size > 1:
        part = allreduce(comm, part, "sum")
    with np.errstate(invalid="ignore", divide="ignore"):
        v = part / builtins.max(_count(x, axes) - ddof, 0)
    real_dt = np.empty(0, out_dt).real.dtype
    return _finish(x, v.astype(real_dt, copy=False), axes, keepdims)


@collective_entry
def std(x: DistArray, axis=None, dtype=None, ddof=0, keepdims=False) -> DistArray:
    with _agreed("std", x, axis, keepdims, dtype=dtype_key(dtype), ddof=ddof):
        _axes(x, axis)
    v = var(x, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims)
    v.local[...] = array_module(v.local).sqrt(v.local)
    return v


def _extreme_identity(dtype: np.dtype, op: str):
    if dtype.kind == "f":
        return np.inf if op == "min" else -np.inf
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.max if op == "min" else info.min
    if dtype.kind == "b":
        return op == "min"
    raise TypeError(f"{op} is not supported for dtype {dtype}")


def _minmax(x: DistArray, axis, keepdims, op: str) -> DistArray:
    with _agreed(op, x, axis, keepdims):
        axes = _axes(x, axis)
        if _count(x, axes) == 0:
            raise ValueError(f"zero-size array to reduction operation "
                             f"{'minimum' if op == 'min' else 'maximum'} which has no identity")
        if x.dtype.kind not in "biuf" and builtins.any(
                x.split[t] is not None and x.grid.dims[x.split[t]] > 1 for t in axes):
            raise TypeError(f"{op} over ranks is not supported for dtype {x.dtype}")
    loc = x.local
    if loc.size == 0:
        shape = tuple(1 if t in axes else n for t, n in enumerate(loc.shape))
        part = array_module(loc).full(shape, _extreme_identity(x.dtype, op), dtype=x.dtype)
    else:
        part = (loc.min if op == "min" else loc.max)(axis=axes, keepdims=True)
    return _reduce(x, axes, op, part, keepdims)


@collective_entry
def min(x: DistArray, axis=None, keepdims=False) -> DistArray:
    return _minmax(x, axis, keepdims, "min")


@collective_entry
def max(x: DistArray, axis=None, keepdims=False) -> DistArray:
    return _minmax(x, axis, keepdims, "max")


@collective_entry
def any(x: DistArray, axis=None, keepdims=False) -> DistArray:
    with _agreed("any", x, axis, keepdims):
        axes = _axes(x, axis)
    return _reduce(x, axes, "lor", x.local.any(axis=axes, keepdims=True), keepdims)


@collective_entry
def all(x: DistArray, axis=None, keepdims=False) -> DistArray:
    with _agreed("all", x, axis, keepdims):
        axes = _axes(x, axis)
    return _reduce(x, axes, "land", x.local.all(axis=axes, keepdims=True), keepdims)


# -- NaN-skipping reductions ----------------------------------------------------------------
def _nan_prep(call, x, axis, keepdims, **more):
    """The agreement block of nan-reduction ``call``; the reduced axes."""
    check_array(x)
    with agreed(x.grid.cart, call, x=x, axis=canon(axis), keepdims=bool(keepdims),
                **{k: canon(v) for k, v in more.items()}):
        axes = _axes(x, axis)
    return axes


def _nancount(x, axes):
    """The number of non-NaN elements along ``axes`` (``int64``, keepdims layout)."""
    xp = x.xp
    part = (~xp.isnan(x.local)).sum(axis=axes, keepdims=True, dtype=np.int64)
    return _reduce(x, axes, "sum", part, True)


def _nan_filled(x: DistArray, op: str) -> DistArray:
    """``x`` with NaN replaced by the identity of ``op`` (``inf`` for ``"min"``, ``-inf`` for
    ``"max"``), same layout; no messages."""
    xp = x.xp
    fill = np.inf if op == "min" else -np.inf
    return DistArray(xp.where(xp.isnan(x.local), fill, x.local).astype(x.dtype),
                     x.distribution, x.grid)


def _nan_sum_prod(call, x, axis, dtype, keepdims, op: str) -> DistArray:
    axes = _nan_prep(call, x, axis, keepdims, dtype=dtype_key(dtype))
    if x.dtype.kind not in "fc":
        return (sum if op == "sum" else prod)(x, axes, dtype, keepdims)
    part = getattr(x.xp, "nan" + op)(x.local, axis=axes, dtype=dtype, keepdims=True)
    return _reduce(x, axes, op, part, keepdims)


@collective_entry
def nansum(x: DistArray, axis=None, dtype=None, keepdims=False) -> DistArray:
    """Sum treating NaN as zero."""
    return _nan_sum_prod("nansum", x, axis, dtype, keepdims, "sum")


@collective_entry
def nanprod(x: DistArray, axis=None, dtype=None, keepdims=False) -> DistArray:
    """Product treating NaN as one."""
    return _nan_sum_prod("nanprod", x, axis, dtype, keepdims, "prod")


@collective_entry
def nanmean(x: DistArray, axis=None, dtype=None, keepdims=False) -> DistArray:
    """Mean of the non-NaN elements (NaN where there are none)."""
    axes = _nan_prep("nanmean", x, axis, keepdims, dtype=dtype_key(dtype))
    if x.dtype.kind not in "fc":
        return mean(x, axes, dtype, keepdims)
    s = nansum(x, axes, dtype, True)
    c = _nancount(x, axes)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = s.local / c.local
    return _finish(x, m.astype(s.dtype, copy=False), axes, keepdims)


@collective_entry
def nanvar(x: DistArray, axis=None, dtype=None, ddof=0, keepdims=False) -> DistArray:
    """Variance of the non-NaN elements (two-pass), divided by ``count - ddof``."""
    axes = _nan_prep("nanvar", x, axis, keepdims, dtype=dtype_key(dtype), ddof=ddof)
    if x.dtype.kind not in "fc":
        return var(x, axes, dtype, ddof, keepdims)
    m = nanmean(x, axes, dtype, True)
    xp = x.xp
    dev = x.local.astype(m.dtype, copy=False) - m.local
    sq = (dev * xp.conj(dev)).real if xp.iscomplexobj(dev) else dev * dev
    part = xp.nansum(sq, axis=axes, keepdims=True)
    s = _reduce(x, axes, "sum", part, True)
    c = _nancount(x, axes)
    with np.errstate(invalid="ignore", divide="ignore"):
        v = s.local / xp.maximum(c.local - ddof, 0)
    return _finish(x, v.astype(part.dtype, copy=False), axes, keepdims)


@collective_entry
def nanstd(x: DistArray, axis=None, dtype=None, ddof=0, keepdims=False) -> DistArray:
    """Square root of :func:`nanvar`."""
    _nan_prep("nanstd", x, axis, keepdims, dtype=dtype_key(dtype), ddof=ddof)
    v = nanvar(x, axis, dtype, ddof, keepdims)
    v.local[...] = v.xp.sqrt(v.local)
    return v


def _nanminmax(call, x, axis, keepdims, op: str) -> DistArray:
    """``nanmin``/``nanmax``: NaN replaced by the identity of ``op``, then NaN again where
    a slice had no other element."""
    axes = _nan_prep(call, x, axis, keepdims)
    extreme = min if op == "min" else max
    if x.dtype.kind not in "fc":
        return extreme(x, axes, keepdims)
    r = extreme(_nan_filled(x, op), axes, True)
    c = _nancount(x, axes)
    loc = x.xp.where(c.local == 0, np.nan, r.local).astype(x.dtype)
    return _finish(x, loc, axes, keepdims)


@collective_entry
def nanmin(x: DistArray, axis=None, keepdims=False) -> DistArray:
    """Minimum ignoring NaN (NaN for an all-NaN slice)."""
    return _nanminmax("nanmin", x, axis, keepdims, "min")


@collective_entry
def nanmax(x: DistArray, axis=None, keepdims=False) -> DistArray:
    """Maximum ignoring NaN (NaN for an all-NaN slice)."""
    return _nanminmax("nanmax", x, axis, keepdims, "max")

