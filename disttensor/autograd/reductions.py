"""Differentiable reductions and selections with PyTorch's spellings: ``sum``/``mean``
(``dim=``, ``keepdim=``), ``max``/``min`` (whole tensor, or ``dim=k`` -> ``(values,
indices)``), ``amax``/``amin``, ``var``/``std`` (``correction=`` / ``unbiased=``),
``clamp``/``clip`` (numbers or tensors), ``where``, ``argmax``/``argmin``.

Each works on tensors of DistArrays (activations: the distributed routines of
:mod:`disttensor.routines` through NumPy's functions, collective over the array's grid),
replicated NumPy/CuPy arrays (parameters) and floats, like :mod:`disttensor.autograd.math`.
Gradients follow PyTorch: the whole-tensor ``max()``/``min()`` and ``amax``/``amin`` share the
gradient evenly between tied maxima; ``max(dim=k)`` sends it to the index it returns (the
first maximum along ``k``, as NumPy's ``argmax``); ``clamp`` passes it where
``min <= x <= max`` and to a tensor bound where that bound is the result (PyTorch's rule when
``min > max``: the result and the gradient go to ``max``); ``where`` routes it by the
condition.  Reductions over all axes of a DistArray give Python floats (the same on every
rank); indices are int64 tensors that never require grad.
"""
from __future__ import annotations

import numbers
from collections import namedtuple

import numpy as np

from ..core.array import DistArray
from .math import _as_number, _axes, _expand, _share, multiply, sum as _sum, unbroadcast
from .tensor import Tensor, make_result, unwrap

__all__ = ["reduce_sum", "reduce_mean", "max", "min", "amax", "amin", "var", "std", "clamp",
           "clip", "where", "argmax", "argmin", "MaxMin", "dim_args"]

#: what ``max(dim=k)`` / ``min(dim=k)`` return (``torch.return_types.max``)
MaxMin = namedtuple("MaxMin", ["values", "indices"])


def dim_args(fn: str, dim, keepdim, axis, keepdims):
    """``(dim, keepdim)`` from PyTorch's (``dim``, ``keepdim``) or NumPy's (``axis``,
    ``keepdims``) spelling; ``TypeError`` when both name one thing."""
    if axis is not None:
        if dim is not None:
            raise TypeError(f"{fn}(): got both 'dim' and 'axis'")
        dim = axis
    if keepdims is not None:
        keepdim = keepdims
    return dim, bool(keepdim)


def _ndim(v) -> int:
    return v.ndim if isinstance(v, DistArray) else np.ndim(v)


def _shape(v) -> tuple:
    return v.shape if isinstance(v, DistArray) else tuple(np.shape(v))


def _number(v):
    v = _as_number(v)
    if not isinstance(v, DistArray) and np.ndim(v) == 0 and not isinstance(v, numbers.Number):
        v = v.item() if hasattr(v, "item") else v
    return v


def reduce_sum(x, dim=None, keepdim: bool = False):
    """``x.sum(dim, keepdim)``."""
    return _sum(x, dim, keepdim)


def reduce_mean(x, dim=None, keepdim: bool = False):
    """``x.mean(dim, keepdim)``."""
    xv = unwrap(x)
    axes = _axes(dim, _ndim(xv))
    count = 1
    for a in axes:
        count *= _shape(xv)[a]
    return multiply(_sum(x, axes, keepdim), 1.0 / count if count else float("nan"))


# -- max / min -------------------------------------------------------------------------------
def _extreme_all(x, kind: str, name: str):
    """Whole-tensor max/min: gradient shared evenly between ties."""
    xv = unwrap(x)
    m = _number(np.max(xv) if kind == "max" else np.min(xv))

    def backward(g):
        mask = np.equal(xv, m)
        n = _number(np.sum(mask))
        return (_share(x, np.multiply(mask, np.divide(_number(g), n)).astype(xv.dtype)),)
    return make_result(m, (x,), backward, name)


