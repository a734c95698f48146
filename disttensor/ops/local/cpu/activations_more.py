"""CPU local kernels of the activations whose derivative is a function of the input (GELU,
SiLU, Softplus, Mish, Hardswish, Hardsigmoid) and of PReLU (one rank, no MPI; Numba).

Contract (as :mod:`.pointwise`): data inputs float32 or float64 (``TypeError`` otherwise),
results in the dtype of the primary input (``x`` forward, ``dy`` backward), new C-contiguous
arrays, any shape (PReLU: ``(N, C, *spatial)`` when it has one weight per channel), empty
inputs fine.  Elements are computed in the input's precision (float32 libm functions for
float32 data, as the GPU kernels do: within a few float32 ulp of the terms; the float64 path
is PyTorch's to ~1e-16), one exp per element where the formula allows (mish's ``tanh(softplus)``
as ``n / (n + 2)``, ``n = e^x (e^x + 2)``); PReLU's weight gradient is accumulated in float64 per channel over fixed blocks combined in a fixed order, so it does
not depend on the thread count.  Formulas (PyTorch 2.13's, ``x`` the input, ``g`` = ``dy``)::

    gelu         x * Phi(x)                       g * (Phi(x) + x * phi(x))
    gelu_tanh    x/2 * (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi)   (PyTorch's derivative)
    silu         x * s(x)                         g * s * (1 + x (1 - s))
    softplus     log1p(exp(b x)) / b  (x if b x > threshold)      g * s(b x)  (g if b x > t)
    mish         x * tanh(softplus(x))            g * (t + x s(x) (1 - t^2)),  t = tanh(sp(x))
    hardswish    x * clip(x + 3, 0, 6) / 6        g * (0 if x <= -3, x/3 + 1/2 if x < 3, else 1)
    hardsigmoid  clip(x + 3, 0, 6) / 6            g / 6 if -3 < x < 3 else 0
    prelu        x if x > 0 else w[c] x           dx = g or w[c] g;  dw[c] = sum(x g, x <= 0)

with ``s`` the logistic sigmoid (evaluated without overflow), ``Phi``/``phi`` the standard
normal cdf/pdf.  NaN propagates, except through hardsigmoid's derivative (0 there, as
PyTorch's).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ....core import buffer_pool as _pool

from .pointwise import _BLOCK, _as3d, _data, _flat, _same_shape

__all__ = ["POINTWISE_ACTIVATIONS", "pointwise_activation_forward",
           "pointwise_activation_backward", "prelu_forward", "prelu_backward"]

POINTWISE_ACTIVATIONS = ("gelu", "gelu_tanh", "silu", "softplus", "mish", "hardswish",
                         "hardsigmoid")
_CODES = {name: i for i, name in enumerate(POINTWISE_ACTIVATIONS)}
_SQRT1_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_K_TANH = math.sqrt(2.0 / math.pi)
_KAPPA = 0.044715


@njit(cache=True, inline="always")
def _sigmoid(v, one):
    # in v's precision, exp of a non-positive number only
    if v >= 0:
        return one / (one + math.exp(-v))
    e = math.exp(v)
    return e / (one + e)


@njit(cache=True, inline="always")
def _mish_parts(v, one, two):
    """``(t, 1 - t^2, sigmoid(v))`` with ``t = tanh(softplus(v))`` from one exp: ``t = n / (n +
    2)``, ``n = e (e + 2)``, ``e = exp(v)``, so ``1 - t^2 = 4 (n + 1) / (n + 2)^2`` (no
    cancellation); ``t = 1`` exactly (in float64 and float32) from ``v > 20``."""
    if v > 20:
        return one, 4 * one / math.exp(v + v), one
    e = math.exp(v)
    n = e * (e + two)
    d = n + two
    return n / d, (4 * (n + one)) / (d * d), e / (one + e)


@njit(parallel=True, cache=True)
def _fwd_kernel(x, y, op, beta, threshold, block):
    T = x.dtype.type
    one, two, half, three, six = T(1.0), T(2.0), T(0.5), T(3.0), T(6.0)
    zero = T(0.0)
    rs2, k, kappa = T(_SQRT1_2), T(_K_TANH), T(_KAPPA)
    b_, t_ = T(beta), T(threshold)
    n = x.shape[0]
    nb = (n + block - 1) // block
    for b in prange(nb):
        i0 = b * block
        i1 = min(n, i0 + block)
        if op == 0:                                        # gelu
            for i in range(i0, i1):
                v = x[i]
                y[i] = half * v * (one + math.erf(v * rs2))
        elif op == 1:                                      # gelu_tanh
            for i in range(i0, i1):
                v = x[i]
                y[i] = half * v * (one + math.tanh(k * (v + kappa * v * v * v)))
        elif op == 2:                                      # silu
            for i in range(i0, i1):
                v = x[i]
                y[i] = v * _sigmoid(v, one)
        elif op == 3:                                      # softplus
            for i in range(i0, i1):
                v = x[i]
                bv = b_ * v
                y[i] = v if bv > t_ else math.log1p(math.exp(bv)) / b_
        elif op == 4:                                      # mish
            for i in range(i0, i1):
                v = x[i]
                y[i] = v * _mish_parts(v, one, two)[0]
        elif op == 5:                                      # hardswish
            for i in range(i0, i1):
                v = x[i]
                y[i] = v * min(max(v + three, zero), six) / six if v == v else v
        else:                                              # hardsigmoid
            for i in range(i0, i1):
                v = x[i]
                y[i] = min(max(v + three, zero), six) / six if v == v else v


@njit(parallel=True, cache=True)
def _bwd_kernel(dy, x, dx, op, beta, threshold, block):
    T = x.dtype.type
    one, two, half, three = T(1.0), T(2.0), T(0.5), T(3.0)
    zero, sixth = T(0.0), T(1.0 / 6.0)
    rs2, k, kappa, rs2pi = T(_SQRT1_2), T(_K_TANH), T(_KAPPA), T(_INV_SQRT_2PI)
    b_, t_ = T(beta), T(threshold)
    n = dy.shape[0]
    nb = (n + block - 1) // block
    for b in prange(nb):
        i0 = b * block
        i1 = min(n, i0 + block)
        if op == 0:                                        # gelu: Phi(x) + x phi(x)
            for i in range(i0, i1):
                v = x[i]
                d = half * (one + math.erf(v * rs2)) + v * rs2pi * math.exp(-half * v * v)
                dx[i] = dy[i] * d
        elif op == 1:                                      # gelu_tanh (PyTorch's form)
            for i in range(i0, i1):
                v = x[i]
                x2 = v * v
                t = math.tanh(k * (v + kappa * x2 * v))
                d = half * (one + t) + half * v * (one - t * t) * k * (one + three * kappa * x2)
                dx[i] = dy[i] * d
        elif op == 2:                                      # silu
            for i in range(i0, i1):
                v = x[i]
                s = _sigmoid(v, one)
                dx[i] = dy[i] * (s * (one + v * (one - s)))
        elif op == 3:                                      # softplus
            for i in range(i0, i1):
                bv = b_ * x[i]
                dx[i] = dy[i] if bv > t_ else dy[i] * _sigmoid(bv, one)
        elif op == 4:                                      # mish
            for i in range(i0, i1):
                v = x[i]
                t, u, s = _mish_parts(v, one, two)
                dx[i] = dy[i] * (t + v * s * u)
        elif op == 5:                                      # hardswish (NaN propagates)
            for i in range(i0, i1):
                v = x[i]
                if v != v:
                    dx[i] = v
                elif v <= -three:                          # PyTorch 2.13: 0 at -3, 1 at 3
                    dx[i] = zero
                else:
                    dx[i] = dy[i] * (v / three + half) if v < three else dy[i]
        else:                                              # hardsigmoid (0 at NaN)
            for i in range(i0, i1):
                v = x[i]
                dx[i] = dy[i] * sixth if -three < v < three else zero


def _op(name):
    if name not in _CODES:
        raise ValueError(f"unknown activation {name!r}; valid names: "
                         f"{', '.join(POINTWISE_ACTIVATIONS)}")
    return _CODES[name]


def _any_float(name, a):
    a = np.asarray(a)
    if a.dtype != np.float32 and a.dtype != np.float64:
        raise TypeError(f"{name} must be float32 or float64, got {a.dtype}")
    return a


def pointwise_activation_forward(name, x, beta=1.0, threshold=20.0):
    """Activation ``name`` of :data:`POINTWISE_ACTIVATIONS` applied to ``x`` (any shape;
    ``beta``/``threshold``: softplus's, ignored by the others)."""
    op = _op(name)
    x = _any_float("x", x)
    y = _pool.empty(x.shape, x.dtype)
    _fwd_kernel(_flat(x), y.reshape(-1), op, float(beta), float(threshold), _BLOCK)
    return y


def pointwise_activation_backward(name, dy, x, beta=1.0, threshold=20.0):
    """``dx = dy * activation'(x)`` (``dy.dtype``; ``x`` of ``dy``'s shape)."""
    op = _op(name)
    dy, x = _any_float("dy", dy), _any_float("x", x)
    _same_shape("x", x, "dy", dy)
    dx = _pool.empty(dy.shape, dy.dtype)
    _bwd_kernel(_flat(dy), _flat(x), dx.reshape(-1), op, float(beta), float(threshold),
                _BLOCK)
    return dx


# --------------------------------------------------------------------------------------------
# PReLU
# --------------------------------------------------------------------------------------------

@njit(parallel=True, cache=True)
def _prelu_fwd_kernel(x, w, y, block):
    N, C, S = x.shape
    nb = (S + block - 1) // block
    for t in prange(N * C * nb):
        p = t // nb
        b = t - p * nb
        c = p % C
        n = p // C
        a = w[c]
        for j in range(b * block, min(S, b * block + block)):
            v = np.float64(x[n, c, j])
            y[n, c, j] = v if v > 0.0 else a * v


@njit(parallel=True, cache=True)
def _prelu_bwd_kernel(dy, x, w, dx, block):
    N, C, S = x.shape
    nb = (S + block - 1) // block
    part = np.zeros((N, C, nb))
    for t in prange(N * C * nb):
        p = t // nb
        b = t - p * nb
        c = p % C
        n = p // C
        a = w[c]
        acc = 0.0
        for j in range(b * block, min(S, b * block + block)):
            v = np.float64(x[n, c, j])
            g = np.float64(dy[n, c, j])
            if v > 0.0:
                dx[n, c, j] = g
            else:
                dx[n, c, j] = a * g
                acc += v * g
        part[n, c, b] = acc
    return part


def _prelu_operands(x, weight):
    x = _any_float("x", x)
    w = np.ascontiguousarray(weight, dtype=np.float64).reshape(-1)
    if w.size == 1:
        x3 = np.ascontiguousarray(x).reshape(1, 1, x.size)
    else:
        x = _data("x", x)
        if w.size != x.shape[1]:
            raise ValueError(f"prelu: {w.size} weights for {x.shape[1]} channels")
        x3 = _as3d(x)
    return x, x3, w


def prelu_forward(x, weight):
    """``x if x > 0 else weight[c] * x`` (``weight``: 1 value, or one per channel of an
    ``(N, C, *spatial)`` ``x``)."""
    x, x3, w = _prelu_operands(x, weight)
    y = _pool.empty(x.shape, x.dtype)
    _prelu_fwd_kernel(x3, w, y.reshape(x3.shape), _BLOCK)
    return y


def prelu_backward(dy, x, weight):
    """``(dx, dw)``: ``dx`` in ``dy.dtype``; ``dw`` float64 of ``weight``'s size, this block's
    ``sum(x * dy)`` over ``x <= 0`` per channel (a partial sum: the caller sums it over the
    ranks)."""
    x, x3, w = _prelu_operands(x, weight)
    dy = _any_float("dy", dy)
    _same_shape("dy", dy, "x", x)
    dx = _pool.empty(dy.shape, dy.dtype)
    part = _prelu_bwd_kernel(np.ascontiguousarray(dy).reshape(x3.shape), x3, w,
                             dx.reshape(x3.shape), _BLOCK)
    return dx, part.sum(axis=(0, 2))
