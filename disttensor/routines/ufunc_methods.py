"""The ufunc methods on DistArrays (``__array_ufunc__`` with a method other than
``__call__``): ``reduce``, ``accumulate``, ``outer``, ``at`` and ``reduceat``, for every ufunc
NumPy allows them for.  Each is collective over the grid of its DistArray operand (the ranks
agree on the ufunc, the operands' metadata and the options before any data moves); errors are
NumPy's (found by running the method on a tiny stand-in of the operand's dtype and shape).

* ``reduce(x, axis=0, dtype=None, keepdims=False, initial=<none>)``: ``add``, ``multiply``,
  ``minimum``, ``maximum``, ``logical_and`` and ``logical_or`` go to
  :mod:`disttensor.routines.reductions` (:mod:`disttensor.routines.ufuncs`); the other
  reorderable ufuncs (:data:`REORDERABLE`: NumPy's, plus the bitwise ones and
  ``gcd``/``lcm``) reduce each block, all-gather the partial results over the grid axes that
  split the reduced axes and combine them in rank order (``initial`` enters once); the others
  (``subtract``, ``divide``, ``power``, ``arctan2``, comparisons, ...; one axis, as NumPy)
  gather the reduced axis whole and reduce in NumPy's order.  The result is laid out as a
  reduction: the kept axes keep their split, a 0-d result is a replicated 0-d DistArray.
* ``accumulate(x, axis=0, dtype=None)``: reorderable ufuncs scan each block and combine it
  with the all-gathered block totals of the lower coordinates; the others scan the axis
  whole.  The result has ``x``'s distribution.
* ``outer(a, b, **kwargs)``: ``ufunc(a[..., None...], b[None..., ...])`` under the alignment
  rule: ``a``'s axes keep their split, ``b``'s too where its grid axes are still free.
* ``at(a, indices, b=None)``: :func:`disttensor.routines.fancy_indexing.ufunc_at` (scatter
  with duplicates applied once per occurrence).
* ``reduceat(x, indices, axis=0, dtype=None)``: the axis is gathered whole, reduced with
  NumPy and cut into balanced blocks over its grid axis again (``indices`` replicated; a
  DistArray is gathered).

Options NumPy has and these do not (``out=``, ``where=`` of ``reduce``, ``casting=`` ...) raise
``TypeError`` naming them, never ignored.
"""
from __future__ import annotations

import numbers

import numpy as np

from ..core.array import DistArray
from ..core.backend import to_host
from ..core.comm import collective
from ..core.entry import agreed, canon, collective_entry, dtype_key, operand_key
from ._operands import axis_index, cut_balanced, unsplit

__all__ = ["REORDERABLE", "ufunc_method", "reduce", "accumulate", "outer", "reduceat"]

REORDERABLE = frozenset({
    np.add, np.multiply, np.minimum, np.maximum, np.fmin, np.fmax, np.hypot, np.logaddexp,
    np.logaddexp2, np.logical_and, np.logical_or, np.logical_xor, np.bitwise_and,
    np.bitwise_or, np.bitwise_xor, np.gcd, np.lcm})

_NO_VALUE = object()


def _unsupported(ufunc, method: str, kwargs: dict, allowed) -> None:
    """``TypeError`` for options we do not implement (``out=None`` is fine)."""
    bad = [k for k, v in kwargs.items() if k not in allowed
           and not (k == "out" and (v is None or (isinstance(v, tuple)
                                                   and all(o is None for o in v))))
           and not (k == "where" and v is True)]
    if bad:
        raise TypeError(f"{ufunc.__name__}.{method} on DistArrays does not support "
                        f"{', '.join(sorted(bad))}=")