def _extreme_dims(x, dim, keepdim, kind: str, even: bool, name: str):
    """max/min along ``dim`` (values; ``even``: ties share, else the first takes it)."""
    xv = unwrap(x)
    axes = _axes(dim, _ndim(xv))
    f = np.max if kind == "max" else np.min
    vals = f(xv, axis=axes, keepdims=keepdim)
    keep = vals if keepdim else f(xv, axis=axes, keepdims=True)

    def backward(g):
        mask = np.equal(xv, keep).astype(xv.dtype)
        if even:
            mask = np.divide(mask, np.sum(mask, axis=axes, keepdims=True))
        else:  # the first extreme along the (single) axis takes the gradient
            first = np.equal(np.cumsum(mask, axis=axes[0]), 1)
            mask = np.multiply(mask, first).astype(xv.dtype)
        return (_share(x, np.multiply(_expand(g, xv, axes, keepdim), mask)),)
    return make_result(_number(vals), (x,), backward, name)


def _arg(xv, dim, keepdim, kind):
    f = np.argmax if kind == "max" else np.argmin
    if dim is None:
        return Tensor(_number(f(xv)))
    return Tensor(f(xv, axis=dim % _ndim(xv), keepdims=keepdim))


def _max_min(x, dim, keepdim, kind):
    if isinstance(dim, Tensor):  # torch.max(a, b): the elementwise maximum
        return _binary_extreme(x, dim, kind)
    if dim is None:
        return _extreme_all(x, kind, kind)
    if not isinstance(dim, numbers.Integral):
        raise TypeError(f"{kind}(): dim must be an int, got {type(dim).__name__}")
    xv = unwrap(x)
    values = _extreme_dims(x, int(dim), keepdim, kind, False, kind)
    return MaxMin(values, _arg(xv, int(dim), keepdim, kind))


def max(x, dim=None, keepdim: bool = False):  # noqa: A001 - PyTorch's name
    """``torch.max``: ``max(x)`` the largest element (a scalar tensor; ties share the
    gradient), ``max(x, k, keepdim)`` a :class:`MaxMin` ``(values, indices)`` along axis ``k``,
    ``max(x, other)`` the elementwise maximum."""
    return _max_min(x, dim, keepdim, "max")


def min(x, dim=None, keepdim: bool = False):  # noqa: A001 - PyTorch's name
    """``torch.min`` (see :func:`max`)."""
    return _max_min(x, dim, keepdim, "min")


def amax(x, dim=None, keepdim: bool = False):
    """``torch.amax``: the maxima over ``dim`` (an int, a tuple, or ``None``: all); ties share
    the gradient."""
    if dim is None and not keepdim:
        return _extreme_all(x, "max", "amax")
    return _extreme_dims(x, dim, keepdim, "max", True, "amax")


def amin(x, dim=None, keepdim: bool = False):
    """``torch.amin`` (see :func:`amax`)."""
    if dim is None and not keepdim:
        return _extreme_all(x, "min", "amin")
    return _extreme_dims(x, dim, keepdim, "min", True, "amin")


def _binary_extreme(a, b, kind):
    """Elementwise maximum/minimum of two tensors (ties: half the gradient each, as PyTorch)."""
    av, bv = unwrap(a), unwrap(b)
    y = np.maximum(av, bv) if kind == "max" else np.minimum(av, bv)

    def backward(g):
        wins = np.greater(av, bv) if kind == "max" else np.less(av, bv)
        tie = np.equal(av, bv)
        wa = np.add(wins.astype(np.float64), np.multiply(tie, 0.5))
        wb = np.subtract(1.0, wa)
        ga = np.multiply(g, wa) if isinstance(a, Tensor) and a.requires_grad else None
        gb = np.multiply(g, wb) if isinstance(b, Tensor) and b.requires_grad else None
        return (_share(a, unbroadcast(ga, av)), _share(b, unbroadcast(gb, bv)))
    return make_result(y, (a, b), backward, f"{kind}imum")


def argmax(x, dim=None, keepdim: bool = False) -> Tensor:
    """``torch.argmax``: int64 index of the first maximum (of the flattened tensor for
    ``dim=None``: a Python int); never requires grad."""
    return _arg(unwrap(x), dim, keepdim, "max")


def argmin(x, dim=None, keepdim: bool = False) -> Tensor:
    """``torch.argmin`` (see :func:`argmax`)."""
    return _arg(unwrap(x), dim, keepdim, "min")


# -- var / std -------------------------------------------------------------------------------
def _correction(fn, correction, unbiased):
    if unbiased is not None:
        if correction is not None:
            raise TypeError(f"{fn}(): give 'correction' or 'unbiased', not both")
        return 1 if unbiased else 0
    return 1 if correction is None else correction


