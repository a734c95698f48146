"""TSQR and the decompositions built on it: ``qr``, ``svd``, ``svdvals``.

Collective over ``a``'s grid; the ranks agree ``a``'s metadata and the options first, and bad
input (fewer than two dimensions, a stack for ``qr``, an unknown ``mode``) raises NumPy's
exception on every rank.

TSQR
----
``qr(a)`` for a 2-D ``a`` (any shape; tall-skinny is the fast case): ``a`` is brought to a
layout with whole rows (its own row split if its columns are whole, else rows split over all
ranks), each rank factors its block ``A_i = Q_i R_i``, the ``R_i`` (at most ``n x n`` each) are
all-gathered over the row sub-communicator and stacked, and the stack is factored
``[R_0; R_1; ...] = Q_s R``; this rank's ``Q = Q_i Q_s[rows of i]``.  ``R`` (``min(m,n) x n``) is
replicated; ``Q`` (``m x min(m,n)``) is split like the row layout used.  One all-gather of
``P n^2`` elements; flops ``2 m n^2 / P + 2 P n^3`` per rank.  Backward stable:
``|A - QR| <= c m n eps |A|``, ``|Q^H Q - I| <= c m n eps``.  ``R`` equals NumPy's up to the
signs of its rows.

SVD
---
``svd(a, full_matrices=False)``: TSQR, then the SVD of ``R`` on every rank, ``U = Q U_R``
(``U`` split like ``Q``, ``S`` and ``Vh`` replicated); a wide ``a`` is done as ``svd(a^H)``.
``full_matrices=True`` (NumPy's default), ``hermitian=True`` and stacks use the gather path
(:mod:`.gather_path`, guarded by ``DISTTENSOR_GATHER_LIMIT``).  :func:`singular_values` (also
used by the norms, ``matrix_rank`` and ``pinv``) is the same without ``U`` and ``Vh``.
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray
from ..core.backend import to_host
from ..core.distribution import Distribution
from ..core.entry import agreed, collective_entry
from .contractions import matrix_transpose
from .gather_path import check_gather_size, run_gathered
from .operands import (batch_layout, block_of, check_distarray, check_matrix, distribution_on,
                       flat_grid, laid_out, replicated, split_sizes_of)

__all__ = ["qr", "svd", "svdvals", "singular_values", "check_svd_size", "tsqr_r"]


# -- TSQR --------------------------------------------------------------------------------------
def _row_layout(a: DistArray) -> DistArray:
    """``a`` (2-D) with whole rows: as it is when its columns are whole, else rows split over
    all ranks."""
    if a.split[1] is None:
        return a
    f = flat_grid(a.grid)
    return laid_out(a, f, distribution_on(a.shape, f, (0, None)))


def _lapack(xp):
    return xp.linalg if xp is not np else np.linalg


_R_CHUNK = 4096  # rows per local QR when only R is wanted (a flat TSQR tree on the rank)


def _local_r(loc, xp):
    """``R`` of a local block without forming ``Q``: a tall block in chunks of ``_R_CHUNK``
    rows whose ``R`` factors are stacked and factored again (TSQR within the rank; each
    chunk stays in cache: ~5x faster than one LAPACK ``geqrf`` of 200000 x 10 here)."""
    lapack = _lapack(xp)
    m, n = loc.shape
    rows = max(_R_CHUNK, n)
    if xp is not np or m <= 2 * rows:
        return lapack.qr(loc, mode="r")
    rs = [lapack.qr(loc[i:i + rows], mode="r") for i in range(0, m, rows)]
    return lapack.qr(np.concatenate(rs, axis=0), mode="r")


def _tsqr(a: DistArray, want_q: bool):
    """TSQR of a 2-D DistArray: (Q DistArray or None, R replicated host array)."""
    x = _row_layout(a)
    grid, g = x.grid, x.split[0]
    xp = x.xp
    loc = x.local
    if want_q:
        q1, r1 = _lapack(xp).qr(loc)  # q1 (m_i, min(m_i, n)), r1 (min(m_i, n), n)
    else:
        r1 = _local_r(loc, xp)
    comm = grid.sub_comm([g]) if g is not None and grid.dims[g] > 1 else None
    rh = to_host(r1)
    rs = comm.allgather(rh) if comm is not None else [rh]
    q2, r = np.linalg.qr(np.concatenate(rs, axis=0))
    if not want_q:
        return None, r
    my = comm.rank if comm is not None else 0
    start = sum(t.shape[0] for t in rs[:my])
    piece = q2[start:start + rh.shape[0]]
    q = q1 @ (piece if xp is np else xp.asarray(piece))
    m, n = a.shape
    d = x.distribution
    qd = Distribution((m, min(m, n)), d.grid_dims, (g, None), (split_sizes_of(x, 0), None))
    return DistArray(xp.ascontiguousarray(q), qd, grid), r


def tsqr_r(a: DistArray) -> np.ndarray:
    """The ``R`` factor of a 2-D DistArray by TSQR (collective): a NumPy array
    (``min(m, n) x n``), the same on every rank (``lstsq`` factors ``[a | b]`` with it)."""
    return _tsqr(a, False)[1]


@collective_entry
def qr(a: DistArray, mode: str = "reduced"):
    """TSQR (collective; see the module doc).  ``mode='reduced'``: ``(Q, R)`` with ``Q`` (m x
    min(m,n)) split along rows, ``R`` (min(m,n) x n) replicated; ``mode='r'``: ``R`` only.
    2-D only (``LinAlgError`` for fewer dimensions, ``ValueError`` for stacks)."""
    check_distarray(a, "qr")
    with agreed(a.grid.cart, "qr", a=a, mode=mode):
        if mode not in ("reduced", "r"):
            raise ValueError(f"qr: mode must be 'reduced' or 'r' for DistArrays, got {mode!r}")
        check_matrix(a, "qr")
        if a.ndim > 2:
            raise ValueError("qr: stacks of matrices are not supported for DistArrays")
    q, r = _tsqr(a, mode == "reduced")
    R = replicated(r, a.grid)
    return R if mode == "r" else (q, R)



# -- SVD ---------------------------------------------------------------------------------------
def check_svd_size(x: DistArray, call: str) -> None:
    """Raise on every rank (inside ``agreed``) when the singular values of ``x`` would take
    the gather path (a stack) beyond ``DISTTENSOR_GATHER_LIMIT``."""
    if x.ndim > 2:
        check_gather_size(call, x)


def singular_values(x: DistArray) -> DistArray:
    """Singular values over the last two axes: 2-D by TSQR (replicated 1-D result), stacks by
    the gather path (batch axes split like ``x``, last axis whole)."""
    if x.ndim == 2:
        m, n = x.shape
        y = x if m >= n else np.conj(matrix_transpose(x)) if x.dtype.kind == "c" \
            else matrix_transpose(x)
        _, r = _tsqr(y, False)
        s = np.linalg.svd(r, compute_uv=False)
        return replicated(s, x.grid)
    s = run_gathered(x, lambda m: np.linalg.svd(m, compute_uv=False), x)
    return block_of(s, x.grid, batch_layout(x, s.shape), x.xp)


@collective_entry
def svdvals(x: DistArray) -> DistArray:
    """Singular values (descending) over the last two axes (collective): 2-D by TSQR,
    stacks by the gather path (guarded)."""
    check_distarray(x, "svdvals")
    with agreed(x.grid.cart, "svdvals", x=x):
        check_matrix(x, "svdvals")
        check_svd_size(x, "svdvals")
    return singular_values(x)


@collective_entry
def svd(a: DistArray, full_matrices: bool = True, compute_uv: bool = True,
        hermitian: bool = False):
    """``numpy.linalg.svd`` (collective).  ``full_matrices=False`` on a 2-D ``a``: TSQR + SVD of
    R (``U`` split along rows like the TSQR ``Q``, ``S`` and ``Vh`` replicated; a wide ``a`` via
    ``a^H``: ``U`` and ``S`` replicated, ``Vh`` split along columns).  ``full_matrices=True``
    (NumPy's default) and stacks: gather path (guarded), results laid out with the batch axes
    like ``a`` and the matrix axes whole.  ``compute_uv=False``: :func:`svdvals`."""
    check_distarray(a, "svd")
    with agreed(a.grid.cart, "svd", a=a, full_matrices=bool(full_matrices),
                compute_uv=bool(compute_uv), hermitian=bool(hermitian)):
        check_matrix(a, "svd")
        gather = a.ndim > 2 or (full_matrices and compute_uv) or hermitian
        if gather:
            check_gather_size("svd", a)
    if not compute_uv and not hermitian:
        return singular_values(a)
    if not gather:
        m, n = a.shape
        if m >= n:
            q, r = _tsqr(a, True)
            ur, s, vh = np.linalg.svd(r, full_matrices=False)
            xp = q.xp
            u = DistArray(q.local @ (ur if xp is np else xp.asarray(ur)),
                          q.distribution, q.grid)
            return u, replicated(s, a.grid), replicated(vh, a.grid)
        at = matrix_transpose(a)
        if a.dtype.kind == "c":
            at = np.conj(at)
        q, r = _tsqr(at, True)
        ur, s, vh = np.linalg.svd(r, full_matrices=False)
        xp = q.xp
        w = q.local @ (ur if xp is np else xp.asarray(ur))  # rows of a^H = columns of a
        wt = xp.ascontiguousarray(w.conj().T)
        d = q.distribution
        vd = Distribution((s.shape[0], n), d.grid_dims, (None, d.split[0]),
                          (None, d.split_sizes[0]))
        return (replicated(np.ascontiguousarray(vh.conj().T), a.grid), replicated(s, a.grid),
                DistArray(wt, vd, q.grid))
    res = run_gathered(a, lambda m: np.linalg.svd(m, full_matrices=full_matrices,
                                                  compute_uv=compute_uv, hermitian=hermitian), a)
    res = res if compute_uv else (res,)
    outs = [block_of(r, a.grid, batch_layout(a, r.shape), a.xp) for r in res]
    return tuple(outs) if compute_uv else outs[0]
