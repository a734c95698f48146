"""CPU local kernels of the resampling ops (one rank, no MPI): separable linear maps along one
axis (interpolation, adaptive average pooling and their adjoints) and adaptive max pooling.

**Separable maps.**  Along one axis a resampling op is a sparse matrix in CSR form
``(indptr, idx, w)``: output row ``o`` is ``sum_k w[k] * a[..., idx[k], ...]`` over
``k in [indptr[o], indptr[o+1])``.  :func:`apply_axis` applies it along axis ``t`` of an
array of any rank (viewed as ``(P, L, Q)``, parallel over the ``P`` slabs, or over the rows
when there are few slabs; float64 accumulation, the input dtype kept); :func:`transpose_csr`
gives the adjoint's matrix.  CuPy arrays go to :mod:`..gpu.resample` (the same contract).

**Dilated max pooling** (:func:`dilated_max_forward`, backward as adaptive max pooling's): the
window of output ``o`` is ``start[o] + j*dilation`` for ``j < kernel`` per axis, cells outside
the input being padding that never wins; the same maximum rule.

**Adaptive max pooling** (:func:`adaptive_max_forward`, :func:`adaptive_max_backward`):
``(N, C, D, H, W)`` input (any strides), per-axis bins ``[lo, hi)`` relative to it; the
maximum over each bin with PyTorch's rule (a strictly larger value or a NaN replaces the
current one: the first of equal maxima, the last NaN) and its flat index ``(d*H + h)*W + w``
in the input; the backward adds each output's gradient into that cell (bins may share
cells: the scatter runs serially per ``(n, c)`` slab, parallel over slabs).
"""
from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange

__all__ = ["csr_from_rows", "transpose_csr", "apply_axis", "adaptive_max_forward",
           "adaptive_max_backward", "dilated_max_forward"]


def csr_from_rows(rows) -> tuple:
    """``(indptr, idx, w)`` from a list of ``(indices, weights)`` pairs, one per output row."""
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    for r, (ix, _) in enumerate(rows):
        indptr[r + 1] = indptr[r] + len(ix)
    idx = np.concatenate([np.asarray(ix, dtype=np.int64) for ix, _ in rows]) if rows \
        else np.zeros(0, dtype=np.int64)
    w = np.concatenate([np.asarray(v, dtype=np.float64) for _, v in rows]) if rows \
        else np.zeros(0, dtype=np.float64)
    return indptr, idx, w


def transpose_csr(csr, ncols: int) -> tuple:
    """The CSR matrix of the transpose (``ncols``: the input extent, its row count)."""
    indptr, idx, w = csr
    rows = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))
    order = np.argsort(idx, kind="stable")
    tptr = np.zeros(ncols + 1, dtype=np.int64)
    np.add.at(tptr, idx + 1, 1)
    return np.cumsum(tptr), rows[order], w[order]


@njit(parallel=True, cache=True)
def _apply_slabs(a, indptr, idx, w, out):
    P, O, Q = out.shape
    for p in prange(P):
        for o in range(O):
            k0, k1 = indptr[o], indptr[o + 1]
            for q in range(Q):
                acc = 0.0
                for k in range(k0, k1):
                    acc += w[k] * a[p, idx[k], q]
                out[p, o, q] = acc


@njit(parallel=True, cache=True)
def _apply_rows(a, indptr, idx, w, out):
    P, O, Q = out.shape
    for o in prange(O):
        k0, k1 = indptr[o], indptr[o + 1]
        for p in range(P):
            for q in range(Q):
                acc = 0.0
                for k in range(k0, k1):
                    acc += w[k] * a[p, idx[k], q]
                out[p, o, q] = acc


def apply_axis(a, t: int, csr, rows: int | None = None):
    """The CSR map ``csr`` applied along axis ``t`` of ``a`` (a new C-contiguous array whose
    axis ``t`` has one entry per row)."""
    indptr, idx, w = csr
    nrows = len(indptr) - 1 if rows is None else rows
    shape = a.shape
    P = int(np.prod(shape[:t], dtype=np.int64))
    Q = int(np.prod(shape[t + 1:], dtype=np.int64))
    out_shape = shape[:t] + (nrows,) + shape[t + 1:]
    if type(a) is not np.ndarray:   # CuPy: the RawKernel of gpu/kernels/resample.cu
        from ..gpu.resample import apply_axis as gpu_apply_axis
        return gpu_apply_axis(a, t, csr, nrows)
    out = np.empty((P, nrows, Q), dtype=a.dtype)
    if out.size:
        kernel = _apply_slabs if P >= 4 * get_num_threads() else _apply_rows
        kernel(np.ascontiguousarray(a).reshape(P, shape[t], Q), indptr, idx, w, out)
    return out.reshape(out_shape)


