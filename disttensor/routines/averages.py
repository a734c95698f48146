"""Averages and variances (NumPy's "Statistics: averages and variances", "correlating", "order
statistics: ptp"): ``average``, ``cov``, ``corrcoef`` and ``ptp``.  Every function is
collective over the grid of its DistArray operands (the ranks agree on the arguments first).

* ``average(a, axis, weights, returned, keepdims)``: ``sum(a * w, axis) / sum(w, axis)`` with
  the reductions of :mod:`disttensor.routines.reductions`; the result is laid out like a
  reduction of ``a`` over ``axis``.  ``weights``: a DistArray or NumPy array of ``a``'s shape,
  or 1-D of length ``a.shape[axis]`` (then ``axis`` must be one integer); NumPy arrays are
  replicated values, DistArrays are aligned to ``a`` (redistributed when laid out otherwise).
  Weights summing to zero raise ``ZeroDivisionError`` on every rank.
* ``cov(m, y, rowvar, bias, ddof, fweights, aweights, dtype)`` and ``corrcoef(x, y, rowvar,
  dtype)``: the variables are brought whole to every rank along the variable axis (a
  redistribution when that axis is split), the observations stay split; each rank centres its
  observations with the global (weighted) mean and forms its partial ``X_c W X_c^H``, and one
  all-reduce over the grid axis of the observations sums them.  The ``(nvar, nvar)`` result
  (0-d for one variable, as NumPy) is **replicated** on every rank (not split).  Memory per
  rank: ``nvar * nobs_local + nvar**2``.
* ``ptp(a, axis, keepdims)``: ``max - min`` (two reductions), laid out like a reduction.

Differences from NumPy: ``cov``/``corrcoef`` always return a DistArray (replicated); ``y``,
``fweights`` and ``aweights`` may be DistArrays or NumPy arrays; no ``out=``.
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, dtype_key, operand_key
from ..core.backend import to_host
from ..core.comm import allreduce
from ..core.distribution import Distribution
from ..core.warn import warn
from . import reductions
from ._operands import axis_tuple, check_array, unsplit
from .manipulation import concatenate, expand_dims
from .ufuncs import align, elementwise

__all__ = ["average", "cov", "corrcoef", "ptp"]


# -- average ----------------------------------------------------------------------------------
def _average_args(a, axis, weights):
    """Check ``average``'s arguments (inside the agreement block): the result dtype and the
    axis tuple (``None`` for all axes)."""
    check_array(a, "a")
    axes = None if axis is None else axis_tuple(axis, a.ndim)
    if weights is None:
        return (np.result_type(a.dtype, np.float64) if a.dtype.kind in "biu" else a.dtype), axes
    w = weights if isinstance(weights, DistArray) else np.asarray(weights)
    if isinstance(w, DistArray) and not w.grid.compatible(a.grid):
        raise ValueError("average: weights live on a grid over other ranks than a's")
    if a.dtype.kind in "biu":
        rdt = np.result_type(a.dtype, w.dtype, "f8")
    else:
        rdt = np.result_type(a.dtype, w.dtype)
    if w.shape != a.shape:
        if axis is None:
            raise TypeError("Axis must be specified when shapes of a and weights differ.")
        if w.ndim != 1:
            raise TypeError("1D weights expected when shapes of a and weights differ.")
        if len(axes) != 1 or w.shape[0] != a.shape[axes[0]]:
            raise ValueError("Length of weights not compatible with specified axis.")
    return rdt, axes


def _broadcast_weights(a: DistArray, weights, axes, rdt) -> DistArray:
    """``weights`` as a DistArray of ``a``'s shape and layout, dtype ``rdt``."""
    w = weights if isinstance(weights, DistArray) else np.asarray(weights)
    if w.shape != a.shape:  # 1-D along axes[0]: a trailing-aligned shape (n, 1, ..., 1)
        tail = a.ndim - 1 - axes[0]
        if isinstance(w, DistArray):
            for _ in range(tail):
                w = expand_dims(w, w.ndim)
        else:
            w = w.reshape(w.shape + (1,) * tail)
    return elementwise(lambda u, v: np.broadcast_to(v, u.shape).astype(rdt), "average",
                       (a, w))


