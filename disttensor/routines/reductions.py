"""Reductions over DistArrays: sum, prod, mean, var, std, min, max, argmin, argmax, any, all.

Each reduces its local block, then combines the partial results with one all-reduce over the
sub-communicator of the grid axes that split the reduced tensor axes (replicas along other grid
axes are not counted twice).  The result keeps the distribution of the axes that remain; a
reduced axis kept with ``keepdims`` has length 1 and is not split.  A reduction over all axes
returns a 0-d DistArray (replicated; ``float(r)``/``r.item()`` give the value).
"""
from __future__ import annotations

import builtins
import contextlib
import operator

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, dtype_key
from ..core.backend import array_module, to_host
from ..core.comm import allreduce, mpi_type
from ..core.distribution import Distribution

__all__ = ["sum", "prod", "mean", "var", "std", "min", "max", "argmin", "argmax", "any", "all"]


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


def _check(x) -> None:
    if not isinstance(x, DistArray):
        raise TypeError(f"expected a DistArray, got {type(x).__name__}")


@contextlib.contextmanager
def _agreed(call: str, x: DistArray, axis, keepdims, **more):
    """The agreement block of reduction ``call`` (over the whole grid, not only the reduced
    grid axes: ranks reducing different axes would wait on different communicators)."""
    _check(x)
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
    with _agreed(f"arg{op}", x, axis, keepdims):
        if axis is not None and not isinstance(axis, (int, np.integer)):
            raise TypeError(f"'{type(axis).__name__}' object cannot be interpreted as an integer")
        if axis is not None and x.ndim == 0:
            _axes(x, axis)  # 0 and -1 are fine (as NumPy), anything else raises AxisError
            axis = None
        # NumPy raises only when the reduced axis (or the whole array) is empty; an empty
        # result along other axes is fine
        if (x.size == 0) if axis is None else (x.shape[_axes(x, axis)[0]] == 0):
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
        (a,) = _axes(x, axis)
        axes = (a,)
        if loc.shape[a]:
            k = np.argmin(loc, axis=a, keepdims=True) if op == "min" else np.argmax(loc, axis=a, keepdims=True)
            val = np.take_along_axis(loc, k, axis=a)
            idx = k.astype(np.int64) + box.start[a]
        else:
            shape = tuple(1 if t == a else n for t, n in enumerate(loc.shape))
            val = np.zeros(shape, dtype=x.dtype)
            idx = np.full(shape, -1, dtype=np.int64)
        comm = _comm(x, axes)
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
        d = _result_dist(x, axes, keepdims)
        return DistArray(xp.asarray(res) if xp is not np else res, d, x.grid)
    return _finish(x, xp.asarray(idx) if xp is not np else idx, axes, keepdims)


@collective_entry
def argmin(x: DistArray, axis=None, keepdims=False) -> DistArray:
    return _arg(x, axis, keepdims, "min")


@collective_entry
def argmax(x: DistArray, axis=None, keepdims=False) -> DistArray:
    return _arg(x, axis, keepdims, "max")
