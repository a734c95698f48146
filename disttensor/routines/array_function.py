"""The ``__array_function__`` dispatch table: which DistArray implementation a NumPy function
called on a DistArray runs (``np.sum(x)``, ``np.concatenate([x, y])``, ``np.pad(x, 1)``, ...).

:data:`HANDLED` maps each supported NumPy function to an adapter that takes NumPy's signature
(positional parameters bind as in NumPy) and calls the routine of
:mod:`disttensor.routines`.  Options the routines do not implement (``out=``, ``where=``,
``initial=``, ``order=``, ``weights=`` of quantiles, ...) raise ``TypeError`` instead of being
ignored.  :func:`implementation` is what :meth:`DistArray.__array_function__` looks up: it
adds the tables of :mod:`disttensor.linalg` and :mod:`disttensor.fft` (layers above this one)
on first use.  Every implementation is collective, as the routine it calls.
"""
from __future__ import annotations

import os

import numpy as np

from . import creation, logic, manipulation, mathematical, npyio, padding, reductions, scans
from . import searching, sets, sorting, statistics
from . import blocks
from . import averages, calculus, histograms
from .indexing import take, take_along_axis
from .fancy_indexing import put as _put
from .manipulation import flip
from .ufuncs import elementwise
from ..core.backend import array_module
from ..core import printing

__all__ = ["HANDLED", "implementation"]


_NOVALUE = getattr(np, "_NoValue", object())


def _red(fn, params, extra=()):
    """``np.<reduction>`` for DistArrays.  ``params`` are NumPy's parameter names after ``a``
    (so positional arguments bind as in NumPy); ``extra`` are those passed on to ``fn``.
    Options a reduction does not implement (``out=``, ``mean=``, ``where=``/``initial=`` of the
    nan forms) raise ``TypeError`` instead of being ignored; ``correction`` is ``ddof``."""
    def impl(a, *args, **kwargs):
        if len(args) > len(params):
            raise TypeError(f"{fn.__name__}() takes at most {len(params) + 1} positional "
                            "arguments")
        for name, v in zip(params, args):
            if name in kwargs:
                raise TypeError(f"{fn.__name__}() got multiple values for argument '{name}'")
            kwargs[name] = v
        kwargs = {k: v for k, v in kwargs.items() if v is not _NOVALUE}
        if kwargs.pop("out", None) is not None:
            raise TypeError("out= is not supported for DistArray reductions")
        for name in ("where", "initial", "mean"):
            if name in kwargs and name not in extra:
                if name == "where" and kwargs[name] is True:
                    del kwargs[name]
                    continue
                raise TypeError(f"{name}= is not supported for DistArray {fn.__name__}")
        if "correction" in kwargs:  # NumPy 2 spelling of ddof
            c = kwargs.pop("correction")
            if kwargs.get("ddof", 0) != 0:
                raise ValueError("ddof and correction can't be provided simultaneously.")
            kwargs["ddof"] = c
        unknown = set(kwargs) - set(extra) - {"axis", "keepdims"}
        if unknown:
            raise TypeError(f"{fn.__name__}() got unexpected keyword argument(s) "
                            f"{sorted(unknown)}")
        kw = {k: v for k, v in kwargs.items() if k in extra and v is not None}
        return fn(a, axis=kwargs.get("axis"), keepdims=bool(kwargs.get("keepdims", False)), **kw)
    return impl


# NumPy's positional parameters after ``a``
_SUM = ("axis", "dtype", "out", "keepdims", "initial", "where")
_MEAN = ("axis", "dtype", "out", "keepdims")
_VAR = ("axis", "dtype", "out", "ddof", "keepdims")
_MIN = ("axis", "out", "keepdims", "initial", "where")
_ARG = ("axis", "out")
_ANY = ("axis", "out", "keepdims")