@collective_entry
def average(a: DistArray, axis=None, weights=None, returned=False, *, keepdims=False):
    """NumPy ``average``: the (weighted) mean along ``axis`` (``None``: all axes; a tuple
    too); ``returned=True`` gives ``(average, sum_of_weights)`` with the sum broadcast to the
    average's shape.  The result is laid out like a reduction of ``a``.  Collective."""
    with agreed(None if not isinstance(a, DistArray) else a.grid.cart, "average", a=a,
                axis=canon(axis), weights=operand_key(weights), returned=bool(returned),
                keepdims=bool(keepdims)):
        rdt, axes = _average_args(a, axis, weights)
    if weights is None:
        avg = reductions.mean(a, axis=axes, keepdims=keepdims)
        if not returned:
            return avg
        n = int(np.prod([a.shape[t] for t in (range(a.ndim) if axes is None else axes)]))
        scl = DistArray(avg.xp.full(avg.local.shape, n, dtype=avg.dtype), avg.distribution,
                        avg.grid)
        return avg, scl
    wb = _broadcast_weights(a, weights, axes, rdt)
    scl = reductions.sum(wb, axis=axes, dtype=rdt, keepdims=keepdims)
    if bool(reductions.any(scl == 0)):
        raise ZeroDivisionError("Weights sum to zero, can't be normalized")
    with np.errstate(invalid="ignore"):
        avg = reductions.sum(np.multiply(a, wb, dtype=rdt), axis=axes, dtype=rdt,
                             keepdims=keepdims) / scl
    return (avg, scl) if returned else avg


# -- ptp --------------------------------------------------------------------------------------
@collective_entry
def ptp(a: DistArray, axis=None, keepdims=False) -> DistArray:
    """NumPy ``ptp``: ``max(a, axis) - min(a, axis)``, laid out like a reduction of ``a``
    (``TypeError`` for booleans, as NumPy's subtraction)."""
    check_array(a, "a")
    with agreed(a.grid.cart, "ptp", a=a, axis=canon(axis), keepdims=bool(keepdims)):
        if a.dtype.kind == "b":
            raise TypeError("numpy boolean subtract, the `-` operator, is not supported, use "
                            "the bitwise_xor, the `^` operator, or the logical_xor function "
                            "instead.")
        reductions._axes(a, axis)
    return np.subtract(reductions.max(a, axis=axis, keepdims=keepdims),
                       reductions.min(a, axis=axis, keepdims=keepdims))


# -- cov, corrcoef ----------------------------------------------------------------------------
def _as_rows(v, rowvar: bool, what: str):
    """``v`` (a DistArray of 1 or 2 dimensions) with the variables along axis 0."""
    if v.ndim > 2:
        raise ValueError(f"{what} has more than 2 dimensions")
    if v.ndim < 2:
        return expand_dims(v, 0) if v.ndim == 1 else v.reshape(1, 1)
    return v if rowvar else v.T


def _check_obs_weights(w, name: str, nobs: int):
    if w is None:
        return None
    w = w if isinstance(w, DistArray) else np.asarray(w, dtype=float if name == "aweights"
                                                      else None)
    if name == "fweights" and w.dtype.kind not in "iub":
        raise TypeError("fweights must be integer")
    if w.ndim > 1:
        raise RuntimeError(f"cannot handle multidimensional {name}")
    if w.shape[0] != nobs:
        raise RuntimeError(f"incompatible numbers of samples and {name}")
    return w


def _cov_args(m, y, rowvar, bias, ddof, fweights, aweights, dtype):
    """Checks of ``cov``'s arguments (inside the agreement block)."""
    check_array(m, "m")
    for v, what in ((m, "m"), (y, "y")):
        if v is not None and not isinstance(v, DistArray):
            raise TypeError(f"cov: {what} must be a DistArray (NumPy arrays: use numpy.cov)")
        if v is not None and v.ndim > 2:
            raise ValueError(f"{what} has more than 2 dimensions")
    if ddof is not None and ddof != int(ddof):
        raise ValueError("ddof must be integer")
    if y is not None and not y.grid.compatible(m.grid):
        raise ValueError("cov: y lives on a grid over other ranks than m's")
    nobs_of = (lambda v: 1 if v.ndim == 0 else v.shape[-1] if (v.ndim == 1 or rowvar)
               else v.shape[0])
    nobs = nobs_of(m)
    if y is not None and nobs_of(y) != nobs:
        raise ValueError("all the input array dimensions except for the concatenation axis "
                         "must match exactly")
    fw = _check_obs_weights(fweights, "fweights", nobs)
    aw = _check_obs_weights(aweights, "aweights", nobs)
    if dtype is None:
        dtype = np.result_type(m.dtype, np.float64) if y is None else \
            np.result_type(m.dtype, y.dtype, np.float64)
    return np.dtype(dtype), fw, aw