def ufunc_method(ufunc, method: str, inputs, kwargs):
    """``getattr(ufunc, method)(*inputs, **kwargs)`` with a DistArray among the inputs
    (``NotImplemented`` when the first operand is not a DistArray or for unknown methods)."""
    if method == "at":
        from .fancy_indexing import ufunc_at
        if not isinstance(inputs[0], DistArray):
            return NotImplemented
        _unsupported(ufunc, method, kwargs, ())
        return ufunc_at(ufunc, *inputs)
    if method == "outer":
        return outer(ufunc, *inputs, **kwargs)
    if not isinstance(inputs[0], DistArray) or method not in ("reduce", "accumulate",
                                                              "reduceat"):
        return NotImplemented
    if method == "reduce":
        _unsupported(ufunc, method, kwargs, ("axis", "dtype", "keepdims", "initial"))
        return reduce(ufunc, *inputs, **{k: v for k, v in kwargs.items()
                                         if k not in ("out", "where")})
    if method == "accumulate":
        _unsupported(ufunc, method, kwargs, ("axis", "dtype"))
        return accumulate(ufunc, *inputs, **{k: v for k, v in kwargs.items() if k != "out"})
    _unsupported(ufunc, method, kwargs, ("axis", "dtype"))
    return reduceat(ufunc, *inputs, **{k: v for k, v in kwargs.items() if k != "out"})


def _stand_in(x: DistArray, keep_axis=None) -> np.ndarray:
    """Ones of ``x``'s dtype, each extent cut to 2 (``keep_axis`` keeps its extent)."""
    shape = tuple(n if t == keep_axis else min(n, 2) for t, n in enumerate(x.shape))
    return np.ones(shape, dtype=x.dtype)


def _axes(axis, nd: int) -> tuple:
    if axis is None:
        return tuple(range(nd))
    if isinstance(axis, numbers.Integral):
        axis = (axis,)
    return tuple(sorted(int(a) % nd for a in axis)) if nd else ()


def _reduce_dist(x: DistArray, axes, keepdims: bool):
    from .reductions import _result_dist
    return _result_dist(x, axes, keepdims)


def _combine(ufunc, pieces, start, dtype):
    """``pieces`` (``None`` for an empty block) folded with ``ufunc`` in order after
    ``start``."""
    acc = start
    for p in pieces:
        if p is None:
            continue
        acc = p if acc is None else np.asarray(ufunc(acc, p)).astype(dtype, copy=False)
    return acc


@collective_entry
def reduce(ufunc, x: DistArray, axis=0, dtype=None, keepdims=False, initial=_NO_VALUE):
    """``ufunc.reduce(x, axis, dtype, keepdims=..., initial=...)`` (module docstring)."""
    kw = {} if initial is _NO_VALUE else {"initial": initial}
    with agreed(x.grid.cart, f"{ufunc.__name__}.reduce", x=x, axis=canon(axis),
                dtype=dtype_key(dtype), keepdims=bool(keepdims),
                initial=operand_key(None if initial is _NO_VALUE else initial)):
        with np.errstate(all="ignore"):
            proto = np.asarray(ufunc.reduce(_stand_in(x), axis=axis, dtype=dtype,
                                            keepdims=keepdims, **kw))
        axes = _axes(axis, x.ndim)
    rd = _reduce_dist(x, axes, keepdims)
    split = [t for t in axes if x.split[t] is not None]
    if not split or x.grid.size == 1:
        r = ufunc.reduce(x.local, axis=axes, dtype=dtype, keepdims=keepdims, **kw)
        return DistArray(x.xp.asarray(r, dtype=proto.dtype).reshape(rd.block_shape(
            x.grid.coords)), rd, x.grid)
    if ufunc not in REORDERABLE:
        y = unsplit(x, split)
        with collective(x.grid.cart):  # value-dependent failures (integer division by zero)
            r = ufunc.reduce(y.local, axis=axes, dtype=dtype, keepdims=keepdims, **kw)
        return DistArray(y.xp.asarray(r, dtype=proto.dtype), rd, x.grid)
    loc = to_host(x.local)
    empty = any(loc.shape[t] == 0 for t in axes)
    part = None
    if not (empty and ufunc.identity is None):
        part = np.asarray(ufunc.reduce(loc, axis=axes, dtype=dtype, keepdims=True))
    comm = x.grid.sub_comm([x.split[t] for t in split])
    pieces = comm.allgather(part)
    start = None if initial is _NO_VALUE else np.asarray(initial)
    r = _combine(ufunc, pieces, start, proto.dtype)
    r = np.asarray(r, dtype=proto.dtype)
    if not keepdims:
        r = r.reshape(tuple(n for t, n in enumerate(r.shape) if t not in axes))
    shape = rd.block_shape(x.grid.coords)
    return DistArray(x.xp.asarray(np.broadcast_to(r, shape).copy()), rd, x.grid)


