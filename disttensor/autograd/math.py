"""Differentiable NumPy-style functions on tensors: arithmetic with broadcasting, elementwise
functions, reductions, reshape/transpose, indexing, concatenation and redistribution.

Operands may mix DistArray tensors, replicated (NumPy/CuPy) tensors, Python numbers and plain
arrays; the forward is the library's own NumPy-style operation (so the alignment rule of
:mod:`disttensor.routines.ufuncs` applies).  Each backward returns every input's gradient shaped
and distributed like that input: broadcast axes are summed out (a collective reduction for
DistArrays), and operands the forward redistributed get their gradient redistributed back.
Gradients that reach a replicated tensor from a DistArray are full sums over the grid, so they
are the same on every rank.
"""
from __future__ import annotations

import numbers

import numpy as np

from ..routines import manipulation
from ..core.array import DistArray
from ..core.backend import array_module
from ..routines.indexing import setitem
from .tensor import Tensor, filled_like, make_result, param_share, unwrap

__all__ = ["add", "subtract", "multiply", "divide", "negative", "power", "exp", "log", "sqrt",
           "absolute", "sum", "mean", "reshape", "transpose", "getitem", "concatenate",
           "redistribute", "unbroadcast"]


def unbroadcast(g, like):
    """Sum ``g`` (the gradient of a broadcast result) down to the shape of ``like`` and give
    it ``like``'s kind and distribution.  Collective when ``g`` is a DistArray."""
    if g is None:
        return None
    if isinstance(like, numbers.Number):  # a scalar tensor (a loss): the total, as a float
        if isinstance(g, DistArray):
            return float(g.sum())
        return float(array_module(g).sum(g)) if hasattr(g, "shape") else float(g)
    shape = like.shape if isinstance(like, DistArray) else tuple(np.shape(like))
    gshape = g.shape if isinstance(g, DistArray) else tuple(np.shape(g))
    lead = len(gshape) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and gshape[lead + i] != 1)
    if isinstance(g, DistArray):
        r = g.sum(axis=axes, keepdims=True) if axes else g
        if isinstance(like, DistArray):
            if lead:
                r = manipulation.reshape(r, shape)
            if r.distribution != like.distribution or r.grid is not like.grid:
                r = r.redistribute(grid=like.grid, distribution=like.distribution)
            return r
        full = r.to_numpy().reshape(shape)  # gathered on every rank: a replicated gradient
        xp = array_module(like)
        return xp.asarray(full, dtype=like.dtype) if hasattr(like, "dtype") else full
    xp = array_module(g)
    r = xp.sum(g, axis=axes, keepdims=True) if axes else g
    r = r.reshape(shape)
    if hasattr(like, "dtype"):
        r = r.astype(like.dtype, copy=False)
    return r


def _share(t, g):
    """Gradient for input ``t`` (a replicated leaf gets a share under deferred reduction)."""
    if isinstance(t, Tensor) and not isinstance(t.data, DistArray) and g is not None:
        return param_share(t, g)
    return g


def _binary(name, forward, grad_a, grad_b):
    def fn(a, b):
        av, bv = unwrap(a), unwrap(b)
        y = forward(av, bv)
        if isinstance(y, np.generic):
            y = y.item()

        def backward(g):
            ga = grad_a(g, av, bv, y) if isinstance(a, Tensor) and a.requires_grad else None
            gb = grad_b(g, av, bv, y) if isinstance(b, Tensor) and b.requires_grad else None
            return (_share(a, unbroadcast(ga, av)), _share(b, unbroadcast(gb, bv)))
        return make_result(y, (a, b), backward, name)
    fn.__name__ = name
    fn.__doc__ = f"Differentiable ``numpy.{forward.__name__}`` with broadcasting."
    return fn


add = _binary("add", np.add, lambda g, a, b, y: g, lambda g, a, b, y: g)
subtract = _binary("subtract", np.subtract, lambda g, a, b, y: g,
                   lambda g, a, b, y: np.negative(g))
multiply = _binary("multiply", np.multiply, lambda g, a, b, y: np.multiply(g, b),
                   lambda g, a, b, y: np.multiply(g, a))
divide = _binary("divide", np.true_divide, lambda g, a, b, y: np.true_divide(g, b),
                 lambda g, a, b, y: np.negative(np.true_divide(np.multiply(g, y), b)))


def _unary(name, forward, grad):
    def fn(x):
        xv = unwrap(x)
        y = forward(xv)
        if isinstance(y, np.generic):
            y = y.item()
        return make_result(y, (x,), lambda g: (_share(x, grad(g, xv, y)),), name)
    fn.__name__ = name
    fn.__doc__ = f"Differentiable elementwise ``numpy.{forward.__name__}``."
    return fn


negative = _unary("negative", np.negative, lambda g, x, y: np.negative(g))
exp = _unary("exp", np.exp, lambda g, x, y: np.multiply(g, y))
log = _unary("log", np.log, lambda g, x, y: np.true_divide(g, x))
sqrt = _unary("sqrt", np.sqrt, lambda g, x, y: np.true_divide(np.multiply(g, 0.5), y))
absolute = _unary("absolute", np.absolute, lambda g, x, y: np.multiply(g, np.sign(x)))


