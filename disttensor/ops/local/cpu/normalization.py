"""CPU local kernels of group, instance and layer normalization (one rank, no MPI).

Every function takes 2-D ``(R, L)`` views: ``R`` rows of ``L`` values each.  Group norm views a
block ``(n, C, *S)`` as ``(n*G, C/G * prod(S))`` for its statistics (one row per sample and
group) and as ``(n*C, prod(S))`` for its per-(sample, channel) apply; layer norm as
``(prod(leading axes), prod(normalized axes))``.  The callers (``disttensor.ops.group_norm``)
make the views; the functions copy a non-C-contiguous input once.

* :func:`row_moments`: per-row mean and sum of squared deviations (float64) in one read of
  the data: each block of :data:`_BLOCK` values of a row is summed, then its squared
  deviations from its own mean are summed while the block is in cache, and the blocks are
  merged in order by Chan et al.'s rule (no ``E[x^2] - E[x]^2`` cancellation);
* :func:`rows_backward_sums`: per-row ``sum(dy)`` and ``sum(dy * (x - m[r]))`` (the group-norm
  backward's per-(sample, channel) sums), one pass;
* :func:`rows_backward_apply`: ``dx = a[r]*dy + b[r]*(x - m[r]) + d[r]`` (the group-norm
  data gradient with per-(sample, channel) coefficients), one pass;
* :func:`ln_forward_apply`, :func:`ln_backward_sums`, :func:`ln_backward_apply`: layer norm
  with an elementwise affine (``gamma[j]``, ``beta[j]`` per column), one pass each.

Contract as :mod:`.pointwise`: data float32 or float64 (``TypeError`` otherwise), results of
the data's dtype, per-element arithmetic and every reduction in float64, parameters any float
dtype (float64 or, for layer norm's ``gamma``/``beta``, float32 read as is), empty inputs
fine.  The loops are Numba ``parallel=True`` over fixed blocks whose partial results are
combined in a fixed order, so results do not depend on the thread count; the reductions are
compiled with ``fastmath={'reassoc'}`` only, so LLVM vectorizes them (a sequential float64
chain measured ~40x slower) while NaN and inf keep IEEE rules.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ....core import buffer_pool as _pool

__all__ = ["row_moments", "rows_backward_sums", "rows_backward_apply", "ln_forward_apply",
           "ln_backward_sums", "ln_backward_apply"]

_BLOCK = 16384        # values of a row per task
# The reductions may be reassociated (and so vectorized: a sequential float64 chain is ~40x
# slower), nothing else of fastmath: NaN and inf keep IEEE rules.  The order is fixed by the
# compiled code, so results do not depend on the thread count.
_REASSOC = {"reassoc"}
_COL_BLOCK = 2048     # columns per task of layer norm's column sums (kept in L1/L2 over rows)


def _rows(name, a):
    a = np.asarray(a)
    if a.dtype != np.float32 and a.dtype != np.float64:
        raise TypeError(f"{name} must be float32 or float64, got {a.dtype}")
    if a.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (rows, values) view, got shape {a.shape}")
    return np.ascontiguousarray(a)


def _vec(name, v, n):
    v = np.ascontiguousarray(v, dtype=np.float64).reshape(-1)
    if v.shape != (n,):
        raise ValueError(f"{name} must have {n} values, got {v.size}")
    return v


def _params(name, v, n):
    """A per-column parameter as a float32 or float64 vector (its own dtype: a float32
    parameter read as float32 moves half the bytes; arithmetic is float64 anyway)."""
    v = np.asarray(v)
    if v.dtype != np.float32:
        v = v.astype(np.float64)
    return _vec(name, v, n) if v.dtype == np.float64 else _vec32(name, v, n)


def _vec32(name, v, n):
    v = np.ascontiguousarray(v).reshape(-1)
    if v.shape != (n,):
        raise ValueError(f"{name} must have {n} values, got {v.size}")
    return v


def _pair(dy, x):
    dy, x = _rows("dy", dy), _rows("x", x)
    if dy.shape != x.shape:
        raise ValueError(f"dy shape {dy.shape} != x shape {x.shape}")
    return dy, x


# --------------------------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------------------------

@njit(parallel=True, cache=True, fastmath=_REASSOC)
def _moments_kernel(x, block):
    R, L = x.shape
    nb = (L + block - 1) // block
    part = np.zeros((R, nb, 2))
    for t in prange(R * nb):
        r = t // nb
        b = t - r * nb
        s0 = b * block
        s1 = min(L, s0 + block)
        xs = x[r, s0:s1]
        a = 0.0
        for j in range(s1 - s0):
            a += np.float64(xs[j])
        m = a / (s1 - s0)
        q = 0.0
        for j in range(s1 - s0):     # the block again, from cache
            e = np.float64(xs[j]) - m
            q += e * e
        part[r, b, 0] = m
        part[r, b, 1] = q
    mean = np.zeros(R)
    m2 = np.zeros(R)
    for r in prange(R):
        cnt = 0.0
        mu = 0.0
        q = 0.0
        for b in range(nb):
            nbk = np.float64(min(L, (b + 1) * block) - b * block)
            tot = cnt + nbk
            delta = part[r, b, 0] - mu
            mu += delta * (nbk / tot)
            q += part[r, b, 1] + delta * delta * (cnt * nbk / tot)
            cnt = tot
        mean[r] = mu
        m2[r] = q
    return mean, m2


def row_moments(x):
    """Per-row ``(mean, m2)`` of ``x`` ``(R, L)``: float64 ``(R,)`` arrays, ``m2`` the sum of
    squared deviations from the row's mean (zeros for ``L == 0``)."""
    x = _rows("x", x)
    if x.shape[1] == 0:
        return np.zeros(x.shape[0]), np.zeros(x.shape[0])
    return _moments_kernel(x, _BLOCK)