def _moments(x, dim, correction, keepdim, fn):
    xv = unwrap(x)
    axes = _axes(dim, _ndim(xv))
    n = 1
    for a in axes:
        n *= _shape(xv)[a]
    v = np.var(xv, axis=axes, ddof=correction, keepdims=keepdim)
    return xv, axes, n, v


def var(x, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
    """``torch.var``: variance over ``dim`` with ``correction`` (default 1, Bessel's;
    ``unbiased=False`` is ``correction=0``); gradient ``2 (x - mean) / (N - correction)``."""
    c = _correction("var", correction, unbiased)
    xv, axes, n, v = _moments(x, dim, c, keepdim, "var")

    def backward(g):
        centered = np.subtract(xv, np.mean(xv, axis=axes, keepdims=True))
        scale = np.multiply(centered, 2.0 / (n - c) if n - c else float("inf"))
        return (_share(x, np.multiply(_expand(g, xv, axes, keepdim), scale)),)
    return make_result(_number(v), (x,), backward, "var")


def std(x, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
    """``torch.std`` (see :func:`var`); gradient ``(x - mean) / ((N - correction) std)``."""
    c = _correction("std", correction, unbiased)
    xv, axes, n, v = _moments(x, dim, c, keepdim, "std")
    s = np.sqrt(v)

    def backward(g):
        centered = np.subtract(xv, np.mean(xv, axis=axes, keepdims=True))
        s_keep = s if keepdim or not axes else (
            np.sqrt(np.var(xv, axis=axes, ddof=c, keepdims=True)))
        scale = np.divide(centered, np.multiply(s_keep, float(n - c)))
        return (_share(x, np.multiply(_expand(g, xv, axes, keepdim), scale)),)
    return make_result(_number(s), (x,), backward, "std")


# -- clamp / where ---------------------------------------------------------------------------
def clamp(x, min=None, max=None):  # noqa: A002 - PyTorch's names
    """``torch.clamp``: ``min(max(x, min), max)`` with number or tensor bounds (broadcast);
    the result has ``x``'s dtype.  ``RuntimeError`` when both bounds are ``None``."""
    if min is None and max is None:
        raise RuntimeError("clamp(): at least one of 'min' or 'max' must not be None")
    xv, lo, hi = unwrap(x), unwrap(min), unwrap(max)
    y = xv
    if lo is not None:
        y = np.maximum(y, lo)
    if hi is not None:
        y = np.minimum(y, hi)
    y = y.astype(xv.dtype) if hasattr(xv, "dtype") and y.dtype != xv.dtype else y

    def backward(g):
        ge = np.greater_equal(xv, lo) if lo is not None else None
        le = np.less_equal(xv, hi) if hi is not None else None
        pass_x = ge if le is None else le if ge is None else np.logical_and(ge, le)
        gx = np.multiply(g, pass_x).astype(g.dtype) if _needs(x) else None
        glo = ghi = None
        if _needs(min):
            m = np.logical_not(ge)
            if hi is not None:
                m = np.logical_and(m, np.less(lo, hi))
            glo = unbroadcast(np.multiply(g, m), lo)
        if _needs(max):
            m = np.logical_not(le)
            if lo is not None:
                m = np.logical_or(m, np.less(hi, lo))
            ghi = unbroadcast(np.multiply(g, m), hi)
        return (_share(x, unbroadcast(gx, xv)), _share(min, glo), _share(max, ghi))
    return make_result(y, (x, min, max), backward, "clamp")


clip = clamp


def _needs(t) -> bool:
    return isinstance(t, Tensor) and t.requires_grad


def where(condition, x, y):
    """``torch.where(condition, x, y)``: ``x`` where ``condition`` holds, else ``y``
    (broadcast; tensors or numbers); the gradient goes to the chosen operand."""
    cv, xv, yv = unwrap(condition), unwrap(x), unwrap(y)
    out = np.where(cv, xv, yv)

    def backward(g):
        gx = gy = None
        if _needs(x):
            gx = unbroadcast(np.where(cv, g, 0).astype(g.dtype), xv)
        if _needs(y):
            gy = unbroadcast(np.where(cv, 0, g).astype(g.dtype), yv)
        return (None, _share(x, gx), _share(y, gy))
    return make_result(out, (condition, x, y), backward, "where")
