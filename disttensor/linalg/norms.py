"""Norms: ``vector_norm``, ``matrix_norm`` (array API), ``norm`` (``numpy.linalg.norm``) and
the condition number ``cond``.

Collective over ``x``'s grid; the ranks agree ``x``'s metadata, ``ord``, ``axis`` and
``keepdims`` first, and an invalid order or axis raises NumPy's ``ValueError`` on every rank.
Results are DistArrays (0-d for full reductions), laid out as the reductions of
:mod:`disttensor.routines.reductions` leave them.

``vector_norm`` (ord ``2``, ``1``, ``inf``, ``-inf``, ``0``, any other ``p``) and the
elementwise matrix norms (``'fro'``, ``1``, ``-1``, ``inf``, ``-inf``) are reductions (one
all-reduce each).  ``matrix_norm`` with ``2``, ``-2`` or ``'nuc'`` uses singular values
(:func:`~.decompositions.singular_values`): of a 2-D matrix through TSQR (of its transpose
when wide), of stacks through the gather path (guarded by ``DISTTENSOR_GATHER_LIMIT``).
``norm`` follows ``numpy.linalg.norm``'s rules for ``ord`` and ``axis``.  Integer and boolean
input is computed in float64.

``cond(x, p)``: for one matrix and ``p`` ``None``/``2``/``-2`` the ratio of its extreme
singular values (TSQR, as ``matrix_norm(x, 2)``; a 0-d replicated result); other orders, and
stacks, by the gather path (``numpy.linalg.cond`` on every rank after gathering ``x``, which
needs the inverse; guarded by ``DISTTENSOR_GATHER_LIMIT``; the result split like ``x``'s batch
axes).  As NumPy, a NaN ratio of a matrix without NaN entries is ``inf``.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry
from .decompositions import check_svd_size, singular_values
from .gather_path import check_gather_size, run_gathered
from .operands import (as_float, batch_layout, block_of, check_distarray, check_matrix,
                       check_square, insert_axis, remove_axis, replicated)

__all__ = ["vector_norm", "matrix_norm", "norm", "cond"]


def _vector_norm(x: DistArray, axes, keepdims: bool, ord) -> DistArray:
    from ..routines import reductions
    x = as_float(x)
    ax = np.abs(x)
    if ord == np.inf:
        return reductions.max(ax, axis=axes, keepdims=keepdims)
    if ord == -np.inf:
        return reductions.min(ax, axis=axes, keepdims=keepdims)
    if ord == 0:
        return reductions.sum(np.not_equal(ax, 0).astype(ax.dtype), axis=axes, keepdims=keepdims)
    if ord == 1:
        return reductions.sum(ax, axis=axes, keepdims=keepdims)
    if ord == 2:
        return np.sqrt(reductions.sum(np.multiply(ax, ax), axis=axes, keepdims=keepdims))
    return np.power(reductions.sum(np.power(ax, ord), axis=axes, keepdims=keepdims), 1.0 / ord)


def _norm_axes(x: DistArray, axis):
    from numpy.lib.array_utils import normalize_axis_tuple
    if axis is None:
        return tuple(range(x.ndim))
    return tuple(sorted(normalize_axis_tuple(axis, x.ndim)))


@collective_entry
def vector_norm(x: DistArray, /, *, axis=None, keepdims: bool = False, ord=2) -> DistArray:
    """Array API ``vector_norm`` (collective; one all-reduce): ``ord`` 2, 1, inf, -inf, 0 or any
    other real ``p`` (``sum(|x|^p)^(1/p)``); ``axis`` None (all), an int or a tuple."""
    check_distarray(x, "vector_norm")
    with agreed(x.grid.cart, "vector_norm", x=x, axis=canon(axis), keepdims=bool(keepdims),
                ord=canon(ord)):
        axes = _norm_axes(x, axis)
        if isinstance(ord, str) or not isinstance(ord, numbers.Real):
            raise ValueError(f"Invalid norm order '{ord}' for vectors")
    return _vector_norm(x, axes, bool(keepdims), ord)


_MATRIX_ORDS = ("fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf)


def _matrix_norm_last2(x: DistArray, ord, keepdims: bool) -> DistArray:
    from ..routines import reductions
    nd = x.ndim
    if ord == "fro":
        r = _vector_norm(x, (nd - 2, nd - 1), True, 2)
    elif ord in (1, -1, np.inf, -np.inf):
        ax = np.abs(as_float(x))
        first, second = (nd - 2, nd - 1) if ord in (1, -1) else (nd - 1, nd - 2)
        s = reductions.sum(ax, axis=first, keepdims=True)
        r = (reductions.max if ord > 0 else reductions.min)(s, axis=second, keepdims=True)
    else:
        s = singular_values(x)
        red = {2: reductions.max, -2: reductions.min, "nuc": reductions.sum}[ord]
        r = insert_axis(red(s, axis=-1, keepdims=True), nd - 1)
    if not keepdims:
        r = remove_axis(remove_axis(r, nd - 1), nd - 2)
    return r


@collective_entry
def matrix_norm(x: DistArray, /, *, keepdims: bool = False, ord="fro") -> DistArray:
    """Array API ``matrix_norm`` over the last two axes (collective): ``'fro'``, 1, -1, inf,
    -inf by reductions; 2, -2, ``'nuc'`` from singular values (TSQR for 2-D, else gather)."""
    check_distarray(x, "matrix_norm")
    with agreed(x.grid.cart, "matrix_norm", x=x, keepdims=bool(keepdims), ord=canon(ord)):
        if x.ndim < 2:
            raise ValueError("matrix_norm needs an array of at least two dimensions")
        if not any(ord == o and type(ord) is not bool for o in _MATRIX_ORDS):
            raise ValueError("Invalid norm order for matrices.")
        if ord in (2, -2, "nuc"):
            check_svd_size(x, "matrix_norm")
    return _matrix_norm_last2(x, ord, bool(keepdims))


@collective_entry
def norm(x: DistArray, ord=None, axis=None, keepdims: bool = False) -> DistArray:
    """``numpy.linalg.norm`` (collective): with ``axis=None`` the 2-norm of the flattened array
    for ``ord=None``, else the vector (1-D) or matrix (2-D) norm; an int ``axis`` gives vector
    norms, a pair of axes matrix norms.  Returns a DistArray (0-d for a full reduction)."""
    from numpy.lib.array_utils import normalize_axis_tuple
    from ..routines.manipulation import moveaxis
    check_distarray(x, "norm")
    with agreed(x.grid.cart, "norm", x=x, ord=canon(ord), axis=canon(axis),
                keepdims=bool(keepdims)):
        if axis is None:
            if ord is None:
                kind, axes = "vector", tuple(range(x.ndim))
            elif x.ndim == 1:
                kind, axes = "vector", (0,)
            elif x.ndim == 2:
                kind, axes = "matrix", (0, 1)
            else:
                raise ValueError("Improper number of dimensions to norm.")
        else:
            axes = normalize_axis_tuple(axis, x.ndim)
            if len(axes) == 1:
                kind = "vector"
            elif len(axes) == 2:
                kind = "matrix"
            else:
                raise ValueError("Improper number of dimensions to norm.")
        if kind == "vector":
            if ord is None:
                ord = 2
            if isinstance(ord, str) or not isinstance(ord, numbers.Real):
                raise ValueError(f"Invalid norm order '{ord}' for vectors")
        else:
            if ord is None:
                ord = "fro"
            if not any(ord == o and type(ord) is not bool for o in _MATRIX_ORDS):
                raise ValueError("Invalid norm order for matrices.")
            if ord in (2, -2, "nuc"):
                check_svd_size(moveaxis(x, axes, (-2, -1)), "norm")
    if kind == "vector":
        return _vector_norm(x, tuple(sorted(axes)), bool(keepdims), ord)
    r = _matrix_norm_last2(moveaxis(x, axes, (-2, -1)), ord, False)
    if keepdims:
        for t in sorted(axes):
            r = insert_axis(r, t)
    return r


@collective_entry
def cond(x: DistArray, p=None) -> DistArray:
    """``numpy.linalg.cond`` (collective): a DistArray, 0-d for one matrix (module
    docstring for the paths); NumPy's ``LinAlgError`` for fewer than two dimensions, empty
    matrices and, for ``p`` other than ``None``/``2``/``-2``, non-square ones."""
    check_distarray(x, "cond")
    with agreed(x.grid.cart, "cond", x=x, p=canon(p)):
        check_matrix(x, "cond")
        if x.size == 0 and math.prod(x.shape[-2:]) == 0:
            raise np.linalg.LinAlgError("cond is not defined on empty arrays")
        by_svd = x.ndim == 2 and (p is None or (p in (2, -2) and type(p) is not bool))
        if not by_svd:
            if not (p is None or p in (2, -2)):
                check_square(x)
                if not any(p == o and type(p) is not bool for o in _MATRIX_ORDS):
                    raise ValueError("Invalid norm order for matrices.")
            check_gather_size("cond", x)
    if not by_svd:
        r = np.asarray(run_gathered(x, lambda m: np.linalg.cond(m, p), x))
        return block_of(r, x.grid, batch_layout(x, r.shape), x.xp)
    s = np.asarray(singular_values(x).local)
    with np.errstate(all="ignore"):
        r = s[-1] / s[0] if p == -2 else s[0] / s[-1]
    if np.isnan(r):  # the SVD raised for NaN entries: a NaN ratio here is 0/0
        r = np.inf
    return replicated(np.asarray(r, dtype=s.dtype), x.grid)