# --------------------------------------------------------------------------------------------
# group norm: the backward sums and the data gradient with per-row coefficients
# --------------------------------------------------------------------------------------------

@njit(parallel=True, cache=True, fastmath=_REASSOC)
def _rows_sums_kernel(dy, x, m, block):
    R, L = x.shape
    nb = (L + block - 1) // block
    part = np.zeros((R, nb, 2))
    for t in prange(R * nb):
        r = t // nb
        k = t - r * nb
        s0 = k * block
        s1 = min(L, s0 + block)
        mr = m[r]
        gs = dy[r, s0:s1]
        xs = x[r, s0:s1]
        a = 0.0
        q = 0.0
        for j in range(s1 - s0):
            g = np.float64(gs[j])
            a += g
            q += g * (np.float64(xs[j]) - mr)
        part[r, k, 0] = a
        part[r, k, 1] = q
    out = np.zeros((2, R))
    for r in prange(R):
        a = 0.0
        q = 0.0
        for k in range(nb):
            a += part[r, k, 0]
            q += part[r, k, 1]
        out[0, r] = a
        out[1, r] = q
    return out


def rows_backward_sums(dy, x, m):
    """Per row ``(sum(dy), sum(dy * (x - m[r])))`` of ``(R, L)`` views: float64 ``(R,)``."""
    dy, x = _pair(dy, x)
    out = _rows_sums_kernel(dy, x, _vec("m", m, x.shape[0]), _BLOCK)
    return out[0], out[1]


@njit(parallel=True, cache=True)
def _rows_bwd_kernel(dy, x, a, m, b, d, dx, block):
    R, L = x.shape
    nb = (L + block - 1) // block
    for t in prange(R * nb):
        r = t // nb
        k = t - r * nb
        s0 = k * block
        s1 = min(L, s0 + block)
        ar = a[r]
        mr = m[r]
        br = b[r]
        dr = d[r]
        gs = dy[r, s0:s1]
        xs = x[r, s0:s1]
        ds = dx[r, s0:s1]
        for j in range(s1 - s0):
            ds[j] = ar * np.float64(gs[j]) + br * (np.float64(xs[j]) - mr) + dr


def rows_backward_apply(dy, x, a, m, b, d):
    """``dx[r, j] = a[r]*dy[r, j] + b[r]*(x[r, j] - m[r]) + d[r]`` on ``(R, L)`` views, in
    float64, returned in ``dy.dtype``; ``a``, ``m``, ``b``, ``d`` have ``R`` values."""
    dy, x = _pair(dy, x)
    R = x.shape[0]
    dx = _pool.empty(dy.shape, dy.dtype)
    _rows_bwd_kernel(dy, x, _vec("a", a, R), _vec("m", m, R), _vec("b", b, R),
                     _vec("d", d, R), dx, _BLOCK)
    return dx


# --------------------------------------------------------------------------------------------
# layer norm: elementwise affine over the normalized (column) axis
# --------------------------------------------------------------------------------------------

@njit(parallel=True, cache=True)
def _ln_fwd_kernel(x, mean, invstd, gamma, beta, y, block):
    R, L = x.shape
    nb = (L + block - 1) // block
    for t in prange(R * nb):
        r = t // nb
        k = t - r * nb
        s0 = k * block
        s1 = min(L, s0 + block)
        mr = mean[r]
        ir = invstd[r]
        xs = x[r, s0:s1]
        ys = y[r, s0:s1]
        ws = gamma[s0:s1]      # (sliced: an index s0 + j would need a wrap-around check)
        bs = beta[s0:s1]
        for j in range(s1 - s0):
            ys[j] = (np.float64(xs[j]) - mr) * ir * np.float64(ws[j]) + np.float64(bs[j])