@njit(parallel=True, cache=True)
def _amax_fwd(x, dlo, dhi, hlo, hhi, wlo, whi, y, am):
    N, C = x.shape[0], x.shape[1]
    H, W = x.shape[3], x.shape[4]
    OD, OH, OW = y.shape[2], y.shape[3], y.shape[4]
    for s in prange(N * C):
        n = s // C
        c = s - n * C
        for od in range(OD):
            for oh in range(OH):
                for ow in range(OW):
                    best = -np.inf
                    arg = (dlo[od] * H + hlo[oh]) * W + wlo[ow]
                    for d in range(dlo[od], dhi[od]):
                        for h in range(hlo[oh], hhi[oh]):
                            for w in range(wlo[ow], whi[ow]):
                                v = x[n, c, d, h, w]
                                if v > best or np.isnan(v):
                                    best = v
                                    arg = (d * H + h) * W + w
                    y[n, c, od, oh, ow] = best
                    am[n, c, od, oh, ow] = arg


def adaptive_max_forward(x, bins):
    """``(y, argmax)`` of adaptive max pooling of ``x`` ``(N, C, D, H, W)`` over ``bins``:
    three ``(lo, hi)`` pairs of int64 arrays (one entry per output along the axis, relative to
    ``x``; every bin non-empty)."""
    (dlo, dhi), (hlo, hhi), (wlo, whi) = [(np.asarray(lo, np.int64), np.asarray(hi, np.int64))
                                          for lo, hi in bins]
    shape = x.shape[:2] + (len(dlo), len(hlo), len(wlo))
    y = np.empty(shape, dtype=x.dtype)
    am = np.empty(shape, dtype=np.int64)
    if y.size:
        _amax_fwd(x, dlo, dhi, hlo, hhi, wlo, whi, y, am)
    return y, am


@njit(parallel=True, cache=True)
def _amax_bwd(dy, am, dx):
    N, C = dy.shape[0], dy.shape[1]
    M = dy.shape[2] * dy.shape[3] * dy.shape[4]
    for s in prange(N * C):
        n = s // C
        c = s - n * C
        g = dy[n, c].reshape(M)
        a = am[n, c].reshape(M)
        out = dx[n, c].reshape(dx.shape[2] * dx.shape[3] * dx.shape[4])
        for k in range(M):
            if a[k] >= 0:
                out[a[k]] += g[k]


def adaptive_max_backward(dy, argmax, in_spatial):
    """Gradient of the input window (spatial shape ``in_spatial``) of
    :func:`adaptive_max_forward` for the output gradient ``dy``."""
    dx = np.zeros(dy.shape[:2] + tuple(in_spatial), dtype=dy.dtype)
    if dy.size:
        _amax_bwd(np.ascontiguousarray(dy), np.ascontiguousarray(argmax), dx)
    return dx


@njit(parallel=True, cache=True)
def _dmax_fwd(x, st, kk, dd, y, am):
    N, C = x.shape[0], x.shape[1]
    D, H, W = x.shape[2], x.shape[3], x.shape[4]
    OD, OH, OW = y.shape[2], y.shape[3], y.shape[4]
    for s in prange(N * C):
        n = s // C
        c = s - n * C
        for od in range(OD):
            for oh in range(OH):
                for ow in range(OW):
                    best = -np.inf
                    arg = -1
                    for jd in range(kk[0]):
                        d = st[0, od] + jd * dd[0]
                        if d < 0 or d >= D:
                            continue
                        for jh in range(kk[1]):
                            h = st[1, oh] + jh * dd[1]
                            if h < 0 or h >= H:
                                continue
                            for jw in range(kk[2]):
                                w = st[2, ow] + jw * dd[2]
                                if w < 0 or w >= W:
                                    continue
                                v = x[n, c, d, h, w]
                                if arg < 0 or v > best or np.isnan(v):
                                    best = v
                                    arg = (d * H + h) * W + w
                    y[n, c, od, oh, ow] = best
                    am[n, c, od, oh, ow] = arg


def dilated_max_forward(x, out_spatial, starts, kernel, dilation):
    """``(y, argmax)`` of max pooling of ``x`` ``(N, C, D, H, W)`` whose output ``o`` along
    axis ``i`` reads ``starts[i][o] + j * dilation[i]``, ``j < kernel[i]`` (cells outside
    ``x`` are padding; a window of padding only gives ``-inf``, argmax -1: no gradient)."""
    m = max(out_spatial) if out_spatial else 0
    st = np.zeros((3, max(m, 1)), dtype=np.int64)
    for i, v in enumerate(starts):
        st[i, :len(v)] = v
    shape = x.shape[:2] + tuple(out_spatial)
    y = np.empty(shape, dtype=x.dtype)
    am = np.empty(shape, dtype=np.int64)
    if y.size:
        _dmax_fwd(x, st, np.asarray(kernel, np.int64), np.asarray(dilation, np.int64), y, am)
    return y, am
