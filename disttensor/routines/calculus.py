"""Differences, integrals and filters of sampled data (NumPy's "Mathematical functions: sums,
products, differences", "miscellaneous"): ``gradient``, ``trapezoid``, ``interp``,
``convolve`` and ``nan_to_num``.  Every function is collective over the grid of its DistArray
operands (the ranks agree on the arguments first).

* ``gradient(f, *varargs, axis, edge_order)``: NumPy's second-order central differences in the
  interior and one-sided differences of order ``edge_order`` (1 or 2) at the global ends, with
  uniform (scalar) or per-point (1-D coordinate) spacing.  Along each axis the block gets a
  halo of depth ``edge_order`` (:class:`~disttensor.core.halo.HaloExchange`, multi-hop when a
  neighbour's block is shorter, so uneven and empty blocks work); every result has ``f``'s
  layout.  Coordinates are NumPy arrays or sequences (the same on every rank) or DistArrays
  (gathered to every rank first: they are 1-D).
* ``trapezoid(y, x, dx, axis)``: ``sum(d * (y[1:] + y[:-1]) / 2)`` along ``axis`` with the
  shifted slices aligned by the alignment rule of :mod:`disttensor.core.array` (one
  redistribution) and a reduction; laid out like a reduction of ``y`` over ``axis``.
* ``interp(x, xp, fp, left, right, period)``: elementwise ``numpy.interp`` of each rank's
  block (``x``'s layout); ``xp``/``fp`` are replicated values (NumPy arrays, or DistArrays
  gathered first).
* ``convolve(a, v, mode)``: ``a`` a 1-D DistArray, ``v`` a kernel (a NumPy array, or a small
  DistArray gathered first).  As NumPy, the longer operand is the signal: each block gets a
  low halo of ``len(v) - 1`` elements (zeros beyond the global start, multi-hop) and
  convolves it with the kernel locally (``mode="valid"`` of NumPy on the halo-extended block);
  the block of the last coordinate also makes the ``len(v) - 1`` outputs past the end.
  ``mode="full"`` results are split like ``a`` (the last block longer); ``"same"`` and
  ``"valid"`` are slices of it (see :mod:`disttensor.routines.indexing` for a slice's layout).
  A signal shorter than the kernel (the kernel a DistArray) is gathered and convolved whole.
* ``nan_to_num(x, copy, nan, posinf, neginf)``: elementwise, ``x``'s layout; ``copy=False``
  changes ``x``'s blocks in place and returns ``x``.

Differences from NumPy: ``gradient``'s spacing is scalars or 1-D coordinates as in NumPy
(DistArray coordinates are gathered); ``convolve`` needs a 1-D DistArray signal.
"""
from __future__ import annotations

import numbers
import operator

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, operand_key
from ..core.backend import array_module, to_host
from ..core.distribution import Distribution
from . import reductions
from ._operands import axis_index, axis_tuple, check_array
from .ufuncs import elementwise

__all__ = ["gradient", "trapezoid", "interp", "convolve", "nan_to_num"]


def _host_value(v):
    """A spacing/coordinate/kernel argument as a NumPy value (DistArrays gathered:
    collective)."""
    return v.to_numpy() if isinstance(v, DistArray) else v


# -- gradient ---------------------------------------------------------------------------------
def _spacings(f: DistArray, varargs, axes):
    """NumPy's ``gradient`` spacing rules: one entry per axis, a float (uniform) or a 1-D
    float array of coordinates (``ValueError``/``TypeError`` with NumPy's messages)."""
    n = len(varargs)
    if n == 0:
        return [1.0] * len(axes)
    if n == 1 and np.ndim(varargs[0]) == 0:
        return [varargs[0]] * len(axes)
    if n != len(axes):
        raise TypeError("invalid number of arguments")
    out = []
    for ax, d in zip(axes, varargs):
        d = np.asanyarray(d)
        if d.ndim == 0:
            out.append(d[()])
            continue
        if d.ndim != 1:
            raise ValueError("distances must be either scalars or 1d")
        if len(d) != f.shape[ax]:
            raise ValueError("when 1d, distances must match the length of the corresponding "
                             "dimension")
        if d.dtype.kind in "iub":
            d = d.astype(np.float64)
        diffx = np.diff(d)
        out.append(diffx[0] if diffx.size and (diffx == diffx[0]).all() else d)
    return out