def _local_weights(w, X: DistArray):
    """This rank's weights of its observations (axis 1 of ``X``), or ``None``."""
    if w is None:
        return None
    return np.asarray(to_host(align(w, X.grid, X.distribution, X.device)), dtype=np.float64)


def _all_sum(X: DistArray, part):
    g = X.split[1]
    if g is not None and X.grid.dims[g] > 1:
        part = np.asarray(part)
        return allreduce(X.grid.sub_comm([g]), np.ascontiguousarray(part), "sum").reshape(
            part.shape)
    return part


def _negative(w, X) -> bool:
    loc = _local_weights(w, X)
    bad = np.asarray(bool((loc < 0).any()))
    return bool(allreduce(X.grid.cart, bad, "lor")) if X.grid.size > 1 else bool(bad)


@collective_entry
def cov(m: DistArray, y=None, rowvar=True, bias=False, ddof=None, fweights=None,
        aweights=None, *, dtype=None) -> DistArray:
    """NumPy ``cov``: the covariance matrix of the variables (rows of ``m`` and ``y`` for
    ``rowvar=True``, else columns), ``(nvar, nvar)`` replicated on every rank (0-d for one
    variable).  Collective; see the module docstring for the layout and the cost."""
    with agreed(m.grid.cart if isinstance(m, DistArray) else None, "cov", m=m,
                y=operand_key(y), rowvar=bool(rowvar), bias=bool(bias), ddof=canon(ddof),
                fweights=operand_key(fweights), aweights=operand_key(aweights),
                dtype=dtype_key(dtype)):
        dtype, fw, aw = _cov_args(m, y, rowvar, bias, ddof, fweights, aweights, dtype)
    X = _as_rows(m, rowvar, "m")
    if y is not None:
        X = concatenate([X, _as_rows(y, rowvar, "y")], axis=0)
    X = unsplit(X, (0,))
    for w, name in ((fw, "fweights"), (aw, "aweights")):
        if w is not None and _negative(w, X):
            raise ValueError(f"{name} cannot be negative")
    ddof = (0 if bias else 1) if ddof is None else int(ddof)
    nobs = X.shape[1]
    wl = None
    for w in (fw, aw):
        lw = _local_weights(w, X)
        if lw is not None:
            wl = lw if wl is None else wl * lw
    loc = np.asarray(to_host(X.local), dtype=dtype)
    if wl is None:
        v1 = nobs
        avg = _all_sum(X, loc.sum(axis=1)) / max(nobs, 1) if nobs else np.full(X.shape[0],
                                                                                  np.nan)
        fact = nobs - ddof
    else:
        v1 = float(_all_sum(X, np.asarray(wl.sum())))
        if v1 == 0:
            raise ZeroDivisionError("Weights sum to zero, can't be normalized")
        avg = _all_sum(X, (loc * wl).sum(axis=1)) / v1
        if ddof == 0:
            fact = v1
        elif aw is None:
            fact = v1 - ddof
        else:
            fact = v1 - ddof * float(_all_sum(X, np.asarray((wl * _local_weights(aw, X)).sum())))\
                / v1
    if fact <= 0:
        warn("Degrees of freedom <= 0 for slice", RuntimeWarning)
        fact = 0.0
    xc = loc - avg[:, None]
    xw = xc if wl is None else xc * wl
    gram = _all_sum(X, xc @ xw.T.conj())
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.asarray(gram / fact).squeeze()
    d = Distribution(c.shape, X.grid.dims, (None,) * c.ndim)
    return DistArray(np.array(c, order="C"), d, X.grid)


@collective_entry
def corrcoef(x: DistArray, y=None, rowvar=True, *, dtype=None) -> DistArray:
    """NumPy ``corrcoef``: the Pearson correlation coefficients (``cov`` normalized, real
    parts clipped to ``[-1, 1]``), replicated on every rank as :func:`cov`."""
    c = cov(x, y, rowvar, dtype=dtype)
    loc = c.local
    if loc.ndim == 0:
        with np.errstate(divide="ignore", invalid="ignore"):
            r = loc / loc
    else:
        sd = np.sqrt(np.diag(loc).real)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = loc / sd[:, None] / sd[None, :]
        np.clip(r.real, -1, 1, out=r.real)
        if np.iscomplexobj(r):
            np.clip(r.imag, -1, 1, out=r.imag)
    return DistArray(np.array(r, order="C"), c.distribution, c.grid)