def _reductions():
    r, s = reductions, searching
    d, dv = ("dtype",), ("dtype", "ddof")
    w, iw = ("where",), ("initial", "where")  # where=/initial=: reductions.py
    return {
        np.sum: _red(r.sum, _SUM, d + iw), np.prod: _red(r.prod, _SUM, d + iw),
        np.mean: _red(r.mean, _MEAN, d + w),
        np.var: _red(r.var, _VAR, dv + w), np.std: _red(r.std, _VAR, dv + w),
        np.min: _red(r.min, _MIN, iw), np.max: _red(r.max, _MIN, iw),
        np.amin: _red(r.min, _MIN, iw), np.amax: _red(r.max, _MIN, iw),
        np.argmin: _red(s.argmin, _ARG), np.argmax: _red(s.argmax, _ARG),
        np.any: _red(r.any, _ANY, w), np.all: _red(r.all, _ANY, w),
        np.nansum: _red(r.nansum, _SUM, d), np.nanprod: _red(r.nanprod, _SUM, d),
        np.nanmean: _red(r.nanmean, _MEAN, d),
        np.nanvar: _red(r.nanvar, _VAR, dv), np.nanstd: _red(r.nanstd, _VAR, dv),
        np.nanmin: _red(r.nanmin, _MIN), np.nanmax: _red(r.nanmax, _MIN),
        np.nanargmin: _red(s.nanargmin, _ANY), np.nanargmax: _red(s.nanargmax, _ANY),
    }


def _np_clip(a, a_min=None, a_max=None, out=None, *, min=None, max=None, **kw):
    if out is not None or kw:
        raise TypeError("out= and ufunc keywords are not supported by clip of DistArrays")
    lo = a_min if a_min is not None else min
    hi = a_max if a_max is not None else max
    return mathematical.clip(a, lo, hi)


def _np_round(a, decimals=0, out=None):
    if out is not None:
        raise TypeError("out= is not supported for DistArray")
    return mathematical.round(a, decimals)


def _np_sort(fn):
    """``np.sort``/``np.argsort``: ``axis=None`` sorts the flattened array; ``order=`` raises."""
    def impl(a, axis=-1, kind=None, order=None, *, stable=None):
        if order is not None:
            raise TypeError(f"{fn.__name__}: order= is not supported for DistArrays")
        if axis is None:
            return fn(a.reshape(-1), axis=0)
        return fn(a, axis=axis)
    return impl


def _np_partition(fn):
    """``np.partition``/``np.argpartition``: ``kind=``/``order=`` other than NumPy's default
    raise."""
    def impl(a, kth, axis=-1, kind="introselect", order=None):
        if order is not None or kind != "introselect":
            raise TypeError(f"{fn.__name__}: kind= and order= are not supported for DistArrays")
        return fn(a, kth, axis=axis)
    return impl


def _np_q(fn):
    def impl(a, q, axis=None, out=None, overwrite_input=False, method="linear",
             keepdims=False, *, weights=None, interpolation=None):
        if out is not None or weights is not None or interpolation is not None:
            raise TypeError("out=, weights= and interpolation= are not supported for DistArrays")
        return fn(a, q, axis=axis, method=method, keepdims=keepdims)
    return impl


def _np_median(a, axis=None, out=None, overwrite_input=False, keepdims=False):
    if out is not None:
        raise TypeError("out= is not supported for DistArrays")
    return statistics.median(a, axis=axis, keepdims=keepdims)


def _np_scan(fn):
    def impl(a, axis=None, dtype=None, out=None):
        if out is not None:
            raise TypeError("out= is not supported for DistArray scans")
        return fn(a, axis, dtype)
    return impl


def _np_unique(ar, return_index=False, return_inverse=False, return_counts=False, axis=None,
               *, equal_nan=True, sorted=True):
    return sets.unique(ar, return_index, return_inverse, return_counts, axis,
                       equal_nan=equal_nan)


def _np_save(file, arr, allow_pickle=True, fix_imports=None):
    """``numpy.save(path, distarray)``: :func:`~disttensor.routines.npyio.save`, with NumPy's
    ``.npy`` suffix added to a path without it (an open file object raises ``TypeError`` on
    every rank: the ranks write the file in parallel; ``allow_pickle`` is irrelevant for
    numeric data)."""
    if isinstance(file, (str, os.PathLike)) and not os.fspath(file).endswith(".npy"):
        file = os.fspath(file) + ".npy"
    return npyio.save(file, arr)


