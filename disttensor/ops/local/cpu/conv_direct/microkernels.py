"""The register-blocked micro-kernels of the gathered GEMM (the scheme:
:mod:`disttensor.ops.local.cpu.conv_direct`)::

    out[cob, r, :] = sum_j  xf[row_off[r] + red_off[j]] * a[cob, j, :]

A micro-tile is ``R`` rows x ``C = V * lanes`` channels held in ``R * V`` vector registers;
per reduction step it loads ``V`` vectors of ``a``, broadcasts ``R`` scalars of ``xf`` and
issues ``R * V`` fused multiply-adds.  Two variants, each fully unrolled by hand (Numba has no
register arrays, so every accumulator is a named local): ``4x4`` (R=4, V=4) and ``8x2`` (R=8,
V=2), 16 accumulators each.  They stay in one module, spelled out side by side, because they
are one idea at two tile shapes; a generic version would not keep its accumulators in
registers.

:func:`run_4x4` / :func:`run_8x2` split the tiles into ``n_chunks`` contiguous ranges, one
per Numba thread (``parallel=True``), so no two threads write one output; arguments are the
flat operand ``xf``, the packed ``a`` (``(n_cob, J, C)`` flattened), the blocked ``out``
(``(n_cob, R*n_rt, C)`` flattened), the int64 offset tables, the row-tile count ``n_rt``, the
tile and chunk counts, and an optional ``dst`` (``(N, M, Q)``, empty for none) that finished
super-blocks are unpacked into while in cache.
"""
from __future__ import annotations

from numba import njit, prange

from .simd import item_unchecked, vbcast, vfma, vlanes, vload, vstore, vzero

__all__ = ["run_4x4", "run_8x2"]

_JB = 128  # reduction steps per block (A block: _JB * C * itemsize bytes, 32 KiB at C=64 f32)
_TB = 128  # tiles per super-block (accumulators: 128 tiles * 16 vectors = 128 KiB, in L2)


@njit(cache=True, inline="always")
def _window(lim, rt, period):
    """``(lo, hi)``: row tile ``rt``'s tap window within each ``period`` reduction steps
    (``lim`` holds ``[lo, hi]`` per row tile; empty: every step, ``(0, period)``)."""
    if lim.size == 0:
        return 0, period
    return lim[2 * rt], lim[2 * rt + 1]


@njit(cache=True, inline="always")
def _run(js, j1, lo, hi, period):
    """``(begin, end, next)``: the reduction steps ``[begin, end)`` of ``[js, j1)`` that lie
    in the window ``[lo, hi)`` of ``js``'s period (possibly none: ``begin >= end``) and
    where the next run may start; a full window is one run ``[js, j1)``."""
    if lo == 0 and hi == period:
        return js, j1, j1
    base = js - js % period
    return max(js, base + lo), min(j1, base + hi), base + period


@njit(cache=True)
def _unpack_tiles(out, dst, n_rt, rows, c, t0, t1, n_real):
    """``dst[n, m, q] = out[m // C, n*Q + q, m % C]`` for the rows of tiles ``[t0, t1)``
    (rows ``>= n_real`` and channels ``>= dst.shape[1]`` are padding and skipped)."""
    m_n, q_n = dst.shape[1], dst.shape[2]
    rp = rows * n_rt
    for t in range(t0, t1):
        cob = t // n_rt
        r0 = (t - cob * n_rt) * rows
        ob = (cob * rp + r0) * c
        c_hi = min(c, m_n - cob * c)
        for rr in range(min(rows, n_real - r0)):
            r = r0 + rr
            n = r // q_n
            q = r - n * q_n
            for cc in range(c_hi):
                dst[n, cob * c + cc, q] = out[ob + rr * c + cc]


