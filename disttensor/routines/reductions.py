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

``where=`` (``sum``, ``prod``, ``min``, ``max``, ``any``, ``all``, ``mean``, ``var``, ``std``)
is a boolean mask broadcastable to ``x.shape`` (a scalar, a NumPy array or a DistArray, which
is aligned to ``x``'s layout like an elementwise operand); only the elements where it holds
are reduced.  ``initial=`` (``sum``, ``prod``, ``min``, ``max``) starts the reduction, as in
NumPy: it enters the sum/product once (on the first rank of each reducing communicator) and
every rank's minimum/maximum; with ``initial`` an empty min/max is allowed, and ``where=``
needs ``initial`` for min/max (NumPy's ``ValueError``).  ``mean``/``var``/``std`` with
``where`` divide by the number of selected elements (NaN where there are none).

``var``/``std`` over all axes make one pass over the local block and one all-gather of
three numbers per rank (:mod:`disttensor.routines._moments`); over some axes, and
``nanvar``, they are two-pass (mean, then squared deviations).  Float sums add the ranks'
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
from ..core.entry import agreed, canon, collective_entry, dtype_key, operand_key
from ..core.backend import array_module
from ..core.comm import allreduce
from ..core.distribution import Distribution
from ._moments import combine_over, local_moments
from ._operands import check_array
from .ufuncs import align

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


def _check_where(x: DistArray, where):
    """Validate a ``where=`` mask (inside the agreement block): ``None`` for ``True``."""
    if where is True:
        return None
    w = where if isinstance(where, DistArray) else np.asarray(where)
    if w.dtype.kind != "b":
        raise TypeError(f"Cannot cast array data from {w.dtype!r} to dtype('bool') according "
                        "to the rule 'safe'")
    try:
        ok = np.broadcast_shapes(w.shape, x.shape) == x.shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"operands could not be broadcast together with remapped shapes "
                         f"[original->remapped]: {x.shape} {w.shape}")
    if isinstance(w, DistArray) and not x.grid.compatible(w.grid):
        raise ValueError("where= lives on a grid over other ranks than the reduced array's")
    return w


def _local_mask(x: DistArray, w):
    """This rank's part of the validated mask ``w``, broadcast to ``x``'s local block (a
    redistribution, collective, when ``w`` is a DistArray of another layout)."""
    if w is None:
        return True
    loc = align(w, x.grid, x.distribution, x.device)
    xp = array_module(x.local)
    return xp.broadcast_to(xp.asarray(loc), x.local.shape)


def _first_of(x: DistArray, axes) -> bool:
    """Whether this rank is the first of its reducing communicator (where ``initial`` of a
    sum/product enters once)."""
    comm = _comm(x, axes)
    return comm is None or comm.Get_rank() == 0


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


def _sum_prod(x: DistArray, axis, dtype, keepdims, op: str, initial=None,
              mask=None) -> DistArray:
    axes = _axes(x, axis)
    # float16 partial results would be rounded to float16 on every rank before they are
    # combined; NumPy accumulates half in float32 and rounds once, so do the same
    acc = np.float32 if dtype is None and x.dtype == np.float16 else dtype
    more = {}
    if mask is not None:
        more["where"] = _local_mask(x, mask)
    if initial is not None:
        more["initial"] = initial if _first_of(x, axes) else (0 if op == "sum" else 1)
    part = getattr(x.local, op)(axis=axes, dtype=acc, keepdims=True, **more)
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
def sum(x: DistArray, axis=None, dtype=None, keepdims=False, *, initial=None,
        where=True) -> DistArray:
    with _agreed("sum", x, axis, keepdims, dtype=dtype_key(dtype), initial=initial,
                 where=operand_key(where)):
        axes = _axes(x, axis)
        mask = _check_where(x, where)
    return _sum_prod(x, axes, dtype, keepdims, "sum", initial, mask)


@collective_entry
def prod(x: DistArray, axis=None, dtype=None, keepdims=False, *, initial=None,
         where=True) -> DistArray:
    with _agreed("prod", x, axis, keepdims, dtype=dtype_key(dtype), initial=initial,
                 where=operand_key(where)):
        axes = _axes(x, axis)
        mask = _check_where(x, where)
    return _sum_prod(x, axes, dtype, keepdims, "prod", initial, mask)


def _count(x: DistArray, axes) -> int:
    n = 1
    for t in axes:
        n *= x.shape[t]
    return n


def _mask_count(x: DistArray, axes, mask):
    """The number of selected elements along ``axes`` (keepdims layout, this rank's part of
    the reduced result): an int without a mask, else an ``int64`` array (all-reduced)."""
    if mask is None:
        return _count(x, axes)
    part = _local_mask(x, mask).sum(axis=axes, keepdims=True, dtype=np.int64)
    return _reduce(x, axes, "sum", part, True).local


def _mean_dtype(x: DistArray, dtype):
    if dtype is not None:
        return np.dtype(dtype), np.dtype(dtype)
    if x.dtype.kind in "biu":
        return np.dtype(np.float64), np.dtype(np.float64)
    if x.dtype == np.float16:
        return np.dtype(np.float16), np.dtype(np.float32)  # NumPy accumulates half in float32
    return x.dtype, x.dtype


@collective_entry
def mean(x: DistArray, axis=None, dtype=None, keepdims=False, *, where=True) -> DistArray:
    with _agreed("mean", x, axis, keepdims, dtype=dtype_key(dtype), where=operand_key(where)):
        axes = _axes(x, axis)
        out_dt, acc_dt = _mean_dtype(x, dtype)
        mask = _check_where(x, where)
    s = _sum_prod(x, axes, acc_dt, True, "sum", None, mask)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = s.local / _mask_count(x, axes, mask)
    return _finish(x, m.astype(out_dt, copy=False), axes, keepdims)


@collective_entry
def var(x: DistArray, axis=None, dtype=None, ddof=0, keepdims=False, *,
        where=True) -> DistArray:
    """Variance.  Over all axes without ``where``: one pass over the local block in cache-sized
    chunks (count, mean and squared deviations of each, merged with Chan's update; no
    temporary of the block's size), then one all-gather of ``(n, mean, M2)`` per rank merged
    the same way (:mod:`disttensor.routines._moments`), computed in float64 (complex128)
    whatever the input's precision.  Otherwise two-pass (mean first, then the sum of squared
    deviations)."""
    with _agreed("var", x, axis, keepdims, dtype=dtype_key(dtype), ddof=ddof,
                 where=operand_key(where)):
        axes = _axes(x, axis)
        out_dt, acc_dt = _mean_dtype(x, dtype)
        mask = _check_where(x, where)
    real_dt = np.empty(0, out_dt).real.dtype
    if mask is None and len(axes) == x.ndim:
        work = np.result_type(acc_dt, np.float64)
        n, _, m2 = combine_over(_comm(x, axes), local_moments(x.local, work))
        with np.errstate(invalid="ignore", divide="ignore"):
            v = np.asarray(np.float64(m2) / builtins.max(n - ddof, 0), dtype=real_dt)
        return _finish(x, x.xp.asarray(v).reshape((1,) * x.ndim), axes, keepdims)
    m = mean(x, axis=axes, dtype=acc_dt, keepdims=True, where=where)
    dev = x.local.astype(acc_dt, copy=False) - m.local
    xp = array_module(dev)
    sq = (dev * xp.conj(dev)).real if xp.iscomplexobj(dev) else dev * dev
    part = sq.sum(axis=axes, keepdims=True,
                  **({} if mask is None else {"where": _local_mask(x, mask)}))
    comm = _comm(x, axes)
    if comm is not None and comm.size > 1:
        part = allreduce(comm, part, "sum")
    n = _mask_count(x, axes, mask)
    with np.errstate(invalid="ignore", divide="ignore"):
        v = part / (builtins.max(n - ddof, 0) if mask is None else xp.maximum(n - ddof, 0))
    return _finish(x, v.astype(real_dt, copy=False), axes, keepdims)


@collective_entry
def std(x: DistArray, axis=None, dtype=None, ddof=0, keepdims=False, *,
        where=True) -> DistArray:
    with _agreed("std", x, axis, keepdims, dtype=dtype_key(dtype), ddof=ddof,
                 where=operand_key(where)):
        _axes(x, axis)
        _check_where(x, where)
    v = var(x, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims, where=where)
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


def _minmax(x: DistArray, axis, keepdims, op: str, initial=None, where=True) -> DistArray:
    name = "minimum" if op == "min" else "maximum"
    with _agreed(op, x, axis, keepdims, initial=initial, where=operand_key(where)):
        axes = _axes(x, axis)
        mask = _check_where(x, where)
        if mask is not None and initial is None:
            raise ValueError(f"reduction operation '{name}' does not have an identity, so to "
                             "use a where mask one has to specify 'initial'")
        if _count(x, axes) == 0 and initial is None:
            raise ValueError(f"zero-size array to reduction operation {name} which has no "
                             "identity")
        if x.dtype.kind not in "biuf" and builtins.any(
                x.split[t] is not None and x.grid.dims[x.split[t]] > 1 for t in axes):
            raise TypeError(f"{op} over ranks is not supported for dtype {x.dtype}")
    loc = x.local
    if initial is not None:
        more = {} if mask is None else {"where": _local_mask(x, mask)}
        part = getattr(loc, op)(axis=axes, keepdims=True, initial=initial, **more)
    elif loc.size == 0:
        shape = tuple(1 if t in axes else n for t, n in enumerate(loc.shape))
        part = array_module(loc).full(shape, _extreme_identity(x.dtype, op), dtype=x.dtype)
    else:
        part = (loc.min if op == "min" else loc.max)(axis=axes, keepdims=True)
    return _reduce(x, axes, op, part, keepdims)


@collective_entry
def min(x: DistArray, axis=None, keepdims=False, *, initial=None, where=True) -> DistArray:
    return _minmax(x, axis, keepdims, "min", initial, where)


@collective_entry
def max(x: DistArray, axis=None, keepdims=False, *, initial=None, where=True) -> DistArray:
    return _minmax(x, axis, keepdims, "max", initial, where)


def _any_all(x: DistArray, axis, keepdims, where, op: str) -> DistArray:
    with _agreed(op, x, axis, keepdims, where=operand_key(where)):
        axes = _axes(x, axis)
        mask = _check_where(x, where)
    more = {} if mask is None else {"where": _local_mask(x, mask)}
    part = getattr(x.local, op)(axis=axes, keepdims=True, **more)
    return _reduce(x, axes, "lor" if op == "any" else "land", part, keepdims)


@collective_entry
def any(x: DistArray, axis=None, keepdims=False, *, where=True) -> DistArray:
    return _any_all(x, axis, keepdims, where, "any")


@collective_entry
def all(x: DistArray, axis=None, keepdims=False, *, where=True) -> DistArray:
    return _any_all(x, axis, keepdims, where, "all")


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