@collective_entry
def accumulate(ufunc, x: DistArray, axis=0, dtype=None):
    """``ufunc.accumulate(x, axis, dtype)``: the result has ``x``'s distribution."""
    with agreed(x.grid.cart, f"{ufunc.__name__}.accumulate", x=x, axis=canon(axis),
                dtype=dtype_key(dtype)):
        with np.errstate(all="ignore"):
            proto = ufunc.accumulate(_stand_in(x), axis=axis, dtype=dtype)
        ax = axis_index(axis, x.ndim)
    g = x.split[ax]
    if g is None or x.grid.size == 1:
        r = ufunc.accumulate(x.local, axis=ax, dtype=dtype)
        return DistArray(r.astype(proto.dtype, copy=False), x.distribution, x.grid)
    if ufunc not in REORDERABLE:
        y = unsplit(x, (ax,))
        with collective(x.grid.cart):
            r = ufunc.accumulate(y.local, axis=ax, dtype=dtype)
        whole = DistArray(r.astype(proto.dtype, copy=False), y.distribution, x.grid)
        return whole.redistribute(distribution=x.distribution)
    loc = to_host(x.local)
    acc = ufunc.accumulate(loc, axis=ax, dtype=dtype).astype(proto.dtype, copy=False)
    last = None
    if loc.shape[ax]:
        last = np.take(acc, [loc.shape[ax] - 1], axis=ax)
    comm = x.grid.sub_comm([g])
    totals = comm.allgather(last)
    prefix = _combine(ufunc, totals[:comm.rank], None, proto.dtype)
    if prefix is not None and acc.size:
        acc = np.asarray(ufunc(prefix, acc)).astype(proto.dtype, copy=False)
    return DistArray(x.xp.asarray(acc), x.distribution, x.grid)


@collective_entry
def outer(ufunc, a, b, **kwargs):
    """``ufunc.outer(a, b, **kwargs)``: shape ``a.shape + b.shape`` (module docstring)."""
    from .manipulation.dims import expand_dims
    first = a if isinstance(a, DistArray) else b
    with agreed(first.grid.cart, f"{ufunc.__name__}.outer", a=operand_key(a),
                b=operand_key(b)):
        if ufunc.nin != 2:
            raise ValueError("method outer is only supported for binary functions")
    ops = []
    for v, lead, trail in ((a, 0, np.ndim(b) if not isinstance(b, DistArray) else b.ndim),
                           (b, np.ndim(a) if not isinstance(a, DistArray) else a.ndim, 0)):
        if isinstance(v, DistArray):
            pos = tuple(range(lead)) + tuple(range(v.ndim + lead, v.ndim + lead + trail))
            ops.append(expand_dims(v, pos) if pos else v)
        else:
            v = np.asarray(v)
            ops.append(v.reshape((1,) * lead + v.shape + (1,) * trail))
    return ufunc(*ops, **kwargs)


@collective_entry
def reduceat(ufunc, x: DistArray, indices, axis=0, dtype=None):
    """``ufunc.reduceat(x, indices, axis, dtype)``: the result's ``axis`` (``len(indices)``
    long) is cut into balanced blocks over ``x``'s grid axis of ``axis``."""
    if isinstance(indices, DistArray):
        indices = indices.to_numpy()
    idx = np.asarray(indices)
    with agreed(x.grid.cart, f"{ufunc.__name__}.reduceat", x=x, indices=canon(idx),
                axis=canon(axis), dtype=dtype_key(dtype)):
        ax = axis_index(axis, x.ndim)
        with np.errstate(all="ignore"):
            proto = ufunc.reduceat(_stand_in(x, keep_axis=ax), idx, axis=ax, dtype=dtype)
    g = x.split[ax]
    y = unsplit(x, (ax,))
    with collective(x.grid.cart):
        r = ufunc.reduceat(y.local, idx, axis=ax, dtype=dtype)
    r = r.astype(proto.dtype, copy=False)
    d = y.distribution
    from ..core.distribution import Distribution
    shape = d.shape[:ax] + (r.shape[ax],) + d.shape[ax + 1:]
    base = Distribution(shape, d.grid_dims, d.split, d.split_sizes)
    return cut_balanced(r, shape, base, x.grid, {ax: g})