@njit(cache=True, fastmath=True)
def _tiles_4x4(xf, a, out, row_off, red_off, n_rt, t0, t1, dst, n_real, period, lim):
    """Tiles ``[t0, t1)`` (tile ``t``: channel block ``t // n_rt``, rows ``4*(t % n_rt)`` +
    0..3) of ``out[cob, r, :] = sum_j xf[row_off[r] + red_off[j]] * a[cob, j, :]`` (flat
    arrays; ``out`` is ``(n_cob, 4*n_rt, 4*lanes)``, ``a`` is ``(n_cob, J, 4*lanes)``).
    Loop order: super-blocks of ``_TB`` tiles, reduction blocks of ``_JB`` steps, tiles; the
    accumulators of a tile live in registers for a reduction block.  Where ``dst`` is not
    empty, each finished super-block is also written to ``dst[n, m, q]`` (row ``r = n*Q +
    q < n_real``, channel ``m = cob*C + c``) by :func:`_unpack_tiles`."""
    ln = vlanes(xf)
    c = 4 * ln
    jn = red_off.size
    rp = 4 * n_rt
    for s0 in range(t0, t1, _TB):
        for j0 in range(0, jn, _JB):
            j1 = min(j0 + _JB, jn)
            for t in range(s0, min(s0 + _TB, t1)):
                cob = t // n_rt
                r0 = (t - cob * n_rt) * 4
                b0 = row_off[r0]
                b1 = row_off[r0 + 1]
                b2 = row_off[r0 + 2]
                b3 = row_off[r0 + 3]
                ob = (cob * rp + r0) * c
                if j0 == 0:
                    a00 = vzero(xf); a01 = vzero(xf); a02 = vzero(xf)  # noqa: E702
                    a03 = vzero(xf)
                    a10 = vzero(xf); a11 = vzero(xf); a12 = vzero(xf)  # noqa: E702
                    a13 = vzero(xf)
                    a20 = vzero(xf); a21 = vzero(xf); a22 = vzero(xf)  # noqa: E702
                    a23 = vzero(xf)
                    a30 = vzero(xf); a31 = vzero(xf); a32 = vzero(xf)  # noqa: E702
                    a33 = vzero(xf)
                else:
                    a00 = vload(out, ob); a01 = vload(out, ob + ln)  # noqa: E702
                    a02 = vload(out, ob + 2 * ln); a03 = vload(out, ob + 3 * ln)  # noqa: E702
                    a10 = vload(out, ob + c); a11 = vload(out, ob + c + ln)  # noqa: E702
                    a12 = vload(out, ob + c + 2 * ln)
                    a13 = vload(out, ob + c + 3 * ln)
                    a20 = vload(out, ob + 2 * c); a21 = vload(out, ob + 2 * c + ln)  # noqa: E702
                    a22 = vload(out, ob + 2 * c + 2 * ln)
                    a23 = vload(out, ob + 2 * c + 3 * ln)
                    a30 = vload(out, ob + 3 * c); a31 = vload(out, ob + 3 * c + ln)  # noqa: E702
                    a32 = vload(out, ob + 3 * c + 2 * ln)
                    a33 = vload(out, ob + 3 * c + 3 * ln)
                wl, wh = _window(lim, t - cob * n_rt, period)
                js = j0
                while js < j1:   # the runs of [j0, j1) inside the tile's tap window
                    jb, je, jn_ = _run(js, j1, wl, wh, period)
                    ao = (cob * jn + jb) * c
                    for j in range(jb, je):
                        o = item_unchecked(red_off, j)
                        w0 = vload(a, ao); w1 = vload(a, ao + ln)  # noqa: E702
                        w2 = vload(a, ao + 2 * ln); w3 = vload(a, ao + 3 * ln)  # noqa: E702
                        ao += c
                        x = vbcast(xf, b0 + o)
                        a00 = vfma(x, w0, a00); a01 = vfma(x, w1, a01)  # noqa: E702
                        a02 = vfma(x, w2, a02); a03 = vfma(x, w3, a03)  # noqa: E702
                        x = vbcast(xf, b1 + o)
                        a10 = vfma(x, w0, a10); a11 = vfma(x, w1, a11)  # noqa: E702
                        a12 = vfma(x, w2, a12); a13 = vfma(x, w3, a13)  # noqa: E702
                        x = vbcast(xf, b2 + o)
                        a20 = vfma(x, w0, a20); a21 = vfma(x, w1, a21)  # noqa: E702
                        a22 = vfma(x, w2, a22); a23 = vfma(x, w3, a23)  # noqa: E702
                        x = vbcast(xf, b3 + o)
                        a30 = vfma(x, w0, a30); a31 = vfma(x, w1, a31)  # noqa: E702
                        a32 = vfma(x, w2, a32); a33 = vfma(x, w3, a33)  # noqa: E702
                    js = jn_
                vstore(out, ob, a00); vstore(out, ob + ln, a01)  # noqa: E702
                vstore(out, ob + 2 * ln, a02); vstore(out, ob + 3 * ln, a03)  # noqa: E702
                vstore(out, ob + c, a10); vstore(out, ob + c + ln, a11)  # noqa: E702
                vstore(out, ob + c + 2 * ln, a12)
                vstore(out, ob + c + 3 * ln, a13)
                vstore(out, ob + 2 * c, a20); vstore(out, ob + 2 * c + ln, a21)  # noqa: E702
                vstore(out, ob + 2 * c + 2 * ln, a22)
                vstore(out, ob + 2 * c + 3 * ln, a23)
                vstore(out, ob + 3 * c, a30); vstore(out, ob + 3 * c + ln, a31)  # noqa: E702
                vstore(out, ob + 3 * c + 2 * ln, a32)
                vstore(out, ob + 3 * c + 3 * ln, a33)
        if dst.size:   # the finished super-block, still in cache, into dst[n, m, q]
            _unpack_tiles(out, dst, n_rt, 4, c, s0, min(s0 + _TB, t1), n_real)


