"""CPU local kernels of the activations whose derivative is a function of the input (GELU,
SiLU, Softplus, Mish, Hardswish, Hardsigmoid) and of PReLU (one rank, no MPI; Numba).

Contract (as :mod:`.pointwise`): data inputs float32 or float64 (``TypeError`` otherwise),
results in the dtype of the primary input (``x`` forward, ``dy`` backward), new C-contiguous
arrays, any shape (PReLU: ``(N, C, *spatial)`` when it has one weight per channel), empty
inputs fine.  Every element is computed in float64 and rounded once; PReLU's weight gradient
is accumulated in float64 per channel over fixed blocks combined in a fixed order, so it does
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
def _sigmoid(v):
    if v >= 0.0:
        return 1.0 / (1.0 + math.exp(-v))
    e = math.exp(v)
    return e / (1.0 + e)


@njit(cache=True, inline="always")
def _softplus1(v):
    # log1p(exp(v)) without overflow (PyTorch's mish uses no threshold)
    return v + math.log1p(math.exp(-v)) if v > 0.0 else math.log1p(math.exp(v))


@njit(cache=True)
def _forward_value(op, v, beta, threshold):
    if op == 0:
        return 0.5 * v * (1.0 + math.erf(v * _SQRT1_2))
    if op == 1:
        return 0.5 * v * (1.0 + math.tanh(_K_TANH * (v + _KAPPA * v * v * v)))
    if op == 2:
        return v * _sigmoid(v)
    if op == 3:
        bv = beta * v
        return v if bv > threshold else math.log1p(math.exp(bv)) / beta
    if op == 4:
        return v * math.tanh(_softplus1(v))
    if op == 5:
        return v * min(max(v + 3.0, 0.0), 6.0) / 6.0
    return min(max(v + 3.0, 0.0), 6.0) / 6.0


@njit(cache=True)
def _derivative(op, v, beta, threshold):
    if op == 0:
        return 0.5 * (1.0 + math.erf(v * _SQRT1_2)) + v * _INV_SQRT_2PI * math.exp(-0.5 * v * v)
    if op == 1:
        x2 = v * v
        t = math.tanh(_K_TANH * (v + _KAPPA * x2 * v))
        return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * _K_TANH * (1.0 + 3.0 * _KAPPA * x2)
    if op == 2:
        s = _sigmoid(v)
        return s * (1.0 + v * (1.0 - s))
    if op == 3:
        bv = beta * v
        return 1.0 if bv > threshold else _sigmoid(bv)
    if op == 4:
        t = math.tanh(_softplus1(v))
        return t + v * _sigmoid(v) * (1.0 - t * t)
    if op == 5:
        if v != v:             # NaN propagates (PyTorch's vectorized kernel)
            return v
        if v <= -3.0:          # PyTorch 2.13's kinks: 0 at -3, 1 at 3
            return 0.0
        return v / 3.0 + 0.5 if v < 3.0 else 1.0
    return 1.0 / 6.0 if -3.0 < v < 3.0 else 0.0


@njit(parallel=True, cache=True)
def _fwd_kernel(x, y, op, beta, threshold, block):
    n = x.shape[0]
    nb = (n + block - 1) // block
    for b in prange(nb):
        for i in range(b * block, min(n, b * block + block)):
            y[i] = _forward_value(op, np.float64(x[i]), beta, threshold)


@njit(parallel=True, cache=True)
def _bwd_kernel(dy, x, dx, op, beta, threshold, block):
    n = dy.shape[0]
    nb = (n + block - 1) // block
    for b in prange(nb):
        for i in range(b * block, min(n, b * block + block)):
            dx[i] = np.float64(dy[i]) * _derivative(op, np.float64(x[i]), beta, threshold)


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
    y = np.empty(x.shape, dtype=x.dtype)
    _fwd_kernel(_flat(x), y.reshape(-1), op, float(beta), float(threshold), _BLOCK)
    return y


def pointwise_activation_backward(name, dy, x, beta=1.0, threshold=20.0):
    """``dx = dy * activation'(x)`` (``dy.dtype``; ``x`` of ``dy``'s shape)."""
    op = _op(name)
    dy, x = _any_float("dy", dy), _any_float("x", x)
    _same_shape("x", x, "dy", dy)
    dx = np.empty(dy.shape, dtype=dy.dtype)
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
    y = np.empty(x.shape, dtype=x.dtype)
    _prelu_fwd_kernel(x3, w, y.reshape(x3.shape), _BLOCK)
    return y


def prelu_backward(dy, x, weight):
    """``(dx, dw)``: ``dx`` in ``dy.dtype``; ``dw`` float64 of ``weight``'s size, this block's
    ``sum(x * dy)`` over ``x <= 0`` per channel (a partial sum: the caller sums it over the
    ranks)."""
    x, x3, w = _prelu_operands(x, weight)
    dy = _any_float("dy", dy)
    _same_shape("dy", dy, "x", x)
    dx = np.empty(dy.shape, dtype=dy.dtype)
    part = _prelu_bwd_kernel(np.ascontiguousarray(dy).reshape(x3.shape), x3, w,
                             dx.reshape(x3.shape), _BLOCK)
    return dx, part.sum(axis=(0, 2))
