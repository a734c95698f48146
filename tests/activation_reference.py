"""Serial float64 NumPy re-implementations of PyTorch 2.13's GELU (exact, tanh), SiLU,
Softplus, Mish, Hardswish, Hardsigmoid and PReLU (values and derivatives), written from their
definitions, for the tests of ``disttensor.nn.activation`` (tests/mpi/test_nn_activations.py)
and its kernels (tests/unit/test_local_cpu_activations_more.py)."""
from __future__ import annotations

import math

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sig(v):
    return 0.5 * (1 + np.tanh(0.5 * v))


def _softplus1(v):
    return np.logaddexp(0.0, v)


def reference(name, x, beta=1.0, threshold=20.0):
    """(y, dy/dx) of activation ``name`` at ``x``."""
    k = math.sqrt(2 / math.pi)
    if name == "gelu":
        cdf = 0.5 * (1 + _erf(x / math.sqrt(2)))
        return x * cdf, cdf + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    if name == "gelu_tanh":
        t = np.tanh(k * (x + 0.044715 * x ** 3))
        return (0.5 * x * (1 + t),
                0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x))
    if name == "silu":
        s = _sig(x)
        return x * s, s * (1 + x * (1 - s))
    if name == "softplus":
        big = beta * x > threshold
        return (np.where(big, x, _softplus1(beta * x) / beta),
                np.where(big, 1.0, _sig(beta * x)))
    if name == "mish":
        t = np.tanh(_softplus1(x))
        return x * t, t + x * _sig(x) * (1 - t * t)
    if name == "hardswish":
        return (x * np.clip(x + 3, 0, 6) / 6,
                np.where(x <= -3, 0.0, np.where(x < 3, x / 3 + 0.5, 1.0)))
    assert name == "hardsigmoid"
    return np.clip(x + 3, 0, 6) / 6, np.where((x > -3) & (x < 3), 1 / 6, 0.0)


def prelu_reference(x, w, dy):
    wc = w.reshape((1, -1) + (1,) * (x.ndim - 2)) if w.size > 1 else w.reshape(())
    y = np.where(x > 0, x, wc * x)
    dx = np.where(x > 0, dy, wc * dy)
    axes = tuple(i for i in range(x.ndim) if i != 1) if w.size > 1 else None
    dw = np.where(x > 0, 0.0, x * dy).sum(axis=axes)
    return y, dx, np.atleast_1d(dw)