@njit(cache=True, fastmath=True)
def _tiles_8x2(xf, a, out, row_off, red_off, n_rt, t0, t1, dst, n_real, period, lim):
    """:func:`_tiles_4x4` with tiles of 8 rows x 2 vectors (``C = 2*lanes``)."""
    ln = vlanes(xf)
    c = 2 * ln
    jn = red_off.size
    rp = 8 * n_rt
    for s0 in range(t0, t1, _TB):
        for j0 in range(0, jn, _JB):
            j1 = min(j0 + _JB, jn)
            for t in range(s0, min(s0 + _TB, t1)):
                cob = t // n_rt
                r0 = (t - cob * n_rt) * 8
                b0 = row_off[r0]; b1 = row_off[r0 + 1]; b2 = row_off[r0 + 2]  # noqa: E702
                b3 = row_off[r0 + 3]; b4 = row_off[r0 + 4]; b5 = row_off[r0 + 5]  # noqa: E702
                b6 = row_off[r0 + 6]; b7 = row_off[r0 + 7]  # noqa: E702
                ob = (cob * rp + r0) * c
                if j0 == 0:
                    a00 = vzero(xf); a01 = vzero(xf); a10 = vzero(xf)  # noqa: E702
                    a11 = vzero(xf)
                    a20 = vzero(xf); a21 = vzero(xf); a30 = vzero(xf)  # noqa: E702
                    a31 = vzero(xf)
                    a40 = vzero(xf); a41 = vzero(xf); a50 = vzero(xf)  # noqa: E702
                    a51 = vzero(xf)
                    a60 = vzero(xf); a61 = vzero(xf); a70 = vzero(xf)  # noqa: E702
                    a71 = vzero(xf)
                else:
                    a00 = vload(out, ob); a01 = vload(out, ob + ln)  # noqa: E702
                    a10 = vload(out, ob + c); a11 = vload(out, ob + c + ln)  # noqa: E702
                    a20 = vload(out, ob + 2 * c); a21 = vload(out, ob + 2 * c + ln)  # noqa: E702
                    a30 = vload(out, ob + 3 * c); a31 = vload(out, ob + 3 * c + ln)  # noqa: E702
                    a40 = vload(out, ob + 4 * c); a41 = vload(out, ob + 4 * c + ln)  # noqa: E702
                    a50 = vload(out, ob + 5 * c); a51 = vload(out, ob + 5 * c + ln)  # noqa: E702
                    a60 = vload(out, ob + 6 * c); a61 = vload(out, ob + 6 * c + ln)  # noqa: E702
                    a70 = vload(out, ob + 7 * c); a71 = vload(out, ob + 7 * c + ln)  # noqa: E702
                wl, wh = _window(lim, t - cob * n_rt, period)
                js = j0
                while js < j1:   # the runs of [j0, j1) inside the tile's tap window
                    jb, je, jn_ = _run(js, j1, wl, wh, period)
                    ao = (cob * jn + jb) * c
                    for j in range(jb, je):
                        o = item_unchecked(red_off, j)
                        w0 = vload(a, ao); w1 = vload(a, ao + ln)  # noqa: E702
                        ao += c
                        x = vbcast(xf, b0 + o); a00 = vfma(x, w0, a00)  # noqa: E702
                        a01 = vfma(x, w1, a01)
                        x = vbcast(xf, b1 + o); a10 = vfma(x, w0, a10)  # noqa: E702
                        a11 = vfma(x, w1, a11)
                        x = vbcast(xf, b2 + o); a20 = vfma(x, w0, a20)  # noqa: E702
                        a21 = vfma(x, w1, a21)
                        x = vbcast(xf, b3 + o); a30 = vfma(x, w0, a30)  # noqa: E702
                        a31 = vfma(x, w1, a31)
                        x = vbcast(xf, b4 + o); a40 = vfma(x, w0, a40)  # noqa: E702
                        a41 = vfma(x, w1, a41)
                        x = vbcast(xf, b5 + o); a50 = vfma(x, w0, a50)  # noqa: E702
                        a51 = vfma(x, w1, a51)
                        x = vbcast(xf, b6 + o); a60 = vfma(x, w0, a60)  # noqa: E702
                        a61 = vfma(x, w1, a61)
                        x = vbcast(xf, b7 + o); a70 = vfma(x, w0, a70)  # noqa: E702
                        a71 = vfma(x, w1, a71)
                    js = jn_
                vstore(out, ob, a00); vstore(out, ob + ln, a01)  # noqa: E702
                vstore(out, ob + c, a10); vstore(out, ob + c + ln, a11)  # noqa: E702
                vstore(out, ob + 2 * c, a20); vstore(out, ob + 2 * c + ln, a21)  # noqa: E702
                vstore(out, ob + 3 * c, a30); vstore(out, ob + 3 * c + ln, a31)  # noqa: E702
                vstore(out, ob + 4 * c, a40); vstore(out, ob + 4 * c + ln, a41)  # noqa: E702
                vstore(out, ob + 5 * c, a50); vstore(out, ob + 5 * c + ln, a51)  # noqa: E702
                vstore(out, ob + 6 * c, a60); vstore(out, ob + 6 * c + ln, a61)  # noqa: E702
                vstore(out, ob + 7 * c, a70); vstore(out, ob + 7 * c + ln, a71)  # noqa: E702
        if dst.size:   # the finished super-block, still in cache, into dst[n, m, q]
            _unpack_tiles(out, dst, n_rt, 8, c, s0, min(s0 + _TB, t1), n_real)


@njit(cache=True, parallel=True)
def run_4x4(xf, a, out, row_off, red_off, n_rt, n_tiles, n_chunks, dst, n_real, period,
            lim):
    for i in prange(n_chunks):
        _tiles_4x4(xf, a, out, row_off, red_off, n_rt, i * n_tiles // n_chunks,
                   (i + 1) * n_tiles // n_chunks, dst, n_real, period, lim)


@njit(cache=True, parallel=True)
def run_8x2(xf, a, out, row_off, red_off, n_rt, n_tiles, n_chunks, dst, n_real, period,
            lim):
    for i in prange(n_chunks):
        _tiles_8x2(xf, a, out, row_off, red_off, n_rt, i * n_tiles // n_chunks,
                   (i + 1) * n_tiles // n_chunks, dst, n_real, period, lim)