def _routines():
    c, m, st = creation, manipulation, statistics
    table = {
        # creation
        np.zeros_like: lambda a, dtype=None, **kw: c.zeros_like(a, dtype),
        np.ones_like: lambda a, dtype=None, **kw: c.ones_like(a, dtype),
        np.empty_like: lambda a, dtype=None, **kw: c.empty_like(a, dtype),
        np.full_like: lambda a, fill_value, dtype=None, **kw: c.full_like(a, fill_value, dtype),
        np.meshgrid: lambda *xi, copy=True, sparse=False, indexing="xy": list(
            c.meshgrid(*xi, indexing=indexing)),
        np.tril: c.tril,
        np.triu: c.triu,
        # manipulation
        np.copy: lambda a, order="K", subok=False: a.copy(),
        np.shape: lambda a: a.shape,
        np.ndim: lambda a: a.ndim,
        np.size: lambda a, axis=None: a.size if axis is None else a.shape[axis],
        np.astype: lambda x, dtype, *, copy=True, device=None: x.astype(dtype, copy=copy),
        np.reshape: lambda a, shape=None, order="C", **kw: m.reshape(
            a, shape if shape is not None else kw["newshape"]),
        np.transpose: lambda a, axes=None: m.transpose(a, axes),
        np.moveaxis: m.moveaxis,
        np.swapaxes: m.swapaxes,
        np.expand_dims: m.expand_dims,
        np.squeeze: m.squeeze,
        np.broadcast_to: lambda array, shape, subok=False: m.broadcast_to(array, shape),
        np.broadcast_arrays: lambda *args, subok=False: list(m.broadcast_arrays(*args)),
        np.concatenate: lambda arrays, axis=0, out=None, dtype=None, casting="same_kind":
            m.concatenate(arrays, axis=axis, dtype=dtype),
        np.stack: lambda arrays, axis=0, out=None, **kw: m.stack(arrays, axis),
        np.unstack: lambda x, *, axis=0: m.unstack(x, axis),
        np.tile: m.tile,
        np.repeat: m.repeat,
        np.flip: lambda m, axis=None: flip(m, range(m.ndim) if axis is None else axis),
        np.roll: m.roll,
        np.rot90: m.rot90,
        np.ravel: m.ravel,
        np.atleast_1d: m.atleast_1d,
        np.atleast_2d: m.atleast_2d,
        np.atleast_3d: m.atleast_3d,
        np.vstack: m.vstack,
        np.hstack: m.hstack,
        np.dstack: m.dstack,
        np.column_stack: m.column_stack,
        np.split: m.split,
        np.array_split: m.array_split,
        np.hsplit: m.hsplit,
        np.vsplit: m.vsplit,
        np.dsplit: m.dsplit,
        np.pad: lambda array, pad_width, mode="constant", **kw: padding.pad(array, pad_width,
                                                                           mode, **kw),
        np.apply_along_axis: lambda func1d, axis, arr, *args, **kwargs: blocks.apply_along_axis(
            func1d, axis, arr, *args, **kwargs),
        # indexing
        np.take: lambda a, indices, axis=None, out=None, mode="raise": take(a, indices, axis),
        np.take_along_axis: lambda arr, indices, axis=-1: take_along_axis(arr, indices, axis),
        np.put: lambda a, ind, v, mode="raise": _put(a, ind, v, mode),
        # logic
        np.isclose: logic.isclose,
        np.allclose: logic.allclose,
        np.array_equal: logic.array_equal,
        # mathematical
        np.clip: _np_clip,
        np.round: _np_round,
        np.around: _np_round,
        np.diff: lambda a, n=1, axis=-1, prepend=None, append=None: mathematical.diff(
            a, n, axis, prepend, append),
        np.real: lambda val: elementwise(lambda u: u.real.copy(), "real", (val,)),
        np.imag: lambda val: elementwise(lambda u: u.imag.copy() if u.dtype.kind == "c"
                                         else array_module(u).zeros_like(u), "imag", (val,)),
        np.cumsum: _np_scan(scans.cumsum),
        np.cumprod: _np_scan(scans.cumprod),
        # sorting, searching, counting
        np.sort: _np_sort(sorting.sort),
        np.argsort: _np_sort(sorting.argsort),
        np.partition: _np_partition(sorting.partition),
        np.argpartition: _np_partition(sorting.argpartition),
        np.lexsort: lambda keys, axis=-1: sorting.lexsort(keys, axis=axis),
        np.sort_complex: sorting.sort_complex,
        np.where: searching.where,
        np.searchsorted: lambda a, v, side="left", sorter=None: searching.searchsorted(
            a, v, side=side, sorter=sorter),
        np.nonzero: searching.nonzero,
        np.argwhere: searching.argwhere,
        np.count_nonzero: lambda a, axis=None, *, keepdims=False: searching.count_nonzero(
            a, axis=axis, keepdims=keepdims),
        # statistics
        np.quantile: _np_q(st.quantile),
        np.percentile: _np_q(st.percentile),
        np.median: _np_median,
        np.nanquantile: _np_q(st.nanquantile),
        np.nanpercentile: _np_q(st.nanpercentile),
        np.nanmedian: lambda a, axis=None, out=None, overwrite_input=False, keepdims=False:
            st.nanmedian(a, axis=axis, keepdims=keepdims),
        np.histogram: lambda a, bins=10, range=None, density=None, weights=None:
            histograms.histogram(a, bins=bins, range=range, density=density, weights=weights),
        np.bincount: lambda x, weights=None, minlength=0: histograms.bincount(x, weights,
                                                                              minlength),
        np.histogram2d: histograms.histogram2d,
        np.histogramdd: histograms.histogramdd,
        np.histogram_bin_edges: histograms.histogram_bin_edges,
        np.digitize: histograms.digitize,
        np.average: averages.average,
        np.cov: averages.cov,
        np.corrcoef: averages.corrcoef,
        np.ptp: averages.ptp,
        np.gradient: calculus.gradient,
        np.trapezoid: calculus.trapezoid,
        np.interp: calculus.interp,
        np.convolve: calculus.convolve,
        np.nan_to_num: calculus.nan_to_num,
        # sets
        np.unique: _np_unique,
        np.isin: lambda element, test_elements, assume_unique=False, invert=False, **kw:
            sets.isin(element, test_elements, invert),
        # input and output
        np.save: _np_save,
        # printing (text on every rank; str(x)/print(x): rank 0 only, core/printing)
        np.array2string: printing.array2string,
        np.array_str: printing.numpy_array_str,
        np.array_repr: printing.numpy_array_repr,
    }
    if hasattr(np, "cumulative_sum"):
        table[np.cumulative_sum] = \
            lambda x, /, *, axis=None, dtype=None, out=None, include_initial=False: \
            scans.cumulative_sum(x, axis=axis, dtype=dtype, include_initial=include_initial)
        table[np.cumulative_prod] = \
            lambda x, /, *, axis=None, dtype=None, out=None, include_initial=False: \
            scans.cumulative_prod(x, axis=axis, dtype=dtype, include_initial=include_initial)
    for name in ("unique_values", "unique_counts", "unique_inverse", "unique_all"):
        if hasattr(np, name):
            table[getattr(np, name)] = getattr(sets, name)
    return table


#: NumPy function -> DistArray implementation (the routines; see :func:`implementation`)
HANDLED = {**_reductions(), **_routines()}
_ABOVE_MERGED = False


def implementation(func):
    """The DistArray implementation of NumPy function ``func``, or ``None``.  The first call
    adds the tables of :mod:`disttensor.linalg` and :mod:`disttensor.fft` to :data:`HANDLED`
    (imported here, not at module level: they sit above the routines)."""
    global _ABOVE_MERGED
    if not _ABOVE_MERGED:
        from .. import fft, linalg
        HANDLED.update(linalg.HANDLED_FUNCTIONS)
        HANDLED.update(fft.HANDLED_FUNCTIONS)
        _ABOVE_MERGED = True
    return HANDLED.get(func)
