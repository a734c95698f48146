"""Serial float64 NumPy re-implementations of PyTorch's resampling ops, written from PyTorch's
documented semantics (loops over outputs, no shared code with disttensor): adaptive average and
max pooling, interpolation (nearest, nearest-exact, linear with either align_corners), padding
(constant, reflect, replicate, circular), each with its gradient for an output gradient
``dy``."""
from __future__ import annotations

import itertools
import math

import numpy as np


def _bins(n: int, m: int):
    return [(o * n // m, -(-(o + 1) * n // m)) for o in range(m)]


def adaptive_avg(x, out):
    x = np.asarray(x, dtype=np.float64)
    bins = [_bins(n, m) for n, m in zip(x.shape[2:], out)]
    y = np.zeros(x.shape[:2] + tuple(out))
    for idx in itertools.product(*[range(m) for m in out]):
        sl = tuple(slice(*bins[i][o]) for i, o in enumerate(idx))
        y[(...,) + idx] = x[(slice(None), slice(None)) + sl].mean(axis=tuple(range(2, x.ndim)))
    return y


def adaptive_avg_backward(dy, in_shape):
    out = dy.shape[2:]
    bins = [_bins(n, m) for n, m in zip(in_shape[2:], out)]
    dx = np.zeros(in_shape)
    for idx in itertools.product(*[range(m) for m in out]):
        sl = tuple(slice(*bins[i][o]) for i, o in enumerate(idx))
        size = np.prod([b - a for a, b in (bins[i][o] for i, o in enumerate(idx))])
        grad = dy[(...,) + idx][(...,) + (None,) * len(out)]
        dx[(slice(None), slice(None)) + sl] += grad / size
    return dx


def adaptive_max(x, out):
    """``(y, dx_of)``: the maxima (the first of equal ones; a NaN replaces the current
    maximum) and a function mapping ``dy`` to the input gradient."""
    x = np.asarray(x, dtype=np.float64)
    bins = [_bins(n, m) for n, m in zip(x.shape[2:], out)]
    y = np.zeros(x.shape[:2] + tuple(out))
    where = {}
    for n, c in itertools.product(range(x.shape[0]), range(x.shape[1])):
        for idx in itertools.product(*[range(m) for m in out]):
            best, arg = -np.inf, None
            for cell in itertools.product(*[range(*bins[i][o]) for i, o in enumerate(idx)]):
                v = x[(n, c) + cell]
                if arg is None or v > best or np.isnan(v):
                    best, arg = v, cell
            y[(n, c) + idx] = best
            where[(n, c) + idx] = (n, c) + arg

    def backward(dy):
        dx = np.zeros(x.shape)
        for k, cell in where.items():
            dx[cell] += dy[k]
        return dx
    return y, backward


# -- interpolation ------------------------------------------------------------------------------
def _scale(n, m, sf, align):
    if align:
        return (n - 1) / (m - 1) if m > 1 else 0.0
    return 1.0 / sf if sf else n / m


def axis_weights(n, m, mode, sf=None, align=False, shortcuts=False):
    """The ``(m, n)`` interpolation matrix of one axis (PyTorch's source coordinates;
    ``shortcuts``: PyTorch's 2-D nearest kernel copies ``m == n`` axes and halves the output
    index where ``m == 2n``, whatever the scale factor)."""
    a = np.zeros((m, n))
    for o in range(m):
        if mode in ("nearest", "nearest-exact"):
            s = np.float32(1.0 / sf) if sf else np.float32(n) / np.float32(m)
            pos = (np.float32(o) + np.float32(0.5)) * s if mode == "nearest-exact" \
                else np.float32(o) * s
            i = min(int(math.floor(pos)), n - 1)
            if shortcuts and mode == "nearest" and m in (n, 2 * n):
                i = o if m == n else o // 2
            a[o, i] = 1.0
            continue
        s = _scale(n, m, sf, align)
        src = s * o if align else max(s * (o + 0.5) - 0.5, 0.0)
        i0 = int(src)
        lam = min(max(src - i0, 0.0), 1.0)
        i1 = i0 + 1 if i0 < n - 1 else i0
        a[o, i0] += 1.0 - lam
        a[o, i1] += lam
    return a


def interpolate(x, out, mode, sfs=None, align=False):
    """``x`` resampled to spatial ``out`` (``sfs``: the per-axis factors PyTorch's kernel uses,
    or ``None``); linear modes are the tensor product of :func:`axis_weights`."""
    y = np.asarray(x, dtype=np.float64)
    for i, m in enumerate(out):
        a = axis_weights(y.shape[2 + i], m, mode, None if sfs is None else sfs[i], align,
                         len(out) == 2)
        y = np.moveaxis(np.tensordot(a, y, axes=(1, 2 + i)), 0, 2 + i)
    return y


def interpolate_backward(dy, in_shape, mode, sfs=None, align=False):
    g = np.asarray(dy, dtype=np.float64)
    for i in reversed(range(len(in_shape) - 2)):
        a = axis_weights(in_shape[2 + i], g.shape[2 + i], mode,
                         None if sfs is None else sfs[i], align, len(in_shape) == 4)
        g = np.moveaxis(np.tensordot(a.T, g, axes=(1, 2 + i)), 0, 2 + i)
    return g


# -- padding ------------------------------------------------------------------------------------
def pad_index(j: int, n: int, lo: int, mode: str) -> int | None:
    """The input index that output ``j`` of an axis padded by ``lo`` below copies (``None``:
    the constant)."""
    i = j - lo
    if 0 <= i < n:
        return i
    if mode == "constant":
        return None
    if mode == "replicate":
        return min(max(i, 0), n - 1)
    if mode == "circular":
        return i % n
    if mode == "reflect":
        return -i if i < 0 else 2 * (n - 1) - i
    raise ValueError(mode)


def _crop(pads, shape):
    """Negative pads crop first (PyTorch's circular padding wraps the cropped array)."""
    keep = tuple(slice(max(-lo, 0), n - max(-hi, 0)) for n, (lo, hi) in zip(shape, pads))
    return keep, tuple((max(lo, 0), max(hi, 0)) for lo, hi in pads)


def pad(x, pads, mode, value=0.0):
    """``pads``: ``(lo, hi)`` per spatial axis (first spatial axis first)."""
    x = np.asarray(x, dtype=np.float64)
    keep, pads = _crop(pads, x.shape[2:])
    x = x[(slice(None), slice(None)) + keep]
    out_shape = x.shape[:2] + tuple(n + lo + hi for n, (lo, hi) in zip(x.shape[2:], pads))
    y = np.full(out_shape, float(value))
    for j in itertools.product(*[range(m) for m in out_shape[2:]]):
        src = [pad_index(jj, n, lo, mode) for jj, n, (lo, _) in zip(j, x.shape[2:], pads)]
        if None not in src:
            y[(...,) + j] = x[(...,) + tuple(src)]
    return y


def pad_backward(dy, in_shape, pads, mode):
    keep, pads = _crop(pads, in_shape[2:])
    dxc = np.zeros(in_shape[:2] + tuple(s.stop - s.start for s in keep))
    for j in itertools.product(*[range(m) for m in dy.shape[2:]]):
        src = [pad_index(jj, n, lo, mode) for jj, n, (lo, _) in zip(j, dxc.shape[2:], pads)]
        if None not in src:
            dxc[(...,) + tuple(src)] += dy[(...,) + j]
    dx = np.zeros(in_shape)
    dx[(slice(None), slice(None)) + keep] = dxc
    return dx


# -- pooling with ceil_mode, dilation, divisor_override -----------------------------------------
def pool_extent(n, k, s, d, lo, hi, ceil_mode):
    span = d * (k - 1) + 1
    q = (n + lo + hi - span) / s
    m = (math.ceil(q) if ceil_mode else math.floor(q)) + 1
    if ceil_mode and (m - 1) * s >= n + lo:
        m -= 1
    return m


def pool(x, mode, k, s, pads, d, ceil_mode=False, include=True, divisor=None):
    """``(y, backward)`` of PyTorch's max/avg pooling (per-axis tuples; ``pads``: (lo, hi)
    pairs).  Max: the first of equal maxima among the real cells (row-major window order)."""
    x = np.asarray(x, dtype=np.float64)
    sp = x.shape[2:]
    out = tuple(pool_extent(n, *a, ceil_mode) for n, a in zip(sp, zip(k, s, d, *zip(*pads))))
    y = np.zeros(x.shape[:2] + out)
    taps = {}
    for idx in itertools.product(*[range(m) for m in out]):
        starts = [o * si - lo for o, si, (lo, _) in zip(idx, s, pads)]
        axes = [[st + j * di for j in range(ki) if 0 <= st + j * di < n]
                for st, ki, di, n in zip(starts, k, d, sp)]
        cells = list(itertools.product(*axes))
        if mode == "avg":
            if divisor is not None:
                div = divisor
            elif include:
                div = np.prod([min(st + ki, n + hi) - st
                               for st, ki, n, (_, hi) in zip(starts, k, sp, pads)])
            else:
                div = len(cells)
            for n_, c_ in itertools.product(range(x.shape[0]), range(x.shape[1])):
                y[(n_, c_) + idx] = sum(x[(n_, c_) + c] for c in cells) / div
            taps[idx] = [(c, 1.0 / div) for c in cells]
            continue
        for n_, c_ in itertools.product(range(x.shape[0]), range(x.shape[1])):
            best, arg = -np.inf, None
            for c in cells:
                if arg is None or x[(n_, c_) + c] > best:
                    best, arg = x[(n_, c_) + c], c
            y[(n_, c_) + idx] = best
            taps[(n_, c_) + idx] = arg

    def backward(dy):
        dx = np.zeros(x.shape)
        for key, t in taps.items():
            if mode == "avg":
                for c, w in t:
                    dx[(slice(None), slice(None)) + c] += w * dy[(...,) + key]
            elif t is not None:
                dx[key[:2] + t] += dy[key]
        return dx
    return y, backward