def _edge_rows(B, t, off, m, n, h, order, dx):
    """The one-sided differences at the global ends that fall in this block (``B`` is the
    block with a halo of ``h`` along ``t``; ``off`` the block's global offset, ``m`` its
    length); ``(index, value)`` pairs."""
    take = lambda j: np.take(B, j + h, axis=t)  # local index j, global off + j  # noqa: E731
    rows = []
    uniform = np.ndim(dx) == 0
    if off == 0 and m > 0:  # global index 0
        if order == 1:
            d0 = dx if uniform else dx[1] - dx[0]
            rows.append((0, (take(1) - take(0)) / d0))
        elif uniform:
            rows.append((0, (-1.5 * take(0) + 2.0 * take(1) - 0.5 * take(2)) / dx))
        else:
            d1, d2 = dx[1] - dx[0], dx[2] - dx[1]
            a = -(2.0 * d1 + d2) / (d1 * (d1 + d2))
            b = (d1 + d2) / (d1 * d2)
            c = -d1 / (d2 * (d1 + d2))
            rows.append((0, a * take(0) + b * take(1) + c * take(2)))
    if off + m == n and m > 0:  # global index n - 1
        e = m - 1
        if order == 1:
            d0 = dx if uniform else dx[-1] - dx[-2]
            rows.append((e, (take(e) - take(e - 1)) / d0))
        elif uniform:
            rows.append((e, (0.5 * take(e - 2) - 2.0 * take(e - 1) + 1.5 * take(e)) / dx))
        else:
            d1, d2 = dx[-2] - dx[-3], dx[-1] - dx[-2]
            a = d2 / (d1 * (d1 + d2))
            b = -(d2 + d1) / (d1 * d2)
            c = (2.0 * d2 + d1) / (d2 * (d1 + d2))
            rows.append((e, a * take(e - 2) + b * take(e - 1) + c * take(e)))
    return rows


def _gradient_axis(f: DistArray, t: int, dx, order: int, otype) -> DistArray:
    """The derivative of ``f`` along axis ``t`` (``f``'s layout)."""
    n = f.shape[t]
    h = order
    halo = [(0, 0)] * f.ndim
    halo[t] = (h, h)
    g = f.with_halo(halo)
    g.exchange_halo()
    B = to_host(g.buffer).astype(np.result_type(otype, np.float64), copy=False)
    d = f.distribution
    off = d.block_box(f.grid.coords).start[t]
    m = f.local.shape[t]
    sl = lambda lo, hi: (slice(None),) * t + (slice(lo, hi),)  # noqa: E731
    lo_, mid, hi_ = B[sl(h - 1, h - 1 + m)], B[sl(h, h + m)], B[sl(h + 1, h + 1 + m)]
    if np.ndim(dx) == 0:
        out = (hi_ - lo_) / (2.0 * dx)
    else:  # per-point coordinates: NumPy's non-uniform second-order formula
        gi = np.clip(np.arange(off, off + m), 1, max(n - 2, 1))
        d1 = dx[gi] - dx[gi - 1]
        d2 = dx[np.minimum(gi + 1, n - 1)] - dx[gi]
        with np.errstate(divide="ignore", invalid="ignore"):
            a = -d2 / (d1 * (d1 + d2))
            b = (d2 - d1) / (d1 * d2)
            c = d1 / (d2 * (d1 + d2))
        shape = [1] * f.ndim
        shape[t] = m
        a, b, c = (v.reshape(shape) for v in (a, b, c))
        with np.errstate(invalid="ignore"):
            out = a * lo_ + b * mid + c * hi_
    for j, v in _edge_rows(B, t, off, m, n, h, order, dx):
        out[sl(j, j + 1)] = np.expand_dims(v, t)
    xp = array_module(f.local)
    loc = out.astype(otype, copy=False)
    return DistArray(xp.asarray(loc) if xp is not np else loc, d, f.grid)


