"""CPU local kernels for batch norm, activations and channel softmax (one rank, no MPI).

Arrays have layout ``(N, C, *spatial)`` with any ``ndim >= 2``; the channel axis is 1.
Contract shared by every function here:

* data inputs are float32 or float64 (``TypeError`` otherwise); the result has the dtype of
  the primary input (``x`` for forward functions, ``dy`` for backward functions);
* per-channel reductions return float64 ``(C,)`` arrays and accumulate in float64 (so do
  the per-position channel sums of the softmax); per-element arithmetic is done in float64
  and rounded once to the output dtype, except the transcendental functions of sigmoid, tanh
  and softmax, which run in the input's precision (float32 ``exp`` is twice as fast as
  float64 and costs a few float32 ulp at most);
* per-channel parameters (``scale``, ``mean``, ``gamma``, ...) are ``(C,)`` arrays of any
  float dtype (converted to float64, which is tiny);
* results are new C-contiguous arrays (large ones are views of buffers of
  :mod:`disttensor.core.buffer_pool`, never handed out again while referenced); no temporary
  as large as the input is made, except that a non-C-contiguous input is first copied to C
  order (once);
* empty inputs (any zero extent) are fine.

The fused loops are Numba ``@njit(parallel=True, cache=True)`` kernels (``fastmath`` off, so
NaN/inf follow IEEE rules).  Work is cut into fixed blocks -- ``(n, c, block of the flattened
spatial axes)`` for per-channel ops, ``(n, block of spatial positions)`` for the channel
softmax, flat blocks for activations -- so a single huge plane still uses every thread, and
reduction results do not depend on the thread count (partial sums per block are combined in a
fixed order).  The thread count is Numba's (``NUMBA_NUM_THREADS`` / ``numba.set_num_threads``),
which matters when several MPI ranks share a node.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ....core import buffer_pool as _pool

__all__ = [
    "channel_sums", "bn_forward_apply", "channel_sums_backward", "bn_backward_apply",
    "ACTIVATIONS", "activation_forward", "activation_backward",
    "softmax_channels", "softmax_channels_backward", "log_softmax_channels",
    "add_channel_bias",
]

ACTIVATIONS = ("relu", "leaky_relu", "elu", "sigmoid", "tanh")
_ALPHA_DEFAULT = {"leaky_relu": 0.01, "elu": 1.0}

_BLOCK = 16384        # elements per task of the per-channel and flat kernels
_SBLOCK = 512         # spatial positions per task of the channel-softmax kernels


# --------------------------------------------------------------------------------------------
# argument handling
# --------------------------------------------------------------------------------------------

def _data(name, a):
    a = np.asarray(a)
    if a.dtype != np.float32 and a.dtype != np.float64:
        raise TypeError(f"{name} must be float32 or float64, got {a.dtype}")
    if a.ndim < 2:
        raise ValueError(f"{name} must have layout (N, C, *spatial), got shape {a.shape}")
    return a


def _same_shape(name, a, ref_name, ref):
    if a.shape != ref.shape:
        raise ValueError(f"{name} shape {a.shape} != {ref_name} shape {ref.shape}")


def _as3d(a):
    """(N, C, S) C-contiguous view of ``a`` (a copy only if ``a`` is not C-contiguous)."""
    a = np.ascontiguousarray(a)
    n, c = a.shape[:2]
    return a.reshape(n, c, math.prod(a.shape[2:]))


def _chan(name, v, c):
    v = np.ascontiguousarray(v, dtype=np.float64)
    if v.shape != (c,):
        raise ValueError(f"{name} must have shape ({c},), got {v.shape}")
    return v


# --------------------------------------------------------------------------------------------
# batch norm
# --------------------------------------------------------------------------------------------

@njit(parallel=True, cache=True)
def _sums_kernel(x, block):
    N, C, S = x.shape
    nb = (S + block - 1) // block
    part = np.zeros((N, C, nb, 2))
    for t in prange(N * C * nb):
        p = t // nb
        b = t - p * nb
        n = p // C
        c = p - n * C
        s0 = b * block
        xs = x[n, c, s0:min(S, s0 + block)]
        L = xs.shape[0]
        # four independent accumulators (fixed order: deterministic, shorter dependency chain)
        a0 = 0.0
        a1 = 0.0
        a2 = 0.0
        a3 = 0.0
        q0 = 0.0
        q1 = 0.0
        q2 = 0.0
        q3 = 0.0
        L4 = L - L % 4
        for j in range(0, L4, 4):
            v0 = np.float64(xs[j])
            v1 = np.float64(xs[j + 1])
            v2 = np.float64(xs[j + 2])
            v3 = np.float64(xs[j + 3])
            a0 += v0
            a1 += v1
            a2 += v2
            a3 += v3
            q0 += v0 * v0
            q1 += v1 * v1
            q2 += v2 * v2
            q3 += v3 * v3
        for j in range(L4, L):
            v0 = np.float64(xs[j])
            a0 += v0
            q0 += v0 * v0
        part[n, c, b, 0] = (a0 + a1) + (a2 + a3)
        part[n, c, b, 1] = (q0 + q1) + (q2 + q3)
    return part


@njit(parallel=True, cache=True)
def _sums_bwd_kernel(dy, x, mean, block):
    N, C, S = x.shape
    nb = (S + block - 1) // block
    part = np.zeros((N, C, nb, 2))
    for t in prange(N * C * nb):
        p = t // nb
        b = t - p * nb
        n = p // C
        c = p - n * C
        m = mean[c]
        s0 = b * block
        s1 = min(S, s0 + block)
        gs = dy[n, c, s0:s1]
        xs = x[n, c, s0:s1]
        L = s1 - s0
        a0 = 0.0
        a1 = 0.0
        a2 = 0.0
        a3 = 0.0
        q0 = 0.0
        q1 = 0.0
        q2 = 0.0
        q3 = 0.0
        L4 = L - L % 4
        for j in range(0, L4, 4):
            g0 = np.float64(gs[j])
            g1 = np.float64(gs[j + 1])
            g2 = np.float64(gs[j + 2])
            g3 = np.float64(gs[j + 3])
            a0 += g0
            a1 += g1
            a2 += g2
            a3 += g3
            q0 += g0 * (np.float64(xs[j]) - m)
            q1 += g1 * (np.float64(xs[j + 1]) - m)
            q2 += g2 * (np.float64(xs[j + 2]) - m)
            q3 += g3 * (np.float64(xs[j + 3]) - m)
        for j in range(L4, L):
            g0 = np.float64(gs[j])
            a0 += g0
            q0 += g0 * (np.float64(xs[j]) - m)
        part[n, c, b, 0] = (a0 + a1) + (a2 + a3)
        part[n, c, b, 1] = (q0 + q1) + (q2 + q3)
    return part


@njit(parallel=True, cache=True)
def _affine_kernel(x, scale, shift, y, block):
    N, C, S = x.shape
    nb = (S + block - 1) // block
    for t in prange(N * C * nb):
        p = t // nb
        b = t - p * nb
        n = p // C
        c = p - n * C
        a = scale[c]
        d = shift[c]
        s0 = b * block
        s1 = min(S, s0 + block)
        xs = x[n, c, s0:s1]
        ys = y[n, c, s0:s1]
        for j in range(s1 - s0):
            ys[j] = np.float64(xs[j]) * a + d


@njit(parallel=True, cache=True)
def _bn_bwd_kernel(dy, x, mean, invstd, coef, mdy, mdx, dx, block):
    # dx = coef[c] * (dy - mdy[c] - (x - mean[c]) * invstd[c] * mdx[c]),  coef = gamma*invstd
    N, C, S = x.shape
    nb = (S + block - 1) // block
    for t in prange(N * C * nb):
        p = t // nb
        b = t - p * nb
        n = p // C
        c = p - n * C
        k = coef[c]
        m = mean[c]
        u = mdy[c]
        v = invstd[c] * mdx[c]
        s0 = b * block
        s1 = min(S, s0 + block)
        gs = dy[n, c, s0:s1]
        xs = x[n, c, s0:s1]
        ds = dx[n, c, s0:s1]
        for j in range(s1 - s0):
            ds[j] = k * (np.float64(gs[j]) - u - (np.float64(xs[j]) - m) * v)


def channel_sums(x):
    """Per-channel ``(sum(x), sum(x*x))`` over every axis but 1: two float64 ``(C,)`` arrays."""
    x = _as3d(_data("x", x))
    part = _sums_kernel(x, _BLOCK)
    return part[..., 0].sum(axis=(0, 2)), part[..., 1].sum(axis=(0, 2))


def bn_forward_apply(x, scale, shift):
    """``y = x * scale[c] + shift[c]`` (computed in float64, returned in ``x.dtype``).

    With ``scale = gamma*invstd`` and ``shift = beta - mean*scale`` this is the batch-norm
    forward; ``scale``/``shift`` are ``(C,)`` arrays of any float dtype."""
    x = _data("x", x)
    x3 = _as3d(x)
    c = x3.shape[1]
    y = _pool.empty(x.shape, x.dtype)
    _affine_kernel(x3, _chan("scale", scale, c), _chan("shift", shift, c),
                   y.reshape(x3.shape), _BLOCK)
    return y


def _bn_backward_operands(dy, x, mean, invstd):
    """``(dy, x3, C, mean, invstd)``: the checked operands of the batch-norm backward
    functions, ``x`` as an ``(N, C, S)`` view and the statistics as float64 ``(C,)``."""
    dy = _data("dy", dy)
    x = _data("x", x)
    _same_shape("dy", dy, "x", x)
    x3 = _as3d(x)
    c = x3.shape[1]
    return dy, x3, c, _chan("mean", mean, c), _chan("invstd", invstd, c)


def channel_sums_backward(dy, x, mean, invstd):
    """Per-channel ``(sum(dy), sum(dy * xhat))``, ``xhat = (x - mean[c]) * invstd[c]``, float64
    ``(C,)`` each (the second is accumulated as ``invstd[c] * sum(dy * (x - mean[c]))``)."""
    dy, x3, c, mean, invstd = _bn_backward_operands(dy, x, mean, invstd)
    part = _sums_bwd_kernel(_as3d(dy), x3, mean, _BLOCK)
    return part[..., 0].sum(axis=(0, 2)), invstd * part[..., 1].sum(axis=(0, 2))


def bn_backward_apply(dy, x, mean, invstd, gamma, mean_dy, mean_dy_xhat):
    """``dx = gamma[c] * invstd[c] * (dy - mean_dy[c] - xhat * mean_dy_xhat[c])`` with
    ``xhat = (x - mean[c]) * invstd[c]``; ``dy.dtype`` result.  ``mean_dy`` and
    ``mean_dy_xhat`` are the (globally reduced) per-channel means of ``dy`` and ``dy*xhat``."""
    dy, x3, c, mean, invstd = _bn_backward_operands(dy, x, mean, invstd)
    coef = _chan("gamma", gamma, c) * invstd
    dx = _pool.empty(dy.shape, dy.dtype)
    _bn_bwd_kernel(_as3d(dy), x3, mean, invstd, coef, _chan("mean_dy", mean_dy, c),
                   _chan("mean_dy_xhat", mean_dy_xhat, c), dx.reshape(x3.shape), _BLOCK)
    return dx


# --------------------------------------------------------------------------------------------
# activations
# --------------------------------------------------------------------------------------------

_CODES = {name: i for i, name in enumerate(ACTIVATIONS)}


@njit(parallel=True, cache=True)
def _act_fwd_kernel(x, y, op, alpha, block):
    n = x.shape[0]
    nb = (n + block - 1) // block
    one = x.dtype.type(1.0)
    for b in prange(nb):
        i0 = b * block
        i1 = min(n, i0 + block)
        xs = x[i0:i1]
        ys = y[i0:i1]
        if op == 0:        # relu (NaN propagates, as torch)
            for j in range(i1 - i0):
                v = xs[j]
                ys[j] = 0.0 if v <= 0.0 else v
        elif op == 1:      # leaky_relu
            for j in range(i1 - i0):
                v = np.float64(xs[j])
                ys[j] = v if v > 0.0 else alpha * v
        elif op == 2:      # elu
            for j in range(i1 - i0):
                v = np.float64(xs[j])
                ys[j] = v if v > 0.0 else alpha * math.expm1(v)
        else:              # sigmoid, in x's precision: exp of a non-positive number only
            for j in range(i1 - i0):
                v = xs[j]
                e = math.exp(-abs(v))
                r = one / (one + e)
                ys[j] = r if v >= 0 else e * r


@njit(parallel=True, cache=True)
def _act_bwd_kernel(dy, x, y, dx, op, alpha, block):
    n = dy.shape[0]
    nb = (n + block - 1) // block
    for b in prange(nb):
        i0 = b * block
        i1 = min(n, i0 + block)
        gs = dy[i0:i1]
        xs = x[i0:i1]
        ys = y[i0:i1]
        ds = dx[i0:i1]
        if op == 0:        # relu: dy * (x > 0)
            for j in range(i1 - i0):
                ds[j] = gs[j] if xs[j] > 0 else 0.0
        elif op == 1:      # leaky_relu: dy * (1 if x > 0 else alpha)
            for j in range(i1 - i0):
                g = np.float64(gs[j])
                ds[j] = g if xs[j] > 0 else alpha * g
        elif op == 2:      # elu: dy * (1 if x > 0 else y + alpha)
            for j in range(i1 - i0):
                g = np.float64(gs[j])
                ds[j] = g if xs[j] > 0 else g * (np.float64(ys[j]) + alpha)
        elif op == 3:      # sigmoid: dy * y * (1 - y)
            for j in range(i1 - i0):
                v = np.float64(ys[j])
                ds[j] = np.float64(gs[j]) * (v * (1.0 - v))
        else:              # tanh: dy * (1 - y^2)
            for j in range(i1 - i0):
                v = np.float64(ys[j])
                ds[j] = np.float64(gs[j]) * (1.0 - v * v)


def _act_args(name, alpha):
    if name not in _CODES:
        raise ValueError(f"unknown activation {name!r}; valid names: {', '.join(ACTIVATIONS)}")
    if alpha is None:
        alpha = _ALPHA_DEFAULT.get(name, 0.0)
    return _CODES[name], float(alpha)


def _flat(a):
    return np.ascontiguousarray(a).reshape(-1)


def activation_forward(name, x, alpha=None):
    """Elementwise activation ``name`` of ``x`` (``x.dtype`` result).

    ``relu`` (NaN propagates), ``leaky_relu`` (``x if x > 0 else alpha*x``, alpha 0.01),
    ``elu`` (``x if x > 0 else alpha*expm1(x)``, alpha 1.0), ``sigmoid`` (overflow-free
    ``1/(1+e)`` or ``e/(1+e)`` with ``e = exp(-|x|)``, evaluated in ``x``'s precision, within a
    few ulp), ``tanh`` (NumPy's ``np.tanh``).  ``alpha`` is ignored by the others.  Unknown
    names raise ``ValueError``."""
    op, alpha = _act_args(name, alpha)
    x = _data("x", x)
    y = _pool.empty(x.shape, x.dtype)
    if name == "tanh":                   # NumPy's SIMD tanh beats a scalar libm loop
        np.tanh(x, out=y)
        return y
    _act_fwd_kernel(_flat(x), y.reshape(-1), op, alpha, _BLOCK)
    return y


def activation_backward(name, dy, x, y, alpha=None):
    """``dx = dy * activation'(x)`` (``dy.dtype`` result), PyTorch conventions at 0: relu
    ``x > 0``; leaky_relu ``1 if x > 0 else alpha``; elu ``1 if x > 0 else y + alpha``; sigmoid
    ``y*(1-y)``; tanh ``1 - y*y``.  Where the derivative is 0 (relu, ``x <= 0``) ``dx`` is 0 even
    for a non-finite ``dy``.  Both ``x`` and the forward output ``y`` must be given (same
    shape as ``dy``)."""
    op, alpha = _act_args(name, alpha)
    dy = _data("dy", dy)
    x = _data("x", x)
    y = _data("y", y)
    _same_shape("x", x, "dy", dy)
    _same_shape("y", y, "dy", dy)
    dx = _pool.empty(dy.shape, dy.dtype)
    _act_bwd_kernel(_flat(dy), _flat(x), _flat(y), dx.reshape(-1), op, alpha, _BLOCK)
    return dx


# --------------------------------------------------------------------------------------------
# softmax over the channel axis
# --------------------------------------------------------------------------------------------

@njit(parallel=True, cache=True)
def _softmax_kernel(x, y, block, log):
    # exp is evaluated in x's precision (float32 exp for float32 data), sums in float64
    N, C, S = x.shape
    nb = (S + block - 1) // block
    for t in prange(N * nb):
        n = t // nb
        b = t - n * nb
        s0 = b * block
        s1 = min(S, s0 + block)
        L = s1 - s0
        m = np.full(L, -np.inf, dtype=x.dtype)
        tot = np.zeros(L)
        for c in range(C):                    # channel max (a NaN wins, so it propagates)
            xs = x[n, c, s0:s1]
            for j in range(L):
                v = xs[j]
                if v > m[j] or v != v:
                    m[j] = v
        if log:
            for c in range(C):
                xs = x[n, c, s0:s1]
                for j in range(L):
                    tot[j] += math.exp(xs[j] - m[j])
            for j in range(L):
                tot[j] = math.log(tot[j])
            for c in range(C):
                xs = x[n, c, s0:s1]
                ys = y[n, c, s0:s1]
                for j in range(L):
                    ys[j] = (np.float64(xs[j]) - m[j]) - tot[j]
        else:
            for c in range(C):
                xs = x[n, c, s0:s1]
                ys = y[n, c, s0:s1]
                for j in range(L):
                    e = math.exp(xs[j] - m[j])
                    tot[j] += e
                    ys[j] = e
            for c in range(C):
                ys = y[n, c, s0:s1]
                for j in range(L):
                    ys[j] = np.float64(ys[j]) / tot[j]


@njit(parallel=True, cache=True)
def _softmax_bwd_kernel(dy, y, dx, block):
    N, C, S = y.shape
    nb = (S + block - 1) // block
    for t in prange(N * nb):
        n = t // nb
        b = t - n * nb
        s0 = b * block
        s1 = min(S, s0 + block)
        L = s1 - s0
        dot = np.zeros(L)
        for c in range(C):
            gs = dy[n, c, s0:s1]
            ys = y[n, c, s0:s1]
            for j in range(L):
                dot[j] += np.float64(gs[j]) * np.float64(ys[j])
        for c in range(C):
            gs = dy[n, c, s0:s1]
            ys = y[n, c, s0:s1]
            ds = dx[n, c, s0:s1]
            for j in range(L):
                ds[j] = np.float64(ys[j]) * (np.float64(gs[j]) - dot[j])


def _softmax(x, log: bool):
    x = _data("x", x)
    x3 = _as3d(x)
    y = _pool.empty(x.shape, x.dtype)
    _softmax_kernel(x3, y.reshape(x3.shape), _SBLOCK, log)
    return y


def softmax_channels(x):
    """Softmax over axis 1, ``exp(x - max_c x) / sum_c exp(x - max_c x)`` (``x.dtype``).

    A NaN in any channel makes every channel of that position NaN."""
    return _softmax(x, False)


def log_softmax_channels(x):
    """Log-softmax over axis 1, ``x - max_c x - log(sum_c exp(x - max_c x))`` (``x.dtype``)."""
    return _softmax(x, True)


def softmax_channels_backward(dy, y):
    """``dx = y * (dy - sum_c(dy * y))`` given the softmax output ``y`` (``dy.dtype``)."""
    dy = _data("dy", dy)
    y = _data("y", y)
    _same_shape("dy", dy, "y", y)
    y3 = _as3d(y)
    dx = _pool.empty(dy.shape, dy.dtype)
    _softmax_bwd_kernel(_as3d(dy), y3, dx.reshape(y3.shape), _SBLOCK)
    return dx


# --------------------------------------------------------------------------------------------
# a layer's bias added in place
# --------------------------------------------------------------------------------------------

@njit(cache=True, error_model="numpy")
def _channel_bias_kernel(y, b):
    n_n, c_n, q_n = y.shape
    for n in range(n_n):
        for c in range(c_n):
            bc = b[c]
            for q in range(q_n):
                y[n, c, q] = y[n, c, q] + bc


def add_channel_bias(y, b) -> None:
    """``y[n, c, ...] += b[c]`` in place (``y`` ``(N, C, *spatial)``, ``b`` ``(C,)``), ``b``
    cast to ``y``'s dtype first: the sum is made in ``y``'s dtype, the same bits as NumPy's
    ``y += b.reshape(1, -1, 1, ...)`` (the exception to this module's float64 rule; one pass
    over ``y``, where NumPy's broadcast add is up to 4x slower on blocks of 16^3 positions).
    A ``y`` that is not a writeable C-contiguous NumPy array takes NumPy's expression."""
    b = b.astype(y.dtype, copy=False)
    if type(y) is np.ndarray and y.ndim >= 2 and y.flags.c_contiguous and y.flags.writeable \
            and (y.dtype == np.float32 or y.dtype == np.float64) and b.shape == (y.shape[1],):
        if y.size:
            _channel_bias_kernel(y.reshape(y.shape[0], y.shape[1], -1),
                                 np.ascontiguousarray(b))
        return
    y += b.reshape((1, -1) + (1,) * (y.ndim - 2))
