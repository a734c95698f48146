"""CPU local kernels for 3-D max/average pooling and their adjoints (one rank, no MPI).

Layout ``(N, C, D, H, W)``; ``kernel``, ``stride``, ``pad_lo`` and ``pad_hi`` are tuples of 3
ints (``kernel >= 1``, ``stride >= 1``, pads ``>= 0``, padding may be asymmetric and may even
be wider than the kernel).  There is no ``ceil_mode``: the output extent along each axis is

    ``out = max(0, (n + lo + hi - k) // s + 1)``

and window ``o`` covers input cells ``o*s - lo .. o*s - lo + k - 1`` (indices outside
``0 .. n-1`` are padding).  Every window therefore lies inside the padded extent.

``mode='max'``
    Padding acts as ``-inf`` but never wins a tie against a real cell.  ``y`` is the
    maximum over the real cells of the window and ``argmax`` (shape of ``y``; uint8 when the
    window has at most 256 cells, else int32: :func:`argmax_dtype`) the flat window position
    ``kd*kH*kW + kh*kW + kw`` of the *first* maximal real cell in row-major window order.  A NaN counts as maximal: the first NaN of the window wins (PyTorch rule).
    A window with no real cell at all (possible only when a pad is ``>= k``) gives
    ``y = -inf`` and ``argmax = 0``, which names a padding cell, so it receives no gradient.
``mode='avg'``
    Sum over the window (padding counts as 0) divided by ``kD*kH*kW`` if
    ``count_include_pad`` else by the number of real cells in the window; a window with no
    real cell gives 0 in both cases.  ``argmax`` is ``None``.

:func:`pool_backward` is the exact adjoint of the forward map (for max: of the linear map
"pick the argmax cell", with the recorded ``argmax``).  With non-overlapping windows
(``stride >= kernel`` on every axis) it scatters each output's gradient into a zeroed ``dx``
(every input cell is in at most one window, so tasks write disjoint cells).  With
overlapping windows it is a *gather*: every input cell sums, in float64, the contributions
of the (at most ``prod(ceil(k/s))``) windows that contain it, so each ``dx`` cell is written
by exactly one thread; no atomics and no scratch buffers either way.

Inputs must be float32 or float64 and keep their dtype; average sums accumulate in float64.
Max pooling over whole 2x2x2 windows at stride 2 (no window reaching into padding: what CNNs
pool with) runs a kernel with the eight cells spelled out, which vectorises over the outputs
of a row (9x the general kernel's speed on a 32^3 block).
Forward kernels and the scatter parallelise over ``N*C*OD`` output slabs, the gather over
``N*C*D`` input slabs (Numba ``prange``; the thread count is Numba's, see
``NUMBA_NUM_THREADS`` / ``numba.set_num_threads``, which matters when several MPI ranks
share a node).  ``x`` of
any strides (a halo buffer's interior view, say) is read in place; ``dy``/``argmax`` that are
not C-contiguous are copied (they are output-sized); outputs are new C-contiguous arrays.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ....core import buffer_pool as _pool

__all__ = ["pool_forward", "pool_backward", "pool_output_shape", "argmax_dtype"]

_MODES = ("max", "avg")


# --------------------------------------------------------------------------------------------
# argument handling
# --------------------------------------------------------------------------------------------

def _triple(name, v, minimum):
    try:
        t = tuple(int(a) for a in v)
    except TypeError:
        raise TypeError(f"{name} must be a tuple of 3 ints, got {v!r}") from None
    if len(t) != 3:
        raise ValueError(f"{name} must have 3 entries (D, H, W), got {v!r}")
    if any(a < minimum for a in t):
        raise ValueError(f"{name} entries must be >= {minimum}, got {v!r}")
    return t


def argmax_dtype(kernel) -> np.dtype:
    """The dtype of max pooling's ``argmax`` for a window of ``kernel`` cells per axis:
    ``uint8`` when the window has at most 256 cells (every ``2^3`` or ``3^3`` window: 4x less
    saved state for backward than int32), else ``int32``."""
    return np.dtype(np.uint8 if math.prod(int(k) for k in kernel) <= 256 else np.int32)


def _check_mode(mode):
    if mode not in _MODES:
        raise ValueError(f"pooling mode must be one of {_MODES}, got {mode!r}")


def _check_float(name, a):
    if a.dtype != np.float32 and a.dtype != np.float64:
        raise TypeError(f"{name} must be float32 or float64, got {a.dtype}")


def pool_output_shape(in_spatial, kernel, stride, pad_lo, pad_hi):
    """Spatial output extent ``max(0, (n + lo + hi - k) // s + 1)`` per axis (a tuple)."""
    return tuple(max(0, (n + lo + hi - k) // s + 1)
                 for n, k, s, lo, hi in zip(in_spatial, kernel, stride, pad_lo, pad_hi))


def _args(kernel, stride, pad_lo, pad_hi):
    return (_triple("kernel", kernel, 1), _triple("stride", stride, 1),
            _triple("pad_lo", pad_lo, 0), _triple("pad_hi", pad_hi, 0))


def _gather_ranges(n, out, k, s, lo):
    """For input index i along one axis: the windows o_lo[i] .. o_hi[i] (inclusive) that
    contain it (empty when o_lo > o_hi)."""
    i = np.arange(n, dtype=np.int64)
    o_lo = np.maximum(0, -((k - 1 - i - lo) // s))       # ceil((i + lo - k + 1) / s)
    o_hi = np.minimum(out - 1, (i + lo) // s)
    return o_lo, o_hi


def _real_counts(n, out, k, s, lo):
    """Number of real (non-padding) cells of each window along one axis."""
    o = np.arange(out, dtype=np.int64)
    start = o * s - lo
    return np.maximum(0, np.minimum(start + k, n) - np.maximum(start, 0)).astype(np.float64)


# --------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------

@njit(cache=True)
def _ow_range(kw, lW, sW, W, OW):
    """Outputs ow whose window cell kw is real: 0 <= ow*sW + kw - lW < W."""
    off = kw - lW
    o0 = (sW - 1 - off) // sW if off < 0 else 0
    o1 = min(OW, (W - 1 - off) // sW + 1) if W - 1 - off >= 0 else 0
    return off, o0, o1


# The max forward kernel visits each window row-major with the running maximum and its index
# in registers (one output at a time); the average forward sweeps each window row-major: for
# every (kd, kh, kw) offset, the outputs ow of one (od, oh) row are updated together (a
# contiguous or strided row of x), which lets the inner loop vectorise.  One task = one
# (n, c, od) slab of outputs.

@njit(parallel=True, cache=True)
def _max_fwd(x, y, am, kD, kH, kW, sD, sH, sW, lD, lH, lW):
    N, C, D, H, W = x.shape
    OD, OH, OW = y.shape[2], y.shape[3], y.shape[4]
    for t in prange(N * C * OD):
        p = t // OD
        od = t - p * OD
        n = p // C
        c = p - n * C
        d0 = od * sD - lD
        kd_lo = max(0, -d0)
        kd_hi = min(kD, D - d0)
        ninf = y.dtype.type(-np.inf)
        for oh in range(OH):
            h0 = oh * sH - lH
            kh_lo = max(0, -h0)
            kh_hi = min(kH, H - h0)
            for ow in range(OW):
                w0 = ow * sW - lW
                kw_lo = max(0, -w0)
                kw_hi = min(kW, W - w0)
                best = ninf
                bi = -1
                for kd in range(kd_lo, kd_hi):
                    for kh in range(kh_lo, kh_hi):
                        base = (kd * kH + kh) * kW
                        for kw in range(kw_lo, kw_hi):
                            v = x[n, c, d0 + kd, h0 + kh, w0 + kw]
                            # the first real cell; then strictly larger, or the first NaN
                            # (nothing replaces a NaN)
                            take = (bi < 0) | ((best == best) & (not (v <= best)))
                            best = v if take else best
                            bi = base + kw if take else bi
                y[n, c, od, oh, ow] = best
                am[n, c, od, oh, ow] = max(bi, 0)   # all-padding window: -inf at position 0


@njit(parallel=True, cache=True)
def _max_fwd_2(x, y, am):
    """:func:`_max_fwd` for 2x2x2 windows at stride 2 that all lie inside ``x`` (no
    padding cell in any window; what CNNs pool with): the eight cells in window order, with
    fixed indices, so the loop over ``ow`` vectorises."""
    N, C = x.shape[0], x.shape[1]
    OD, OH, OW = y.shape[2], y.shape[3], y.shape[4]
    for t in prange(N * C * OD):
        p = t // OD
        od = t - p * OD
        n = p // C
        c = p - n * C
        for oh in range(OH):
            r0 = x[n, c, 2 * od, 2 * oh]
            r1 = x[n, c, 2 * od, 2 * oh + 1]
            r2 = x[n, c, 2 * od + 1, 2 * oh]
            r3 = x[n, c, 2 * od + 1, 2 * oh + 1]
            yr = y[n, c, od, oh]
            ar = am[n, c, od, oh]
            for ow in range(OW):
                w = 2 * ow
                best = r0[w]
                bi = 0
                # strictly larger, or the first NaN (nothing replaces a NaN)
                v = r0[w + 1]
                take = (best == best) & (not (v <= best))
                best = v if take else best
                bi = 1 if take else bi
                v = r1[w]
                take = (best == best) & (not (v <= best))
                best = v if take else best
                bi = 2 if take else bi
                v = r1[w + 1]
                take = (best == best) & (not (v <= best))
                best = v if take else best
                bi = 3 if take else bi
                v = r2[w]
                take = (best == best) & (not (v <= best))
                best = v if take else best
                bi = 4 if take else bi
                v = r2[w + 1]
                take = (best == best) & (not (v <= best))
                best = v if take else best
                bi = 5 if take else bi
                v = r3[w]
                take = (best == best) & (not (v <= best))
                best = v if take else best
                bi = 6 if take else bi
                v = r3[w + 1]
                take = (best == best) & (not (v <= best))
                best = v if take else best
                bi = 7 if take else bi
                yr[ow] = best
                ar[ow] = bi


@njit(parallel=True, cache=True)
def _avg_fwd(x, y, kD, kH, kW, sD, sH, sW, lD, lH, lW, cnt_w, include_pad):
    N, C, D, H, W = x.shape
    OD, OH, OW = y.shape[2], y.shape[3], y.shape[4]
    ksize = kD * kH * kW
    for t in prange(N * C * OD):
        p = t // OD
        od = t - p * OD
        n = p // C
        c = p - n * C
        xp = x[n, c]
        d0 = od * sD - lD
        kd_lo = max(0, -d0)
        kd_hi = min(kD, D - d0)
        acc = np.empty(OW)
        for oh in range(OH):
            h0 = oh * sH - lH
            kh_lo = max(0, -h0)
            kh_hi = min(kH, H - h0)
            acc[:] = 0.0
            for kd in range(kd_lo, kd_hi):
                for kh in range(kh_lo, kh_hi):
                    row = xp[d0 + kd, h0 + kh]
                    for kw in range(kW):
                        off, o0, o1 = _ow_range(kw, lW, sW, W, OW)
                        for ow in range(o0, o1):
                            acc[ow] += row[ow * sW + off]
            cdh = max(0, kd_hi - kd_lo) * max(0, kh_hi - kh_lo)
            yr = y[n, c, od, oh]
            for ow in range(OW):
                cnt = cdh * cnt_w[ow]
                if cnt == 0:
                    yr[ow] = 0.0
                elif include_pad:
                    yr[ow] = acc[ow] / ksize
                else:
                    yr[ow] = acc[ow] / cnt


# Backward, non-overlapping windows (stride >= kernel on every axis): every input cell is in
# at most one window, so a scatter over (n, c, od) output slabs writes disjoint cells.  Each
# task first zeroes its slab's input rows d0 .. d0 + sD - 1 (disjoint too, and holding every
# cell its windows write), so dx needs no separate zero pass: only the rows past the last
# slab are zeroed by the caller (:func:`pool_backward`).

@njit(inline="always")
def _zero_slab(dx, n, c, d0, sD):
    D, H, W = dx.shape[2], dx.shape[3], dx.shape[4]
    for d in range(max(0, d0), min(D, d0 + sD)):
        for h in range(H):
            for w in range(W):
                dx[n, c, d, h, w] = 0.0


@njit(parallel=True, cache=True)
def _max_bwd_scatter(dy, am, dx, kD, kH, kW, sD, sH, sW, lD, lH, lW):
    N, C, D, H, W = dx.shape
    OD, OH, OW = dy.shape[2], dy.shape[3], dy.shape[4]
    khw = kH * kW
    kvol = kD * khw
    for t in prange(N * C * OD):
        p = t // OD
        od = t - p * OD
        n = p // C
        c = p - n * C
        d0 = od * sD - lD
        _zero_slab(dx, n, c, d0, sD)
        for oh in range(OH):
            h0 = oh * sH - lH
            gr = dy[n, c, od, oh]
            ar = am[n, c, od, oh]
            for ow in range(OW):
                a = np.int64(ar[ow])          # uint8 or int32 argmax
                if a < 0 or a >= kvol:
                    continue
                kd = a // khw
                r = a - kd * khw
                kh = r // kW
                kw = r - kh * kW
                d = d0 + kd
                h = h0 + kh
                w = ow * sW - lW + kw
                if d >= 0 and d < D and h >= 0 and h < H and w >= 0 and w < W:
                    dx[n, c, d, h, w] += gr[ow]


@njit(parallel=True, cache=True)
def _max_bwd_2(dy, am, dx):
    """:func:`_max_bwd_scatter` for the windows of :func:`_max_fwd_2` (2x2x2 at stride 2, all
    inside ``dx``): every cell of a slab's two rows written once, ``0 + dy`` at the argmax
    and zero elsewhere (the values of zeroing then adding), so the loop over ``ow``
    vectorises."""
    N, C, D, H, W = dx.shape
    OD, OH, OW = dy.shape[2], dy.shape[3], dy.shape[4]
    for t in prange(N * C * OD):
        p = t // OD
        od = t - p * OD
        n = p // C
        c = p - n * C
        for j in range(2):
            for h in range(H):
                row = dx[n, c, 2 * od + j, h]
                if h >= 2 * OH:
                    row[:] = 0.0
                    continue
                gr = dy[n, c, od, h >> 1]
                ar = am[n, c, od, h >> 1]
                b = j * 4 + (h & 1) * 2
                for ow in range(OW):
                    a = np.int64(ar[ow])
                    g = gr[ow] + 0.0          # (0 + dy, as the scatter into zeros adds)
                    row[2 * ow] = g if a == b else 0.0
                    row[2 * ow + 1] = g if a == b + 1 else 0.0
                for w in range(2 * OW, W):
                    row[w] = 0.0


@njit(parallel=True, cache=True)
def _avg_bwd_scatter(dy, dx, kD, kH, kW, sD, sH, sW, lD, lH, lW, inv_d, inv_h, inv_w):
    N, C, D, H, W = dx.shape
    OD, OH, OW = dy.shape[2], dy.shape[3], dy.shape[4]
    for t in prange(N * C * OD):
        p = t // OD
        od = t - p * OD
        n = p // C
        c = p - n * C
        d0 = od * sD - lD
        _zero_slab(dx, n, c, d0, sD)
        for kd in range(max(0, -d0), min(kD, D - d0)):
            for oh in range(OH):
                h0 = oh * sH - lH
                f = inv_d[od] * inv_h[oh]
                gr = dy[n, c, od, oh]
                for kh in range(max(0, -h0), min(kH, H - h0)):
                    row = dx[n, c, d0 + kd, h0 + kh]
                    for kw in range(kW):
                        off, o0, o1 = _ow_range(kw, lW, sW, W, OW)
                        for ow in range(o0, o1):
                            row[ow * sW + off] = gr[ow] * (f * inv_w[ow])


# Backward, overlapping windows: a gather.  Input cell i along an axis is in windows
# o_lo[i] .. o_hi[i]; every task owns an (n, c, d) slab of dx, sums in float64, no races.

@njit(parallel=True, cache=True)
def _max_bwd(dy, am, dx, kH, kW, sD, sH, sW, lD, lH, lW,
             dlo, dhi, hlo, hhi, wlo, whi):
    N, C, D, H, W = dx.shape
    for t in prange(N * C * D):
        p = t // D
        d = t - p * D
        n = p // C
        c = p - n * C
        for h in range(H):
            for w in range(W):
                acc = 0.0
                for od in range(dlo[d], dhi[d] + 1):
                    pd = d - (od * sD - lD)
                    for oh in range(hlo[h], hhi[h] + 1):
                        pdh = (pd * kH + h - (oh * sH - lH)) * kW
                        for ow in range(wlo[w], whi[w] + 1):
                            if am[n, c, od, oh, ow] == pdh + w - (ow * sW - lW):
                                acc += dy[n, c, od, oh, ow]
                dx[n, c, d, h, w] = acc


@njit(parallel=True, cache=True)
def _avg_bwd(dy, dx, inv_d, inv_h, inv_w, dlo, dhi, hlo, hhi, wlo, whi):
    N, C, D, H, W = dx.shape
    for t in prange(N * C * D):
        p = t // D
        d = t - p * D
        n = p // C
        c = p - n * C
        for h in range(H):
            for w in range(W):
                acc = 0.0
                for od in range(dlo[d], dhi[d] + 1):
                    for oh in range(hlo[h], hhi[h] + 1):
                        f = inv_d[od] * inv_h[oh]
                        for ow in range(wlo[w], whi[w] + 1):
                            acc += dy[n, c, od, oh, ow] * (f * inv_w[ow])
                dx[n, c, d, h, w] = acc


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------

def pool_forward(x, mode, kernel, stride, pad_lo, pad_hi, count_include_pad=True):
    """3-D pooling of ``x`` (N, C, D, H, W), float32/float64 -> ``(y, argmax)``.

    ``y`` has ``x``'s dtype and shape ``(N, C, *pool_output_shape(...))``.  ``mode='max'``:
    padding acts as ``-inf`` (a real cell wins ties with it); ``argmax`` (:func:`argmax_dtype`:
    uint8 for windows of at most 256 cells, else int32) of ``y``'s shape with the flat window position ``kd*kH*kW + kh*kW + kw`` of the first maximal cell
    in row-major window order, NaN counting as maximal (first NaN wins); an all-padding
    window gives ``-inf`` and position 0.  ``mode='avg'``: window sum (float64 accumulation,
    padding = 0) over ``kD*kH*kW`` (``count_include_pad``) or over the number of real cells
    (otherwise), 0 for a window without real cells; ``argmax`` is ``None``.
    """
    _check_mode(mode)
    x = np.asarray(x)
    if x.ndim != 5:
        raise ValueError(f"pool_forward expects x of shape (N, C, D, H, W), got {x.shape}")
    _check_float("x", x)
    (kD, kH, kW), (sD, sH, sW), (lD, lH, lW), hi = _args(kernel, stride, pad_lo, pad_hi)
    out = pool_output_shape(x.shape[2:], (kD, kH, kW), (sD, sH, sW), (lD, lH, lW), hi)
    y = _pool.empty(x.shape[:2] + out, x.dtype)     # (recycled: no allocation when steady)
    if mode == "max":
        am = _pool.empty(y.shape, argmax_dtype((kD, kH, kW)))
        if y.size == 0:
            return y, am
        if ((kD, kH, kW) == (2, 2, 2) and (sD, sH, sW) == (2, 2, 2) and (lD, lH, lW) == (0, 0, 0)
                and all(2 * o <= n for o, n in zip(out, x.shape[2:]))):
            _max_fwd_2(x, y, am)        # whole 2x2x2 windows: the common case, vectorised
        else:
            _max_fwd(x, y, am, kD, kH, kW, sD, sH, sW, lD, lH, lW)
        return y, am
    if y.size:
        cnt_w = _real_counts(x.shape[4], out[2], kW, sW, lW).astype(np.int64)
        _avg_fwd(x, y, kD, kH, kW, sD, sH, sW, lD, lH, lW, cnt_w, bool(count_include_pad))
    return y, None


def _inverse_counts(in_spatial, out, k, s, lo, count_include_pad) -> list:
    """Average pooling's divisor per output index along each axis, as three factors."""
    if count_include_pad:
        return [np.full(out[0], 1.0 / (k[0] * k[1] * k[2])), np.ones(out[1]), np.ones(out[2])]
    inv = []
    for n, o, kk, ss, ll in zip(in_spatial, out, k, s, lo):
        cnt = _real_counts(n, o, kk, ss, ll)
        inv.append(np.divide(1.0, cnt, out=np.zeros_like(cnt), where=cnt > 0))
    return inv


def pool_backward(dy, argmax, mode, in_spatial, kernel, stride, pad_lo, pad_hi,
                  count_include_pad=True):
    """Adjoint of :func:`pool_forward`: ``dx`` of shape ``(N, C, *in_spatial)``, ``dy``'s dtype.

    ``dy`` (N, C, OD, OH, OW) must have the forward output shape for ``in_spatial``.  max:
    ``dy`` goes to the cell named by ``argmax`` (as returned by the forward; dropped when
    that cell is padding); avg: each window's ``dy / divisor`` goes to every real cell of
    the window (same divisor rule as the forward; ``argmax`` is ignored and may be None).
    Overlapping windows add (float64 accumulation per input cell).
    """
    _check_mode(mode)
    dy = np.ascontiguousarray(dy)          # output-sized; C order keeps one compiled variant
    if dy.ndim != 5:
        raise ValueError(f"pool_backward expects dy of shape (N, C, OD, OH, OW), got {dy.shape}")
    _check_float("dy", dy)
    in_spatial = tuple(int(n) for n in in_spatial)
    if len(in_spatial) != 3 or any(n < 0 for n in in_spatial):
        raise ValueError(f"in_spatial must be 3 non-negative ints, got {in_spatial!r}")
    k, s, lo, hi = _args(kernel, stride, pad_lo, pad_hi)
    out = pool_output_shape(in_spatial, k, s, lo, hi)
    if tuple(dy.shape[2:]) != out:
        raise ValueError(f"dy spatial shape {tuple(dy.shape[2:])} does not match the pooling "
                         f"output shape {out} for input {in_spatial}")
    if mode == "max":
        if argmax is None:
            raise ValueError("max pooling backward needs the argmax returned by pool_forward")
        argmax = np.ascontiguousarray(argmax)
        if argmax.shape != dy.shape:
            raise ValueError(f"argmax shape {argmax.shape} != dy shape {dy.shape}")
        if not np.issubdtype(argmax.dtype, np.integer):
            raise TypeError(f"argmax must be an integer array, got {argmax.dtype}")
    shape = dy.shape[:2] + in_spatial
    overlapping = any(ss < kk for ss, kk in zip(s, k))
    dx = _pool.empty(shape, dy.dtype)          # (recycled: no allocation when steady)
    if dy.size == 0:                              # no windows
        dx.fill(0)
        return dx
    if dx.size == 0:
        return dx
    inv = None if mode == "max" else _inverse_counts(in_spatial, out, k, s, lo,
                                                     count_include_pad)
    if not overlapping:
        # scatter: every input cell is in at most one window; the kernels zero their slabs
        dx[:, :, max(0, out[0] * s[0] - lo[0]):].fill(0)   # rows past the last slab
        if mode == "max" and k == s == (2, 2, 2) and lo == (0, 0, 0) \
                and all(2 * o <= n for o, n in zip(out, in_spatial)):
            _max_bwd_2(dy, argmax, dx)     # the windows of _max_fwd_2, vectorised
        elif mode == "max":
            _max_bwd_scatter(dy, argmax, dx, k[0], k[1], k[2], s[0], s[1], s[2],
                             lo[0], lo[1], lo[2])
        else:
            _avg_bwd_scatter(dy, dx, k[0], k[1], k[2], s[0], s[1], s[2], lo[0], lo[1], lo[2],
                             inv[0], inv[1], inv[2])
        return dx
    (dlo, dhi), (hlo, hhi), (wlo, whi) = [_gather_ranges(n, o, kk, ss, ll)
                                          for n, o, kk, ss, ll in zip(in_spatial, out, k, s, lo)]
    if mode == "max":
        _max_bwd(dy, argmax, dx, k[1], k[2], s[0], s[1], s[2], lo[0], lo[1], lo[2],
                 dlo, dhi, hlo, hhi, wlo, whi)
    else:
        _avg_bwd(dy, dx, inv[0], inv[1], inv[2], dlo, dhi, hlo, hhi, wlo, whi)
    return dx