@collective_entry
def gradient(f: DistArray, *varargs, axis=None, edge_order=1):
    """NumPy ``gradient``: the derivative of ``f`` along each of ``axis`` (all axes for
    ``None``): one DistArray with ``f``'s layout for a single axis, else a tuple of them.
    ``varargs``: spacing, one scalar for every axis or a scalar or 1-D coordinates per axis.
    Collective (one halo exchange per axis)."""
    check_array(f, "f")
    vals = [_host_value(v) for v in varargs]
    with agreed(f.grid.cart, "gradient", f=f, varargs=tuple(operand_key(v) for v in vals),
                axis=canon(axis), edge_order=canon(edge_order)):
        axes = tuple(range(f.ndim)) if axis is None else axis_tuple(axis, f.ndim)
        dxs = _spacings(f, vals, axes)
        order = operator.index(edge_order)
        if order > 2:
            raise ValueError("'edge_order' greater than 2 not supported")
        for t in axes:
            if f.shape[t] < order + 1:
                raise ValueError("Shape of array too small to calculate a numerical gradient, "
                                 "at least (edge_order + 1) elements are required.")
        otype = np.dtype(np.float64) if f.dtype.kind in "iub" else f.dtype
    out = tuple(_gradient_axis(f, t, dx, order, otype) for t, dx in zip(axes, dxs))
    return out[0] if len(out) == 1 else out


# -- trapezoid --------------------------------------------------------------------------------
@collective_entry
def trapezoid(y: DistArray, x=None, dx=1.0, axis=-1):
    """NumPy ``trapezoid``: the integral along ``axis`` by the trapezoidal rule, samples at
    ``x`` (a NumPy array or DistArray: 1-D of ``y.shape[axis]`` or of ``y``'s shape) or spaced
    ``dx``.  Laid out like a reduction of ``y`` over ``axis`` (0-d for 1-D ``y``)."""
    check_array(y, "y")
    with agreed(y.grid.cart, "trapezoid", y=y, x=operand_key(x), dx=operand_key(dx),
                axis=canon(axis)):
        ax = axis_index(axis, y.ndim)
        if x is not None:
            xs = np.shape(x) if not isinstance(x, DistArray) else x.shape
            if len(xs) != 1 and tuple(xs) != y.shape:
                raise ValueError(f"x of shape {tuple(xs)} does not match y of shape {y.shape}")
            if len(xs) == 1 and xs[0] != y.shape[ax]:
                raise ValueError(f"x of length {xs[0]} does not match y's axis {ax} of "
                                 f"length {y.shape[ax]}")
    from .mathematical import diff
    pre = (slice(None),) * ax
    if x is None:
        d = dx
    elif (not isinstance(x, DistArray) and np.ndim(x) == 1) or (
            isinstance(x, DistArray) and x.ndim == 1):
        d = np.diff(np.asarray(_host_value(x)))
        d = d.reshape((-1,) + (1,) * (y.ndim - 1 - ax))
    elif isinstance(x, DistArray):
        d = diff(x, axis=ax)
    else:
        d = np.diff(np.asarray(x), axis=ax)
    s = y[pre + (slice(1, None),)] + y[pre + (slice(None, -1),)]
    terms = (s * d) / 2.0
    return reductions.sum(terms, axis=ax)


# -- interp -----------------------------------------------------------------------------------
@collective_entry
def interp(x: DistArray, xp, fp, left=None, right=None, period=None) -> DistArray:
    """NumPy ``interp``: the piecewise-linear interpolant of ``(xp, fp)`` at the elements of
    ``x`` (elementwise, ``x``'s layout); ``xp``/``fp`` replicated (DistArrays gathered)."""
    check_array(x, "x")
    xp_, fp_ = np.asarray(_host_value(xp)), np.asarray(_host_value(fp))
    with agreed(x.grid.cart, "interp", x=x, xp=canon(xp_.shape), fp=canon(fp_.shape),
                left=operand_key(left), right=operand_key(right), period=operand_key(period)):
        np.interp(np.zeros(0, x.dtype), xp_, fp_, left, right, period)  # NumPy's checks
        if x.dtype.kind == "c":
            raise TypeError("Cannot cast array data from dtype('complex128') to "
                            "dtype('float64') according to the rule 'safe'")
    return elementwise(lambda u: np.interp(to_host(u), xp_, fp_, left, right, period),
                       "interp", (x,))


