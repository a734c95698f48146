"""Contractions and matrix index operations: ``tensordot``, ``vecdot``, ``inner``,
``outer``, ``kron``, ``diagonal``, ``trace``, ``cross`` and ``matrix_transpose`` (``einsum``:
:mod:`.einsum`, on :func:`contract`).

Every function is collective over the grid of its first DistArray operand (NumPy operands
next to it are replicated values); the ranks agree the operands' metadata and the options
before any data moves, and bad input raises NumPy's exception on every rank.

``tensordot`` and ``inner`` (``tensordot`` over the last axes) transpose and reshape the
operands into a batched :func:`~.matrix_product.matmul_nd` (:func:`contract`), so they move
data as ``matmul`` does; ``outer`` and ``kron`` are broadcast products (the elementwise
alignment rule), ``kron`` then merges each pair of axes by ``reshape``: result axis ``i`` is
split where ``a``'s axis ``i`` is (whole blocks of ``b.shape[i]`` rows per row of ``a``) or,
if that is whole, as ``b``'s axis ``i`` is when ``reshape`` can keep it without moving data.
``vecdot`` is ``sum(conj(x1) * x2, axis)`` with the elementwise alignment rule of
:mod:`disttensor.core.array`.  ``diagonal`` keeps each rank's diagonal entries of its rows
(the column axis is made whole first), ``trace`` sums them, ``cross`` makes the vector axis
whole, and ``matrix_transpose`` swaps the last two axes without moving data.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..core.array import DistArray
from ..core.distribution import Distribution
from ..core.entry import agreed, canon, collective_entry, operand_key
from .matrix_product import matmul_nd
from .operands import check_distarray, comm_of, insert_axis, laid_out, operand_pair

__all__ = ["tensordot", "contract", "vecdot", "inner", "outer", "kron", "diagonal", "trace",
           "cross", "matrix_transpose"]


def matrix_transpose(x: DistArray) -> DistArray:
    """``x`` with its last two axes swapped (no data moves; ``x.mT``)."""
    check_distarray(x, "matrix_transpose")
    if x.ndim < 2:
        raise ValueError(f"matrix_transpose needs at least 2 dimensions, got {x.ndim}")
    from ..routines.manipulation import swapaxes
    return swapaxes(x, -1, -2)



# -- contractions ------------------------------------------------------------------------------
def _regroup(x: DistArray, shape) -> DistArray:
    from ..routines.manipulation import reshape
    shape = tuple(int(s) for s in shape)
    return x if x.shape == shape else reshape(x, shape)


def contract(a: DistArray, b: DistArray, ba, bb, ca, cb) -> DistArray:
    """Contract axes ``ca`` of ``a`` with ``cb`` of ``b``, batch axes ``ba``/``bb`` paired;
    result axes: batch, free axes of ``a``, free axes of ``b`` (sizes already checked; the
    collective core of ``tensordot``, ``inner`` and ``einsum``)."""
    from ..routines.manipulation import transpose
    fa = [t for t in range(a.ndim) if t not in ba and t not in ca]
    fb = [t for t in range(b.ndim) if t not in bb and t not in cb]
    A = transpose(a, list(ba) + fa + list(ca))
    B = transpose(b, list(bb) + list(cb) + fb)
    bshape = [a.shape[t] for t in ba]
    sa = [a.shape[t] for t in fa]
    sb = [b.shape[t] for t in fb]
    K = math.prod(a.shape[t] for t in ca)
    A = _regroup(A, bshape + [math.prod(sa), K])
    B = _regroup(B, bshape + [K, math.prod(sb)])
    C = matmul_nd(A, B)
    return _regroup(C, bshape + sa + sb)


def _axes_list(v, nd: int, what: str):
    from numpy.lib.array_utils import normalize_axis_index
    if isinstance(v, numbers.Integral):
        v = [v]
    return [normalize_axis_index(int(t), nd, what) for t in v]


@collective_entry
def tensordot(x1, x2, axes=2) -> DistArray:
    """``numpy.tensordot`` (collective): ``axes`` an int ``N`` (last ``N`` axes of ``x1`` with the
    first ``N`` of ``x2``) or a pair of axis sequences.  Transpose + reshape + matmul."""
    comm = comm_of(x1, x2)
    with agreed(comm, "tensordot", x1=operand_key(x1), x2=operand_key(x2), axes=canon(axes)):
        grid, a, b = operand_pair(x1, x2, "tensordot")
        if isinstance(axes, numbers.Integral):
            n = int(axes)
            if n < 0 or n > a.ndim or n > b.ndim:
                raise ValueError(f"tensordot: axes={n} is out of range for operands with "
                                 f"{a.ndim} and {b.ndim} dimensions")
            ca, cb = list(range(a.ndim - n, a.ndim)), list(range(n))
        else:
            try:
                ia, ib = axes
            except (TypeError, ValueError):
                raise TypeError("tensordot: axes must be an int or a pair of axis "
                                "sequences") from None
            ca, cb = _axes_list(ia, a.ndim, "axes"), _axes_list(ib, b.ndim, "axes")
        if len(ca) != len(cb) or len(set(ca)) != len(ca) or len(set(cb)) != len(cb):
            raise ValueError("shape-mismatch for sum")
        if any(a.shape[i] != b.shape[j] for i, j in zip(ca, cb)):
            raise ValueError("shape-mismatch for sum")
    return contract(a, b, [], [], ca, cb)


@collective_entry
def vecdot(x1, x2, /, *, axis: int = -1) -> DistArray:
    """``sum(conj(x1) * x2, axis)`` over broadcast operands (collective; the array API's and
    NumPy 2's ``vecdot``); the product follows the elementwise alignment rule."""
    from ..routines import reductions
    comm = comm_of(x1, x2)
    with agreed(comm, "vecdot", x1=operand_key(x1), x2=operand_key(x2), axis=canon(axis)):
        grid, a, b = operand_pair(x1, x2, "vecdot")
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError("vecdot: operands must have at least one dimension")
        shape = np.broadcast_shapes(a.shape, b.shape)
        from numpy.lib.array_utils import normalize_axis_index
        ax = normalize_axis_index(int(axis), len(shape), "axis")
        na = a.shape[ax - len(shape) + a.ndim] if ax - len(shape) + a.ndim >= 0 else 1
        nb = b.shape[ax - len(shape) + b.ndim] if ax - len(shape) + b.ndim >= 0 else 1
        if na != nb:
            raise ValueError(f"vecdot: the contracted axis has sizes {na} and {nb}")
    prod = np.multiply(np.conj(a) if a.dtype.kind == "c" else a, b)
    return reductions.sum(prod, axis=ax)


@collective_entry
def outer(x1, x2) -> DistArray:
    """``numpy.outer``: ``x1.ravel()[:, None] * x2.ravel()[None, :]`` (collective); rows split
    like ``x1``, columns like ``x2`` when its grid axis is free (the alignment rule)."""
    from ..routines.manipulation import reshape
    comm = comm_of(x1, x2)
    with agreed(comm, "outer", x1=operand_key(x1), x2=operand_key(x2)):
        grid, a, b = operand_pair(x1, x2, "outer")
    a = a if a.ndim == 1 else reshape(a, (a.size,))
    b = b if b.ndim == 1 else reshape(b, (b.size,))
    return np.multiply(insert_axis(a, 1), insert_axis(b, 0))



@collective_entry
def inner(a, b, /) -> DistArray:
    """``numpy.inner``: sums over the last axes of both (no complex conjugate); a 0-d operand
    multiplies.  Result axes: ``a``'s others, then ``b``'s others (``tensordot``)."""
    comm = comm_of(a, b)
    with agreed(comm, "inner", a=operand_key(a), b=operand_key(b)):
        grid, x, y = operand_pair(a, b, "inner")
        if x.ndim and y.ndim and x.shape[-1] != y.shape[-1]:
            yt = (y.shape[-1],) + y.shape[:-1]
            raise ValueError(f"shapes {x.shape} and {yt} not aligned: {x.shape[-1]} (dim "
                             f"{x.ndim - 1}) != {y.shape[-1]} (dim 0)")
    if x.ndim == 0 or y.ndim == 0:
        return np.multiply(x, y)
    return contract(x, y, [], [], [x.ndim - 1], [y.ndim - 1])


@collective_entry
def kron(a, b) -> DistArray:
    """``numpy.kron``: the Kronecker product, ``out[i*B + j] = a[i] * b[j]`` per axis (the
    operand with fewer axes gets leading length-1 axes); layout: module docstring."""
    from ..routines.manipulation import expand_dims, reshape
    comm = comm_of(a, b)
    with agreed(comm, "kron", a=operand_key(a), b=operand_key(b)):
        grid, x, y = operand_pair(a, b, "kron")
    nd = max(x.ndim, y.ndim)
    if x.ndim < nd:
        x = reshape(x, (1,) * (nd - x.ndim) + x.shape)
    if y.ndim < nd:
        y = reshape(y, (1,) * (nd - y.ndim) + y.shape)
    if nd == 0:
        return np.multiply(x, y)
    xe = expand_dims(x, tuple(range(1, 2 * nd, 2)))   # a0, 1, a1, 1, ...
    ye = expand_dims(y, tuple(range(0, 2 * nd, 2)))   # 1, b0, 1, b1, ...
    prod = np.multiply(xe, ye)
    return reshape(prod, tuple(m * n for m, n in zip(x.shape, y.shape)))

# -- diagonals, cross products -----------------------------------------------------------------

@collective_entry
def diagonal(x: DistArray, offset: int = 0, axis1: int = 0, axis2: int = 1) -> DistArray:
    """``numpy.diagonal`` (collective): the diagonal becomes the last axis, split like
    ``axis1`` was (each rank keeps the diagonal entries of its rows); ``axis2`` is made whole
    first (a redistribution when it is split)."""
    from numpy.lib.array_utils import normalize_axis_index
    from ..routines.manipulation import moveaxis
    check_distarray(x, "diagonal")
    with agreed(x.grid.cart, "diagonal", x=x, offset=canon(offset), axis1=canon(axis1),
                axis2=canon(axis2)):
        if x.ndim < 2:
            raise ValueError("diag requires an array of at least two dimensions")
        a1 = normalize_axis_index(int(axis1), x.ndim, "axis1")
        a2 = normalize_axis_index(int(axis2), x.ndim, "axis2")
        if a1 == a2:
            raise ValueError("axis1 and axis2 cannot be the same")
        offset = int(offset)
    y = moveaxis(x, (a1, a2), (-2, -1))
    if y.split[-1] is not None:
        d = y.distribution
        y = laid_out(y, y.grid, Distribution(d.shape, d.grid_dims, d.split[:-1] + (None,),
                                          d.split_sizes[:-1] + (None,)))
    n1, n2 = y.shape[-2:]
    ro, co = max(0, -offset), max(0, offset)
    L = max(0, min(n1 - ro, n2 - co))
    d = y.distribution
    o = d.offsets[-2]
    r0 = o[d.axis_coord(y.ndim - 2, y.grid.coords)]
    r1 = r0 + y.local.shape[-2]
    i0, i1 = max(r0 - ro, 0), max(min(r1 - ro, L), max(r0 - ro, 0))
    idx = np.arange(i0, i1)
    loc = y.local[..., idx + ro - r0, idx + co] if i1 > i0 else \
        y.xp.zeros(y.local.shape[:-2] + (0,), dtype=y.dtype)
    g = y.split[-2]
    sizes = None
    if g is not None:
        sizes = [max(0, min(o[c + 1] - ro, L) - max(o[c] - ro, 0)) for c in range(len(o) - 1)]
    dist = Distribution(y.shape[:-2] + (L,), d.grid_dims, d.split[:-2] + (g,),
                        d.split_sizes[:-2] + (sizes,))
    return DistArray(y.xp.ascontiguousarray(loc), dist, y.grid)


@collective_entry
def trace(x: DistArray, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype=None) -> DistArray:
    """``numpy.trace``: the sum of :func:`diagonal` along its last axis (collective)."""
    from ..routines import reductions
    from ..core.entry import dtype_key
    check_distarray(x, "trace")
    with agreed(x.grid.cart, "trace", x=x, offset=canon(offset), axis1=canon(axis1),
                axis2=canon(axis2), dtype=dtype_key(dtype)):
        if x.ndim < 2:
            raise ValueError("diag requires an array of at least two dimensions")
    return reductions.sum(diagonal(x, offset, axis1, axis2), axis=-1, dtype=dtype)


@collective_entry
def cross(x1, x2, /, *, axis: int = -1) -> DistArray:
    """Cross product of 3-vectors along ``axis`` (collective; operands of the same shape): the
    vector axis is made whole, the rest keeps ``x1``'s layout."""
    from numpy.lib.array_utils import normalize_axis_index
    comm = comm_of(x1, x2)
    with agreed(comm, "cross", x1=operand_key(x1), x2=operand_key(x2), axis=canon(axis)):
        grid, a, b = operand_pair(x1, x2, "cross")
        if a.shape != b.shape:
            raise ValueError(f"cross: operands must have the same shape, got {a.shape} and "
                             f"{b.shape}")
        if a.ndim == 0:
            raise ValueError("cross: operands must have at least one dimension")
        ax = normalize_axis_index(int(axis), a.ndim, "axis")
        if a.shape[ax] != 3:
            raise ValueError("incompatible dimensions for cross product (dimension must be 3)")
    d = a.distribution
    split, sizes = list(d.split), list(d.split_sizes)
    split[ax] = sizes[ax] = None
    target = Distribution(d.shape, d.grid_dims, split, sizes)
    A, B = laid_out(a, grid, target), laid_out(b, grid, target)
    xp = A.xp
    return DistArray(xp.cross(A.local, B.local, axis=ax), target, grid)
