"""Contractions and matrix index operations: ``tensordot``, ``einsum`` (two operands),
``vecdot``, ``outer``, ``diagonal``, ``trace``, ``cross`` and ``matrix_transpose``.

Every function is collective over the grid of its first DistArray operand (NumPy operands
next to it are replicated values); the ranks agree the operands' metadata and the options
before any data moves, and bad input raises NumPy's exception on every rank.

``tensordot``, ``einsum`` (explicit or implicit output, no ellipsis, no repeated label inside
one operand) and ``outer`` transpose and reshape the operands into a batched
:func:`~.matrix_product.matmul_nd` (labels only in one operand and not in the output are
summed first), so they move data as ``matmul`` does.  ``vecdot`` is ``sum(conj(x1) * x2,
axis)`` with the elementwise alignment rule of :mod:`disttensor.core.array`.  ``diagonal``
keeps each rank's diagonal entries of its rows (the column axis is made whole first),
``trace`` sums them, ``cross`` makes the vector axis whole, and ``matrix_transpose`` swaps the
last two axes without moving data.
"""
from __future__ import annotations

import math
import numbers
import string

import numpy as np

from ..core.array import DistArray
from ..core.distribution import Distribution
from ..core.entry import agreed, canon, collective_entry, operand_key
from .matrix_product import matmul_nd
from .operands import check_distarray, comm_of, insert_axis, laid_out, operand_pair

__all__ = ["tensordot", "einsum", "vecdot", "outer", "diagonal", "trace", "cross",
           "matrix_transpose"]


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


def _contract(a: DistArray, b: DistArray, ba, bb, ca, cb) -> DistArray:
    """Contract axes ``ca`` of ``a`` with ``cb`` of ``b``, batch axes ``ba``/``bb`` paired;
    result axes: batch, free axes of ``a``, free axes of ``b`` (sizes already checked)."""
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
    return _contract(a, b, [], [], ca, cb)


def _parse_einsum(subscripts: str, nda: int, ndb: int):
    if not isinstance(subscripts, str):
        raise TypeError("einsum: subscripts must be a string")
    s = subscripts.replace(" ", "")
    if "." in s:
        raise ValueError("einsum: ellipsis ('...') is not supported for DistArrays")
    ins, arrow, out = s.partition("->")
    parts = ins.split(",")
    if len(parts) != 2:
        raise ValueError("einsum: DistArrays support exactly two operands")
    la, lb = parts
    for lab in (la, lb, out):
        if any(c not in string.ascii_letters for c in lab):
            raise ValueError(f"einsum: invalid subscript in {subscripts!r}")
    for i, (lab, nd) in enumerate(((la, nda), (lb, ndb))):
        if len(lab) != nd:
            raise ValueError(f"einsum: operand {i} has {nd} dimensions but the subscripts "
                             f"give {len(lab)}")
        if len(set(lab)) != len(lab):
            raise ValueError("einsum: a label repeated within one operand (a diagonal) is not "
                             "supported for DistArrays")
    if not arrow:
        out = "".join(sorted(c for c in set(la + lb) if (la + lb).count(c) == 1))
    if len(set(out)) != len(out):
        raise ValueError(f"einsum: output subscript {out!r} repeats a label")
    for c in out:
        if c not in la and c not in lb:
            raise ValueError(f"einsum: output label {c!r} does not appear in an input")
    return la, lb, out


@collective_entry
def einsum(subscripts: str, x1, x2) -> DistArray:
    """Two-operand ``numpy.einsum`` without ellipsis or repeated labels inside one operand
    (collective): labels only in one operand and not in the output are summed first, the rest
    becomes a batched matmul (batch: in both and the output; contracted: in both only)."""
    from ..routines import reductions
    from ..routines.manipulation import transpose
    comm = comm_of(x1, x2)
    with agreed(comm, "einsum", subscripts=subscripts, x1=operand_key(x1),
                x2=operand_key(x2)):
        grid, a, b = operand_pair(x1, x2, "einsum")
        la, lb, out = _parse_einsum(subscripts, a.ndim, b.ndim)
        for c in set(la) & set(lb):
            if a.shape[la.index(c)] != b.shape[lb.index(c)]:
                raise ValueError(f"einsum: operands could not be broadcast together: label "
                                 f"{c!r} has sizes {a.shape[la.index(c)]} and "
                                 f"{b.shape[lb.index(c)]}")
    sum_a = [i for i, c in enumerate(la) if c not in lb and c not in out]
    sum_b = [i for i, c in enumerate(lb) if c not in la and c not in out]
    if sum_a:
        a = reductions.sum(a, axis=tuple(sum_a))
        la = "".join(c for i, c in enumerate(la) if i not in sum_a)
    if sum_b:
        b = reductions.sum(b, axis=tuple(sum_b))
        lb = "".join(c for i, c in enumerate(lb) if i not in sum_b)
    batch = [c for c in la if c in lb and c in out]
    con = [c for c in la if c in lb and c not in out]
    res = _contract(a, b, [la.index(c) for c in batch], [lb.index(c) for c in batch],
                    [la.index(c) for c in con], [lb.index(c) for c in con])
    labels = batch + [c for c in la if c not in lb] + [c for c in lb if c not in la]
    perm = [labels.index(c) for c in out]
    return res if perm == list(range(len(perm))) else transpose(res, perm)


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
