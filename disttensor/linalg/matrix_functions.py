"""Matrix functions built on the decompositions and on ``matmul``: ``matrix_rank`` and
``pinv`` (from singular values) and ``matrix_power`` (repeated squaring).

Collective over ``x``'s grid; the ranks agree ``x``'s metadata and the options (``rtol``,
``n``) first, and bad input (fewer than two dimensions, a non-square ``matrix_power``, a
negative or non-finite ``rtol``, a non-integer exponent) raises on every rank.  ``rtol``
defaults to the array API's ``max(M, N) * eps`` of the result's float type.  2-D matrices go
through TSQR (:mod:`.decompositions`) and the distributed :func:`~.matrix_product.matmul`;
stacks through the gather path (:mod:`.gather_path`, guarded), with the batch axes laid out
like ``x``'s.
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry
from .contractions import matrix_transpose
from .decompositions import check_svd_size, singular_values, svd
from .gather_path import check_gather_size, inv, run_gathered
from .matrix_product import matmul
from .operands import (as_float, batch_layout, block_of, check_distarray, check_matrix,
                       check_square)

__all__ = ["matrix_rank", "pinv", "matrix_power"]


def _rtol(x: DistArray, rtol):
    """The array API's default relative tolerance ``max(M, N) * eps`` (of the result's float
    type), or ``rtol`` (a number)."""
    if rtol is None:
        return max(x.shape[-2:]) * np.finfo(as_float(x).dtype).eps
    if isinstance(rtol, (bool, np.bool_)) or not np.isscalar(rtol) or not np.isfinite(rtol) \
            or rtol < 0:
        raise ValueError(f"rtol must be a finite non-negative number, got {rtol!r}")
    return float(rtol)


@collective_entry
def matrix_rank(x: DistArray, /, *, rtol=None) -> DistArray:
    """Rank over the last two axes (array API; collective): the number of singular values
    above ``rtol * max(singular value)`` (default ``rtol = max(M, N) * eps``).  Singular
    values as :func:`svdvals` (2-D: TSQR, the rank replicated; stacks: the gather path,
    guarded, batch axes laid out like ``x``)."""
    check_distarray(x, "matrix_rank")
    with agreed(x.grid.cart, "matrix_rank", x=x,
                rtol=canon(rtol)):
        check_matrix(x, "matrix_rank")
        tol = _rtol(x, rtol)
        check_svd_size(x, "matrix_rank")
    s = singular_values(x)
    if 0 in x.shape[-2:]:
        return (s > 0).sum(axis=-1)
    return (s > s.max(axis=-1, keepdims=True) * tol).sum(axis=-1)


@collective_entry
def pinv(x: DistArray, /, *, rtol=None) -> DistArray:
    """Moore-Penrose pseudo-inverse over the last two axes (array API; collective): singular
    values at most ``rtol * max(singular value)`` (default ``max(M, N) * eps``) count as zero.
    2-D: from the TSQR :func:`svd` (``full_matrices=False``), ``V diag(1/s) U^H`` by the
    distributed :func:`matmul` (the ``M`` axis of the result is split as ``x``'s rows were);
    stacks: the gather path (guarded), laid out with the batch axes like ``x``."""
    check_distarray(x, "pinv")
    with agreed(x.grid.cart, "pinv", x=x, rtol=canon(rtol)):
        check_matrix(x, "pinv")
        tol = _rtol(x, rtol)
        if x.ndim > 2:
            check_gather_size("pinv", x)
    if x.ndim > 2 or 0 in x.shape:
        r = run_gathered(x, lambda a: np.linalg.pinv(a, rcond=tol), x)
        return block_of(r, x.grid, batch_layout(x, r.shape), x.xp)
    u, s, vh = svd(x, full_matrices=False)
    sv = s.to_numpy()
    keep = sv > tol * (sv.max() if sv.size else 0.0)
    sinv = np.where(keep, 1.0 / np.where(keep, sv, 1.0), 0.0).astype(sv.dtype)
    v = matrix_transpose(vh)
    uh = matrix_transpose(u)
    if x.dtype.kind == "c":
        v, uh = np.conj(v), np.conj(uh)
    return matmul(v * sinv.astype(as_float(x).dtype), uh)


@collective_entry
def matrix_power(x: DistArray, n: int, /) -> DistArray:
    """``x`` to the integer power ``n`` over the last two axes (square; collective): repeated
    squaring with the distributed :func:`matmul` (``n = 0``: the identity; ``n < 0``: powers
    of :func:`inv`, gather path).  The result is laid out like ``x``."""
    check_distarray(x, "matrix_power")
    with agreed(x.grid.cart, "matrix_power", x=x, n=canon(n)):
        check_matrix(x, "matrix_power")
        check_square(x)
        _exact_int(n)
    n = int(n)
    if n == 0:
        eye = np.broadcast_to(np.eye(x.shape[-1], dtype=x.dtype), x.shape)
        return block_of(np.ascontiguousarray(eye), x.grid, x.distribution, x.xp)
    base = inv(x) if n < 0 else x
    n = abs(n)
    result = None
    while True:
        if n & 1:
            result = base if result is None else matmul(result, base)
        n >>= 1
        if not n:
            break
        base = matmul(base, base)
    if result.distribution != x.distribution or result.grid is not x.grid:
        result = result.redistribute(grid=x.grid, distribution=x.distribution)
    return result if result is not x else result.copy()


def _exact_int(n) -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"exponent must be an integer, got {n!r}")
    return int(n)
