"""``lstsq``: least squares by TSQR for tall matrices, by the gather path otherwise.

Collective over the grid of the first DistArray operand; the ranks agree the operands'
metadata and ``rcond`` first, and bad input (``a`` not 2-D, ``b`` not 1-D or 2-D, row counts
that differ) raises NumPy's ``LinAlgError`` on every rank.

Tall ``a`` (``m >= n``, any layout): one TSQR (:mod:`.decompositions`) of ``[a | b]`` (``b``
as columns beside ``a``, in ``a``'s row layout) gives, replicated on every rank, ``R =
[[R11, c], [0, R22]]`` with ``a = Q R11`` and ``c = Q^H b``.  NumPy's SVD-based solver then
runs on the small ``R11 x = c`` on every rank with NumPy's cutoff (``rcond`` times the largest
singular value, ``rcond=None``: machine epsilon times ``max(m, n)``), which gives NumPy's
minimum-norm solution, rank and singular values (those of ``R11`` are ``a``'s); the residual
sums of squares are the squared column norms of ``R22`` (``|b - a x|`` without forming it).
One all-gather of ``P (n+k)^2`` elements; flops ``2 m (n+k)^2 / P`` per rank.  Wide or empty
``a``: the operands are gathered whole on every rank (guarded by ``DISTTENSOR_GATHER_LIMIT``)
and NumPy's ``lstsq`` runs there.

Returns NumPy's 4-tuple ``(x, residuals, rank, s)``: ``x`` (``(n,)`` or ``(n, k)``),
``residuals`` (``(k,)``, ``(1,)`` for a 1-D ``b``, ``(0,)`` when ``rank < n`` or ``m <= n``)
and ``s`` (``(min(m, n),)``) as replicated DistArrays, ``rank`` a Python int.  Computed in
double precision (as NumPy) and returned in NumPy's result type.
"""
from __future__ import annotations

import numpy as np

from ..core.entry import agreed, canon, collective_entry, operand_key
from .decompositions import tsqr_r
from .gather_path import check_gather_size, run_gathered
from .operands import comm_of, operand_pair, replicated

__all__ = ["lstsq"]


def _types(*dtypes) -> tuple[np.dtype, np.dtype]:
    """(dtype LAPACK works in, dtype of the results) as NumPy's linalg picks them."""
    rt = np.result_type(*dtypes)
    if rt.kind not in "fc":
        rt = np.dtype(np.float64)
    return np.result_type(rt, np.float64), rt


def _real(dt: np.dtype) -> np.dtype:
    return np.empty(0, dt).real.dtype


@collective_entry
def lstsq(a, b, rcond=None):
    """``numpy.linalg.lstsq`` (collective): ``(x, residuals, rank, s)``; TSQR for
    ``m >= n``, the gather path (guarded) otherwise (module docstring)."""
    from ..routines.manipulation import concatenate, reshape
    comm = comm_of(a, b)
    with agreed(comm, "lstsq", a=operand_key(a), b=operand_key(b), rcond=canon(rcond)):
        grid, a, b = operand_pair(a, b, "lstsq")
        for nd in (a.ndim, b.ndim if b.ndim > 2 else 2):
            if nd != 2:
                raise np.linalg.LinAlgError(f"{nd}-dimensional array given. Array must be "
                                            "two-dimensional")
        if b.ndim == 0 or b.shape[0] != a.shape[0]:
            raise np.linalg.LinAlgError("Incompatible dimensions")
        m, n = a.shape
        k = 1 if b.ndim == 1 else b.shape[1]
        tall = m >= n > 0 and k > 0
        if not tall:
            check_gather_size("lstsq", a, b)
    work, rt = _types(a.dtype, b.dtype)
    if not tall:
        x, res, rank, s = run_gathered(a, lambda u, v: np.linalg.lstsq(u, v, rcond=rcond), a, b)
    else:
        cols = b if b.ndim == 2 else reshape(b, (m, 1))
        r = tsqr_r(concatenate([a, cols], axis=1, dtype=work))
        rc = np.finfo(work).eps * max(m, n) if rcond is None else rcond
        x, _, rank, s = np.linalg.lstsq(r[:n, :n], r[:n, n:], rcond=rc)
        if rank == n and m > n:
            res = np.sum(np.abs(r[n:, n:]) ** 2, axis=0)
        else:
            res = np.empty((0,), dtype=_real(work))
        if b.ndim == 1:
            x = x[:, 0]
    return (replicated(x.astype(rt, copy=False), grid),
            replicated(np.asarray(res).astype(_real(rt), copy=False), grid), int(rank),
            replicated(s.astype(_real(rt), copy=False), grid))