@njit(parallel=True, cache=True, fastmath=_REASSOC)
def _ln_sums_kernel(dy, x, mean, invstd, gamma, cols, block):
    # one task per column block: its rows' partial (sum dy*g, sum dy*g*xhat) and its columns'
    # (sum dy*xhat, sum dy) over all rows, accumulated in a float64 scratch of the block (in
    # cache from row to row; the first row assigns) and stored once into cols (any float dtype)
    R, L = x.shape
    nb = (L + block - 1) // block
    rows = np.zeros((nb, R, 2))
    for k in prange(nb):
        s0 = k * block
        s1 = min(L, s0 + block)
        n = s1 - s0
        ws = gamma[s0:s1]
        acc = np.zeros((2, n))
        c0 = acc[0]
        c1 = acc[1]
        for r in range(R):
            mr = mean[r]
            ir = invstd[r]
            gs = dy[r, s0:s1]
            xs = x[r, s0:s1]
            sa = 0.0
            sb = 0.0
            for j in range(n):
                g = np.float64(gs[j])
                gg = g * np.float64(ws[j])
                sa += gg
                sb += gg * ((np.float64(xs[j]) - mr) * ir)
            rows[k, r, 0] = sa
            rows[k, r, 1] = sb
            for j in range(n):
                g = np.float64(gs[j])
                c0[j] += g * ((np.float64(xs[j]) - mr) * ir)
                c1[j] += g
        o0 = cols[0, s0:s1]
        o1 = cols[1, s0:s1]
        for j in range(n):
            o0[j] = c0[j]
            o1[j] = c1[j]
    sums = np.zeros((2, R))
    for r in prange(R):
        sa = 0.0
        sb = 0.0
        for k in range(nb):
            sa += rows[k, r, 0]
            sb += rows[k, r, 1]
        sums[0, r] = sa
        sums[1, r] = sb
    return sums


@njit(parallel=True, cache=True)
def _ln_bwd_kernel(dy, x, mean, invstd, gamma, ma, mb, dx, block):
    R, L = x.shape
    nb = (L + block - 1) // block
    for t in prange(R * nb):
        r = t // nb
        k = t - r * nb
        s0 = k * block
        s1 = min(L, s0 + block)
        mr = mean[r]
        ir = invstd[r]
        ar = ma[r]
        br = mb[r]
        gs = dy[r, s0:s1]
        xs = x[r, s0:s1]
        ds = dx[r, s0:s1]
        ws = gamma[s0:s1]
        for j in range(s1 - s0):
            xh = (np.float64(xs[j]) - mr) * ir
            ds[j] = ir * (np.float64(gs[j]) * np.float64(ws[j]) - ar - xh * br)


def ln_forward_apply(x, mean, invstd, gamma, beta):
    """``y[r, j] = (x[r, j] - mean[r]) * invstd[r] * gamma[j] + beta[j]`` (``x.dtype``) on an
    ``(R, L)`` view; ``mean``/``invstd`` have ``R`` values, ``gamma``/``beta`` ``L``."""
    x = _rows("x", x)
    R, L = x.shape
    y = _pool.empty(x.shape, x.dtype)
    _ln_fwd_kernel(x, _vec("mean", mean, R), _vec("invstd", invstd, R),
                   _params("gamma", gamma, L), _params("beta", beta, L), y, _BLOCK)
    return y


def ln_backward_sums(dy, x, mean, invstd, gamma, cols_dtype=np.float64):
    """``(sum_dyg, sum_dyg_xhat, cols)`` of an ``(R, L)`` view: per row ``sum_j dy*gamma[j]``
    and ``sum_j dy*gamma[j]*xhat`` (float64, ``R`` values), and ``cols`` ``(2, L)`` of
    ``cols_dtype`` (float32 or float64; accumulated in float64 either way) with the per-column
    ``sum_r dy*xhat`` (``dgamma``) and ``sum_r dy`` (``dbeta``),
    ``xhat = (x - mean[r])*invstd[r]``."""
    dy, x = _pair(dy, x)
    R, L = x.shape
    cols = np.empty((2, L), dtype=np.float32 if np.dtype(cols_dtype) == np.float32
                    else np.float64)
    sums = _ln_sums_kernel(dy, x, _vec("mean", mean, R), _vec("invstd", invstd, R),
                           _params("gamma", gamma, L), cols, _COL_BLOCK)
    return sums[0], sums[1], cols


def ln_backward_apply(dy, x, mean, invstd, gamma, mean_dyg, mean_dyg_xhat):
    """``dx = invstd[r] * (dy*gamma[j] - mean_dyg[r] - xhat*mean_dyg_xhat[r])`` (``dy.dtype``)
    on an ``(R, L)`` view, ``xhat = (x - mean[r])*invstd[r]``; the two means are over the
    whole (globally reduced) row."""
    dy, x = _pair(dy, x)
    R, L = x.shape
    dx = _pool.empty(dy.shape, dy.dtype)
    _ln_bwd_kernel(dy, x, _vec("mean", mean, R), _vec("invstd", invstd, R),
                   _params("gamma", gamma, L), _vec("mean_dyg", mean_dyg, R),
                   _vec("mean_dyg_xhat", mean_dyg_xhat, R), dx, _BLOCK)
    return dx
