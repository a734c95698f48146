"""Mathematical functions (NumPy's "Mathematical functions") that are neither ufuncs
(:mod:`disttensor.routines.ufuncs`), reductions (:mod:`disttensor.routines.reductions`) nor
scans (:mod:`disttensor.routines.scans`): ``clip`` and ``round`` (elementwise), ``diff``.

* ``clip`` (scalar, NumPy or DistArray bounds) and ``round`` are elementwise under the
  alignment rule of :mod:`disttensor.core.array`; the result has the dtype of ``x``.
* ``diff``: differences of two slices (``x[1:] - x[:-1]``, the alignment rule redistributes
  one of them), ``n`` times; ``prepend``/``append`` are concatenated first.

All collective over the operands' grid; the ranks agree on the arguments first.
"""
from __future__ import annotations

import builtins
import operator

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, operand_key
from ..core.backend import array_module
from ._operands import axis_index, check_array
from .manipulation.join import concatenate
from .ufuncs import elementwise

__all__ = ["clip", "round", "diff"]


@collective_entry
def clip(x: DistArray, min=None, max=None) -> DistArray:
    """``x`` limited to ``[min, max]`` (scalars, NumPy arrays or DistArrays, broadcast;
    ``None`` means no bound); the dtype is ``x``'s (the array API rule)."""
    check_array(x)
    if x.dtype.kind in "iu":  # a Python int bound outside the dtype's range bounds nothing
        info = np.iinfo(x.dtype)
        min, max = (v if not isinstance(v, int) or isinstance(v, bool)
                    else builtins.min(builtins.max(v, int(info.min)), int(info.max))
                    for v in (min, max))
    ops = [x] + [v for v in (min, max) if v is not None]
    has_lo, has_hi = min is not None, max is not None

    def fn(u, *b, **_):
        xp = array_module(u)
        r = u
        if has_lo:
            r = xp.maximum(r, b[0])
        if has_hi:
            r = xp.minimum(r, b[-1])
        return xp.asarray(r).astype(u.dtype, copy=False)
    return elementwise(fn, "clip", ops, has_min=has_lo, has_max=has_hi)


@collective_entry
def round(x: DistArray, decimals=0) -> DistArray:
    """Round half to even to ``decimals`` decimals (elementwise, the dtype of ``x``)."""
    check_array(x)
    return elementwise(lambda u, decimals: array_module(u).round(u, decimals), "round", (x,),
                       decimals=operator.index(decimals))


@collective_entry
def diff(x: DistArray, n=1, axis=-1, prepend=None, append=None) -> DistArray:
    """``n``-th differences along ``axis`` (NumPy's ``diff``; the array API's ``diff(x, /, *,
    axis=-1, n=1, prepend=None, append=None)`` is the same call with keywords)."""
    check_array(x)
    with agreed(x.grid.cart, "diff", x=x, n=canon(n), axis=canon(axis),
                prepend=operand_key(prepend), append=operand_key(append)):
        n = operator.index(n)
        if n < 0:
            raise ValueError(f"order must be non-negative but got {n}")
        if x.ndim == 0:
            raise ValueError("diff requires input that is at least one dimensional")
        ax = axis_index(axis, x.ndim)
        for v in (prepend, append):
            if v is not None and not isinstance(v, DistArray):
                raise TypeError("prepend/append must be DistArrays")
    y = x
    parts = [p for p in (prepend, x, append) if p is not None]
    if len(parts) > 1:
        y = concatenate(parts, axis=ax)
    pre = (slice(None),) * ax
    for _ in range(n):
        a, b = y[pre + (slice(1, None),)], y[pre + (slice(None, -1),)]
        y = np.not_equal(a, b) if y.dtype == np.bool_ else a - b
    return y.copy() if y is x else y