# -- convolve ---------------------------------------------------------------------------------
@collective_entry
def convolve(a: DistArray, v, mode="full") -> DistArray:
    """NumPy ``convolve`` of the 1-D DistArray ``a`` with the kernel ``v`` (modes ``full``,
    ``same``, ``valid``).  Collective: one halo exchange; see the module docstring for the
    result's layout."""
    check_array(a, "a")
    with agreed(a.grid.cart, "convolve", a=a, v=operand_key(v), mode=mode):
        if a.ndim != 1 or np.ndim(v) != 1 and not (isinstance(v, DistArray) and v.ndim == 1):
            raise ValueError("object too deep for desired array" if a.ndim > 1 or np.ndim(
                v) > 1 else "object of too small depth for desired array")
        if mode not in ("full", "same", "valid"):
            raise ValueError(f"mode must be one of 'full', 'same', or 'valid' (got {mode!r})")
        m = len(v)
        if a.shape[0] == 0:
            raise ValueError("a cannot be empty")
        if m == 0:
            raise ValueError("v cannot be empty")
    k = np.asarray(_host_value(v))
    n = a.shape[0]
    if m > n:  # NumPy convolves the longer with the shorter: the signal is small here
        full = np.convolve(a.to_numpy(), k, "full")
        from .creation import from_global
        r = from_global(full, grid=a.grid, split=a.split, device=a.device)
    else:
        g = a.with_halo([(m - 1, 0)])
        g.exchange_halo()
        buf = to_host(g.buffer)
        d = a.distribution
        c = d.axis_coord(0, a.grid.coords) if d.split[0] is not None else 0
        last = d.split[0] is None or c == a.grid.dims[d.split[0]] - 1
        if last:
            buf = np.concatenate([buf, np.zeros(m - 1, buf.dtype)])
        loc = np.convolve(buf, k, "valid") if buf.shape[0] >= m else \
            np.zeros(0, np.result_type(buf.dtype, k.dtype))
        if d.split[0] is None:
            rd = Distribution((n + m - 1,), d.grid_dims, (None,))
        else:
            sizes = list(d.sizes(0))
            sizes[-1] += m - 1
            rd = Distribution((n + m - 1,), d.grid_dims, d.split, [sizes])
        xpm = array_module(a.local)
        r = DistArray(xpm.asarray(loc) if xpm is not np else loc, rd, a.grid)
    if mode == "full":
        return r
    if mode == "same":
        start = (min(m, n) - 1) // 2
        return r[start:start + max(m, n)]
    return r[min(m, n) - 1:max(m, n)]


# -- nan_to_num -------------------------------------------------------------------------------
@collective_entry
def nan_to_num(x: DistArray, copy=True, nan=0.0, posinf=None, neginf=None) -> DistArray:
    """NumPy ``nan_to_num``: NaN and infinities replaced (elementwise, ``x``'s layout);
    ``copy=False`` writes into ``x``'s blocks and returns ``x``."""
    check_array(x)
    with agreed(x.grid.cart, "nan_to_num", x=x, copy=bool(copy), nan=operand_key(nan),
                posinf=operand_key(posinf), neginf=operand_key(neginf)):
        for name, val in (("nan", nan), ("posinf", posinf), ("neginf", neginf)):
            if val is not None and not isinstance(val, (numbers.Number, np.generic)):
                raise TypeError(f"nan_to_num: {name} must be a scalar")
    if not copy:
        xp = array_module(x.local)
        x.local[...] = xp.nan_to_num(x.local, copy=False, nan=nan, posinf=posinf,
                                     neginf=neginf)
        return x
    return elementwise(lambda u: array_module(u).nan_to_num(u, nan=nan, posinf=posinf,
                                                            neginf=neginf), "nan_to_num", (x,))
