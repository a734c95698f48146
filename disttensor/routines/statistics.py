"""Statistics (NumPy's "Statistics"): the order statistics ``quantile``, ``percentile``,
``median`` and their nan forms.  (``mean``, ``var``, ``std``, ``min``, ``max`` and their nan
forms are reductions: :mod:`disttensor.routines.reductions`; ``average``, ``cov``,
``corrcoef``, ``ptp``: :mod:`disttensor.routines.averages`; the histograms:
:mod:`disttensor.routines.histograms`.)  Every function is collective over the grid of ``x``.

``quantile(x, q, axis, method, keepdims)`` sorts
along ``axis`` (the distributed sort of :mod:`disttensor.routines.sorting`) and reads the
order statistics it needs with integer indexing (``nanquantile``: ``take_along_axis`` at each
line's count of non-NaN elements), combining them with NumPy's formulas (methods
``linear``, ``lower``, ``higher``, ``nearest``, ``midpoint``); a line holding a NaN gives NaN
(``quantile``).  ``percentile`` = ``quantile(q / 100)``; ``median`` = ``quantile(0.5)``.  The
result is laid out like a reduction of ``x`` over ``axis`` (a vector ``q`` adds a leading
unsplit axis).  That sort is the fallback: on CPU blocks the order statistics are served by
:mod:`disttensor.routines.order_statistics` (NumPy on whole lines; the sampled selection for
``axis=None`` of split data), with NumPy's values, dtypes (float32 data and a list ``q`` give
float64, a Python float ``q`` keeps float32) and empty-line rules (``median`` and the nan
forms: NaN with NumPy's ``RuntimeWarning``; ``quantile``/``percentile``: ``IndexError``).
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry
from . import reductions
from ._operands import axis_index, check_array
from .indexing import take_along_axis
from .manipulation import expand_dims, squeeze, stack
from .order_statistics import fast_quantile, numpy_dtype
from .sorting import sort

__all__ = ["quantile", "percentile", "median", "nanquantile", "nanpercentile", "nanmedian"]


# -- order statistics -------------------------------------------------------------------------
_METHODS = ("linear", "lower", "higher", "nearest", "midpoint")


def _order_stat(s: DistArray, ax: int, i: int) -> DistArray:
    return s[(slice(None),) * ax + (i,)]


def _quantile_one(s: DistArray, ax: int, n: int, q: float, method: str, nanline):
    """One quantile of the lines of ``s`` (sorted along ``ax``, NaNs last)."""
    v = q * (n - 1)
    if method == "lower":
        r = _order_stat(s, ax, int(np.floor(v)))
    elif method == "higher":
        r = _order_stat(s, ax, int(np.ceil(v)))
    elif method == "nearest":
        r = _order_stat(s, ax, int(np.around(v)))
    else:
        lo, hi = int(np.floor(v)), int(np.ceil(v))
        a = _order_stat(s, ax, lo).astype(np.float64) if s.dtype.kind in "biu" \
            else _order_stat(s, ax, lo)
        b = _order_stat(s, ax, hi).astype(a.dtype)
        if method == "midpoint":
            r = (a + b) / 2
        else:  # NumPy's _lerp: a + (b - a) t, or b - (b - a)(1 - t) for t >= 0.5
            t = v - lo
            diff = b - a
            r = b - diff * (1 - t) if t >= 0.5 else a + diff * t
    if nanline is not None:
        r = np.where(nanline, np.nan, r)
    return r


def _quantile_args(x, q, axis, method, keepdims, what: str, scale: float, kinds: str):
    """Agree and check the arguments of a quantile-type call (collective): ``q`` as a float
    array and the normalized ``axis`` (``None`` for the flattened array).  ``kinds``: the dtype
    kinds accepted (real numbers)."""
    check_array(x)
    qa = np.asarray(q, dtype=np.float64)
    ax = None
    with agreed(x.grid.cart, what, x=x, q=canon(qa) if qa.size <= 4096 else qa.shape,
                axis=canon(axis), method=method, keepdims=bool(keepdims)):
        if method not in _METHODS:
            raise ValueError(f"'method' must be one of {_METHODS}, got {method!r}")
        if qa.ndim > 1:
            raise ValueError(f"{what}: q must be a scalar or 1-D")
        if not np.all((qa >= 0) & (qa <= scale)):
            raise ValueError(f"{'Quantiles' if scale == 1 else 'Percentiles'} must be in the "
                             f"range [0, {scale:g}]")
        if axis is not None:
            ax = axis_index(axis, x.ndim)
        if (x.size if ax is None else x.shape[ax]) == 0 and "median" not in what \
                and not what.startswith("nan"):  # NumPy's error (median, nan*: NaN)
            raise IndexError("index -1 is out of bounds for axis 0 with size 0")
        if x.dtype.kind not in kinds:
            raise TypeError("a must be an array of real numbers")
    return qa, ax


def _sorted_lines(x, axis, ax):
    """``(y, ax, sort(y, axis=ax))``: the lines a quantile reads (the flattened ``x`` for
    ``axis=None``)."""
    y = x.reshape(-1) if axis is None else x
    ax = 0 if axis is None else ax
    return y, ax, sort(y, axis=ax)


def _stack_quantiles(rs, qa, x, axis, ax, keepdims):
    """The quantiles ``rs`` (one per entry of ``qa``) as NumPy lays them out: stacked on a
    leading axis for a vector ``q``, reduced axes kept as length 1 with ``keepdims``."""
    r = rs[0] if qa.ndim == 0 else stack(rs, axis=0)
    if keepdims:
        if axis is None:
            for _ in range(x.ndim):
                r = expand_dims(r, axis=r.ndim)
        else:
            r = expand_dims(r, axis=ax + (1 if qa.ndim else 0))
    return r


@collective_entry
def _quantile(x, q, axis, method, keepdims, what: str, scale: float):
    qa, ax = _quantile_args(x, q, axis, method, keepdims, what, scale, "biufmM")
    fast = fast_quantile(x, q, axis, ax, method, keepdims, what)
    if fast is not None:
        return fast
    qa = qa / scale
    y, ax, s = _sorted_lines(x, axis, ax)
    n = y.shape[ax]
    nanline = np.isnan(_order_stat(s, ax, n - 1)) if s.dtype.kind == "f" else None
    rs = [_quantile_one(s, ax, n, float(v), method, nanline) for v in qa.reshape(-1)]
    r = _stack_quantiles(rs, qa, x, axis, ax, keepdims)
    return r.astype(numpy_dtype(x.dtype, q, method, what))


def quantile(x: DistArray, q, axis=None, method="linear", keepdims=False):
    """NumPy ``quantile`` (``q`` in [0, 1], a scalar or 1-D sequence) along one ``axis``
    (``None``: of the flattened array), methods ``linear``, ``lower``, ``higher``, ``nearest``,
    ``midpoint``.  Collective; the result is laid out like a reduction of ``x`` over
    ``axis`` (a vector ``q`` adds a leading unsplit axis)."""
    return _quantile(x, q, axis, method, keepdims, "quantile", 1.0)


def percentile(x: DistArray, q, axis=None, method="linear", keepdims=False):
    """NumPy ``percentile``: :func:`quantile` of ``q / 100``."""
    return _quantile(x, q, axis, method, keepdims, "percentile", 100.0)


def median(x: DistArray, axis=None, keepdims=False):
    """NumPy ``median``: :func:`quantile` 0.5 (linear)."""
    return _quantile(x, 0.5, axis, "linear", keepdims, "median", 1.0)


def _nanquantile_one(s: DistArray, ax: int, valid: DistArray, q: float, method: str):
    """One quantile of the non-NaN elements of each line of ``s`` (sorted along ``ax``, NaNs
    last); ``valid`` (keepdims layout) counts them.  The order statistics are read with
    ``take_along_axis`` at per-line indices."""
    n = s.shape[ax]
    v = (valid - 1) * q  # virtual index per line (negative for an all-NaN line)

    def at(i):
        i = np.clip(i, 0, n - 1).astype(np.int64)
        return squeeze(take_along_axis(s, i, axis=ax), axis=ax)

    if method == "lower":
        r = at(np.floor(v))
    elif method == "higher":
        r = at(np.ceil(v))
    elif method == "nearest":
        r = at(np.around(v))
    else:
        lo = np.floor(v)
        a, b = at(lo), at(np.ceil(v))
        if a.dtype.kind in "biu":
            a, b = a.astype(np.float64), b.astype(np.float64)
        if method == "midpoint":
            r = (a + b) / 2
        else:
            t = squeeze(v - lo, axis=ax)
            diff = b - a
            r = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
    return np.where(squeeze(valid, axis=ax) == 0, np.nan, r)


@collective_entry
def _nanquantile(x, q, axis, method, keepdims, what: str, scale: float):
    qa, ax = _quantile_args(x, q, axis, method, keepdims, what, scale, "biuf")
    if x.dtype.kind != "f":
        return _quantile(x, q, axis, method, keepdims, what, scale)
    fast = fast_quantile(x, q, axis, ax, method, keepdims, what)
    if fast is not None:
        return fast
    qa = qa / scale
    y, ax, s = _sorted_lines(x, axis, ax)
    valid = reductions.sum(~np.isnan(y), axis=ax, dtype=np.int64, keepdims=True)
    rs = [_nanquantile_one(s, ax, valid, float(v), method) for v in qa.reshape(-1)]
    r = _stack_quantiles(rs, qa, x, axis, ax, keepdims)
    return r.astype(numpy_dtype(x.dtype, q, method, what))


def nanquantile(x: DistArray, q, axis=None, method="linear", keepdims=False):
    """NumPy ``nanquantile``: :func:`quantile` of the non-NaN elements of each line (NaN
    for a line of NaNs only).  Collective."""
    return _nanquantile(x, q, axis, method, keepdims, "nanquantile", 1.0)


def nanpercentile(x: DistArray, q, axis=None, method="linear", keepdims=False):
    """NumPy ``nanpercentile``: :func:`nanquantile` of ``q / 100``."""
    return _nanquantile(x, q, axis, method, keepdims, "nanpercentile", 100.0)


def nanmedian(x: DistArray, axis=None, keepdims=False):
    """NumPy ``nanmedian``: :func:`nanquantile` 0.5."""
    return _nanquantile(x, 0.5, axis, "linear", keepdims, "nanmedian", 1.0)

