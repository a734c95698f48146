"""GPU activations and channel softmax on CuPy arrays: the contracts of :mod:`..cpu.pointwise`
(``activation_forward``/``activation_backward``, ``softmax_channels``,
``log_softmax_channels``, ``softmax_channels_backward``), with the RawKernels of
``kernels/pointwise.cu``.

Activations take any shape; the softmaxes any layout ``(N, C, *spatial)`` (ndim >= 2), over
axis 1.  Outputs have the input dtype (float16, float32, float64), computed in float32 for
float16.  Per rank, no MPI.
"""
from __future__ import annotations

import numpy as np

from .operands import float_input, float_pair, ncs
from .rawmodules import ctype, cupy, i64, kernel, launch

# name -> (code in pointwise.cu, default alpha, backward reads x, backward reads y)
_ACTIVATIONS = {
    "relu": (0, 0.0, True, False),
    "leaky_relu": (1, 0.01, True, False),
    "elu": (2, 1.0, True, True),
    "sigmoid": (3, 0.0, False, True),
    "tanh": (4, 0.0, False, True),
}


def _activation(name):
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; known: {sorted(_ACTIVATIONS)}") from None


def activation_forward(name, x, alpha=None):
    """relu, leaky_relu (alpha 0.01), elu (alpha 1.0), sigmoid, tanh; x's dtype."""
    cp = cupy()
    code, default, _, _ = _activation(name)
    if not isinstance(x, cp.ndarray):
        raise TypeError(f"x must be a cupy.ndarray, got {type(x).__name__}")
    x = cp.ascontiguousarray(x)
    T = ctype(x.dtype, "pointwise")
    y = cp.empty_like(x)
    a = default if alpha is None else float(alpha)
    launch(kernel("pointwise", f"activation_forward<{T}>"), x.size,
           (x, y, np.int64(x.size), np.int32(code), np.float64(a)))
    return y


def activation_backward(name, dy, x, y, alpha=None):
    """PyTorch gradient conventions: relu ``dy*(x > 0)``; leaky_relu ``dy`` if x > 0 else
    ``alpha*dy``; elu ``dy`` if x > 0 else ``dy*(y + alpha)``; sigmoid ``dy*y*(1-y)``; tanh
    ``dy*(1-y^2)``.  ``y`` may be None (recomputed from ``x``) and ``x`` may be None for sigmoid
    and tanh."""
    cp = cupy()
    code, default, needs_x, needs_y = _activation(name)
    dy = cp.ascontiguousarray(dy)
    if needs_x:
        if x is None:
            raise ValueError(f"{name} backward needs x")
        x = cp.ascontiguousarray(x)
    if needs_y and y is None:
        if x is None:
            raise ValueError(f"{name} backward needs y (or x to recompute it)")
        y = activation_forward(name, x, alpha)
    if y is not None:
        y = cp.ascontiguousarray(y)
    for a, n in ((x, "x"), (y, "y")):
        if a is not None and (a.shape != dy.shape or a.dtype != dy.dtype):
            raise ValueError(f"{n} must match dy: {a.shape} {a.dtype} vs {dy.shape} {dy.dtype}")
    T = ctype(dy.dtype, "pointwise")
    dx = cp.empty_like(dy)
    a = default if alpha is None else float(alpha)
    launch(kernel("pointwise", f"activation_backward<{T}>"), dy.size,
           (dy, x if x is not None else dy, y if y is not None else dy, dx,
            np.int64(dy.size), np.int32(code), np.float64(a)))
    return dx


def _softmax(x, log):
    cp = cupy()
    x = float_input(cp, x, "x")
    N, C, S = ncs(x.shape)
    y = cp.empty_like(x)
    if C == 0:
        return y
    T = ctype(x.dtype, "pointwise")
    launch(kernel("pointwise", f"softmax_channels<{T}>"), N * S,
           (x, y) + i64(C, S, N * S) + (np.int32(log),))
    return y


def softmax_channels(x):
    """Softmax over axis 1."""
    return _softmax(x, 0)


def log_softmax_channels(x):
    """Log-softmax over axis 1."""
    return _softmax(x, 1)


def softmax_channels_backward(dy, y):
    """``dx = y*(dy - sum_c dy*y)`` (the adjoint of :func:`softmax_channels` at output ``y``)."""
    cp = cupy()
    dy, y = float_pair(cp, dy, y, "y")
    N, C, S = ncs(y.shape)
    dx = cp.empty_like(y)
    if C == 0:
        return dx
    T = ctype(y.dtype, "pointwise")
    launch(kernel("pointwise", f"softmax_channels_backward<{T}>"), N * S,
           (dy, y, dx) + i64(C, S, N * S))
    return dx


def add_channel_bias(y, b) -> None:
    """``y[n, c, ...] += b[c]`` in place, ``b`` cast to ``y``'s dtype first (the contract of
    :func:`..cpu.pointwise.add_channel_bias`)."""
    y += b.astype(y.dtype, copy=False).reshape((1, -1) + (1,) * (y.ndim - 2))
