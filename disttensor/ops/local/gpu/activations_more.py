"""GPU activations whose derivative is a function of the input, and PReLU, on CuPy arrays: the
contracts of :mod:`..cpu.activations_more` (``pointwise_activation_forward``/``_backward``,
``prelu_forward``/``prelu_backward``) with the RawKernels of ``kernels/activations_more.cu``.

Outputs have the input dtype (float16, float32, float64), computed in float32 for float16 and
float32 (the CPU kernels compute in float64); PReLU's weight gradient is a float64 sum per
channel of per-element terms (CuPy's reduction).  Per rank, no MPI.
"""
from __future__ import annotations

import numpy as np

from .rawmodules import ctype, cupy, i64, kernel, launch

POINTWISE_ACTIVATIONS = ("gelu", "gelu_tanh", "silu", "softplus", "mish", "hardswish",
                         "hardsigmoid")
_CODES = {name: i for i, name in enumerate(POINTWISE_ACTIVATIONS)}


def _code(name):
    if name not in _CODES:
        raise ValueError(f"unknown activation {name!r}; valid names: "
                         f"{', '.join(POINTWISE_ACTIVATIONS)}")
    return _CODES[name]


def _array(cp, a, what):
    if not isinstance(a, cp.ndarray):
        raise TypeError(f"{what} must be a cupy.ndarray, got {type(a).__name__}")
    return cp.ascontiguousarray(a)


def pointwise_activation_forward(name, x, beta=1.0, threshold=20.0):
    """Activation ``name`` of ``x`` (any shape), ``x``'s dtype."""
    cp = cupy()
    op = _code(name)
    x = _array(cp, x, "x")
    T = ctype(x.dtype, "activations_more")
    y = cp.empty_like(x)
    launch(kernel("activations_more", f"pointwise_activation_forward<{T}>"), x.size,
           (x, y, np.int64(x.size), np.int32(op), np.float64(beta), np.float64(threshold)))
    return y


def pointwise_activation_backward(name, dy, x, beta=1.0, threshold=20.0):
    """``dy * activation'(x)``, ``dy``'s dtype."""
    cp = cupy()
    op = _code(name)
    dy, x = _array(cp, dy, "dy"), _array(cp, x, "x")
    if x.shape != dy.shape or x.dtype != dy.dtype:
        raise ValueError(f"x must match dy: {x.shape} {x.dtype} vs {dy.shape} {dy.dtype}")
    T = ctype(dy.dtype, "activations_more")
    dx = cp.empty_like(dy)
    launch(kernel("activations_more", f"pointwise_activation_backward<{T}>"), dy.size,
           (dy, x, dx, np.int64(dy.size), np.int32(op), np.float64(beta),
            np.float64(threshold)))
    return dx


def _prelu_geometry(x, w):
    if w.size == 1:
        return 1, max(x.size, 1)
    if x.ndim < 2 or x.shape[1] != w.size:
        raise ValueError(f"prelu: {w.size} weights for input of shape {x.shape}")
    return w.size, int(np.prod(x.shape[2:], dtype=np.int64))


def prelu_forward(x, weight):
    """``x if x > 0 else weight[c] * x``."""
    cp = cupy()
    x = _array(cp, x, "x")
    w = cp.ascontiguousarray(cp.asarray(weight, dtype=cp.float64).reshape(-1))
    C, S = _prelu_geometry(x, w)
    T = ctype(x.dtype, "activations_more")
    y = cp.empty_like(x)
    launch(kernel("activations_more", f"prelu_forward<{T}>"), x.size,
           (x, w, y) + i64(C, S, x.size))
    return y


def prelu_backward(dy, x, weight):
    """``(dx, dw)``, ``dw`` float64 of the weight's size (this block's partial sum)."""
    cp = cupy()
    dy, x = _array(cp, dy, "dy"), _array(cp, x, "x")
    if x.shape != dy.shape or x.dtype != dy.dtype:
        raise ValueError(f"x must match dy: {x.shape} {x.dtype} vs {dy.shape} {dy.dtype}")
    w = cp.ascontiguousarray(cp.asarray(weight, dtype=cp.float64).reshape(-1))
    C, S = _prelu_geometry(x, w)
    T = ctype(x.dtype, "activations_more")
    dx = cp.empty_like(dy)
    contrib = cp.empty(x.size, dtype=cp.float64)
    launch(kernel("activations_more", f"prelu_backward<{T}>"), x.size,
           (dy, x, w, dx, contrib) + i64(C, S, x.size))
    if C == 1:
        return dx, contrib.sum().reshape(1)
    return dx, contrib.reshape(-1, C, S).sum(axis=(0, 2))