def power(x, p):
    """``x ** p`` for a constant exponent ``p`` (a number)."""
    if isinstance(p, Tensor) or not isinstance(p, numbers.Number):
        raise TypeError("power: the exponent must be a number (constant)")
    xv = unwrap(x)
    y = np.power(xv, p)
    if isinstance(y, np.generic):
        y = y.item()
    return make_result(y, (x,), lambda g: (_share(x, np.multiply(
        g, np.multiply(p, np.power(xv, p - 1)))),), "power")


# -- reductions ------------------------------------------------------------------------------
def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
    return tuple(sorted(a % ndim for a in axes))


def _as_number(v):
    if isinstance(v, DistArray) and v.ndim == 0:
        return v.item()
    if isinstance(v, np.generic):
        return v.item()
    return v


def _expand(g, xv, axes, keepdims):
    """``g`` (a reduction's gradient) broadcast back to ``xv``'s shape and layout."""
    g = _as_number(g)
    if isinstance(xv, numbers.Number):  # the sum of a scalar (a loss): itself
        return float(g)
    if isinstance(xv, DistArray):
        if isinstance(g, DistArray) and not keepdims:
            kshape = tuple(1 if i in axes else n for i, n in enumerate(xv.shape))
            g = manipulation.reshape(g, kshape)
        return np.add(filled_like(xv, 0), g)
    xp = array_module(xv)
    if not isinstance(g, numbers.Number) and not keepdims:
        g = xp.expand_dims(g, axes)
    return xp.broadcast_to(xp.asarray(g, dtype=xv.dtype), xv.shape).copy()


def sum(x, axis=None, keepdims: bool = False):  # noqa: A001 - NumPy's name
    """Differentiable sum (a full sum of a DistArray is a Python float, same on every rank)."""
    xv = unwrap(x)
    axes = _axes(axis, np.ndim(xv) if not isinstance(xv, DistArray) else xv.ndim)
    y = _as_number(xv.sum(axis=axes, keepdims=keepdims)) if isinstance(xv, DistArray) \
        else _as_number(array_module(xv).sum(xv, axis=axes, keepdims=keepdims))
    return make_result(y, (x,), lambda g: (_share(x, _expand(g, xv, axes, keepdims)),), "sum")


def mean(x, axis=None, keepdims: bool = False):
    """Differentiable mean."""
    xv = unwrap(x)
    shape = xv.shape if isinstance(xv, DistArray) else np.shape(xv)
    axes = _axes(axis, len(shape))
    count = 1
    for a in axes:
        count *= shape[a]
    return multiply(sum(x, axes, keepdims), 1.0 / max(count, 1))


# -- shape -----------------------------------------------------------------------------------
def reshape(x, shape):
    """Differentiable reshape (the gradient is reshaped back to ``x``'s distribution)."""
    xv = unwrap(x)
    if isinstance(xv, DistArray):
        y = manipulation.reshape(xv, shape)

        def backward(g):
            r = manipulation.reshape(g, xv.shape)
            if r.distribution != xv.distribution:
                r = r.redistribute(grid=xv.grid, distribution=xv.distribution)
            return (r,)
    else:
        y = xv.reshape(shape)

        def backward(g):
            return (_share(x, g.reshape(xv.shape)),)
    return make_result(y, (x,), backward, "reshape")


def transpose(x, axes=None):
    """Differentiable transpose (a view of the blocks for DistArrays)."""
    xv = unwrap(x)
    nd = xv.ndim
    axes = tuple(reversed(range(nd))) if axes is None else tuple(a % nd for a in axes)
    inv = tuple(np.argsort(axes))
    y = manipulation.transpose(xv, axes) if isinstance(xv, DistArray) else xv.transpose(axes)

    def backward(g):
        r = manipulation.transpose(g, inv) if isinstance(g, DistArray) else g.transpose(inv)
        if isinstance(r, DistArray) and r.distribution != xv.distribution:
            r = r.redistribute(grid=xv.grid, distribution=xv.distribution)
        return (_share(x, r),)
    return make_result(y, (x,), backward, "transpose")


def getitem(x, key):
    """Differentiable indexing: the gradient is zero except at the selected cells."""
    xv = unwrap(x)
    y = xv[key]

    def backward(g):
        if isinstance(xv, DistArray):
            out = filled_like(xv, 0)
            setitem(out, key, g)
            return (out,)
        out = array_module(xv).zeros_like(xv)
        out[key] = g
        return (_share(x, out),)
    return make_result(y, (x,), backward, "getitem")


def concatenate(xs, axis: int = 0):
    """Differentiable ``concatenate`` of DistArray tensors (collective)."""
    xs = list(xs)
    vals = [unwrap(t) for t in xs]
    y = manipulation.concatenate(vals, axis=axis)
    ax = axis % y.ndim

    def backward(g):
        out, start = [], 0
        for v in vals:
            n = v.shape[ax]
            key = (slice(None),) * ax + (slice(start, start + n),)
            piece = g[key]
            if piece.distribution != v.distribution or piece.grid is not v.grid:
                piece = piece.redistribute(grid=v.grid, distribution=v.distribution)
            out.append(piece)
            start += n
        return tuple(out)
    return make_result(y, xs, backward, "concatenate")


def redistribute(x, grid=None, split=None, sizes=None, distribution=None):
    """Differentiable redistribution; its gradient is redistributed back (a redistribution
    does not change the global array)."""
    xv = unwrap(x)
    y = xv.redistribute(grid=grid, split=split, sizes=sizes, distribution=distribution)
    return make_result(y, (x,), lambda g: (g.redistribute(grid=xv.grid,
                                                          distribution=xv.distribution),),
                       "redistribute")
