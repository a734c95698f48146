"""GPU losses on CuPy arrays: the functions and contracts of :mod:`..cpu.losses`
(``class_ce_forward``/``class_ce_backward``, ``prob_ce_forward``/``prob_ce_backward``,
``pointwise_loss_forward``/``pointwise_loss_backward``, ``dice_sums``/``dice_backward``) with
the RawKernels of ``kernels/losses.cu``.

Inputs float16, float32 or float64 (float16 computed in double like the rest); targets,
weights and incoming gradients are converted to float64 (labels to int64) on the device;
losses and sums are float64, gradients have the input's dtype.  Per rank, no MPI.  CuPy is
reached through :func:`.rawmodules.cupy` at call time (the host tests run these wrappers on
NumPy through it).
"""
from __future__ import annotations

import math

import numpy as np

from . import rawmodules as rm

__all__ = ["class_ce_forward", "class_ce_backward", "prob_ce_forward", "prob_ce_backward",
           "pointwise_loss_forward", "pointwise_loss_backward", "dice_sums", "dice_backward"]

POINTWISE_LOSSES = ("mse", "l1", "smooth_l1", "huber", "bce_with_logits", "bce")
DICE_ACTIVATIONS = ("none", "softmax", "sigmoid")
_MODULE = "losses"


def _input(cp, x):
    if not isinstance(x, cp.ndarray):
        raise TypeError(f"x must be a cupy.ndarray, got {type(x).__name__}")
    if x.ndim < 2:
        raise ValueError(f"x must have layout (N, C, *spatial), got shape {x.shape}")
    x = cp.ascontiguousarray(x)
    return x, rm.ctype(x.dtype, _MODULE)


def _ncs(shape):
    return shape[0], shape[1], math.prod(shape[2:])


def _f64(cp, a, size=None):
    """``a`` as a C-contiguous float64 device array (a 1-element dummy for None)."""
    if a is None:
        return cp.zeros(1)
    a = cp.ascontiguousarray(cp.asarray(a, dtype=cp.float64))
    if size is not None and a.size != size:
        raise ValueError(f"expected {size} elements, got {a.size}")
    return a


def _labels(cp, lab, size):
    lab = cp.ascontiguousarray(cp.asarray(lab, dtype=cp.int64))
    if lab.size != size:
        raise ValueError(f"labels must have {size} elements, got {lab.size}")
    return lab


def _grad_in(cp, gvox, size):
    return (cp.zeros(1), np.int32(0)) if gvox is None else (_f64(cp, gvox, size), np.int32(1))


def class_ce_forward(x, labels, weight, ignore_index, label_smoothing=0.0, log_input=False):
    """Per-voxel loss and denominator term (float64 ``(N, *S)``); see the CPU twin."""
    cp = rm.cupy()
    x, T = _input(cp, x)
    N, C, S = _ncs(x.shape)
    loss = cp.empty(N * S)
    den = cp.empty(N * S)
    rm.launch(rm.kernel(_MODULE, f"class_ce_forward<{T}>"), N * S,
              (x, _labels(cp, labels, N * S), _f64(cp, weight, C), loss, den)
              + rm.i64(C, S, N * S, int(ignore_index))
              + (np.float64(label_smoothing), np.int32(bool(log_input))))
    shape = (N,) + x.shape[2:]
    return loss.reshape(shape), den.reshape(shape)


def class_ce_backward(x, labels, weight, ignore_index, label_smoothing=0.0, log_input=False,
                      gvox=None, gscale=1.0):
    cp = rm.cupy()
    x, T = _input(cp, x)
    N, C, S = _ncs(x.shape)
    dx = cp.empty_like(x)
    g, per = _grad_in(cp, gvox, N * S)
    rm.launch(rm.kernel(_MODULE, f"class_ce_backward<{T}>"), N * S,
              (x, _labels(cp, labels, N * S), _f64(cp, weight, C), g, per,
               np.float64(gscale), dx) + rm.i64(C, S, N * S, int(ignore_index))
              + (np.float64(label_smoothing), np.int32(bool(log_input))))
    return dx


def prob_ce_forward(x, target, weight, label_smoothing=0.0):
    cp = rm.cupy()
    x, T = _input(cp, x)
    N, C, S = _ncs(x.shape)
    loss = cp.empty(N * S)
    rm.launch(rm.kernel(_MODULE, f"prob_ce_forward<{T}>"), N * S,
              (x, _f64(cp, target, x.size), _f64(cp, weight, C), loss)
              + rm.i64(C, S, N * S) + (np.float64(label_smoothing),))
    return loss.reshape((N,) + x.shape[2:])


def prob_ce_backward(x, target, weight, label_smoothing=0.0, gvox=None, gscale=1.0):
    cp = rm.cupy()
    x, T = _input(cp, x)
    N, C, S = _ncs(x.shape)
    dx = cp.empty_like(x)
    g, per = _grad_in(cp, gvox, N * S)
    rm.launch(rm.kernel(_MODULE, f"prob_ce_backward<{T}>"), N * S,
              (x, _f64(cp, target, x.size), _f64(cp, weight, C), g, per, np.float64(gscale),
               dx) + rm.i64(C, S, N * S) + (np.float64(label_smoothing),))
    return dx


def _op(name, param):
    try:
        op = POINTWISE_LOSSES.index(name)
    except ValueError:
        raise ValueError(f"unknown elementwise loss {name!r}; known: {POINTWISE_LOSSES}") \
            from None
    return 1 if op == 2 and float(param) == 0.0 else op


def _flat_input(cp, x):
    if not isinstance(x, cp.ndarray):
        raise TypeError(f"x must be a cupy.ndarray, got {type(x).__name__}")
    x = cp.ascontiguousarray(x)
    return x, rm.ctype(x.dtype, _MODULE)


def pointwise_loss_forward(name, x, target, param=1.0, weight=None, pos_weight=None):
    """Per-element loss (float64, ``x``'s shape); see the CPU twin."""
    cp = rm.cupy()
    x, T = _flat_input(cp, x)
    if tuple(target.shape) != tuple(x.shape):
        raise ValueError(f"target shape {target.shape} != input shape {x.shape}")
    op = _op(name, param)
    out = cp.empty(x.shape)
    rm.launch(rm.kernel(_MODULE, f"pointwise_loss_forward<{T}>"), x.size,
              (x, _f64(cp, target, x.size), _f64(cp, weight, None if weight is None else x.size),
               _f64(cp, pos_weight, None if pos_weight is None else x.size), out,
               np.int64(x.size), np.int32(op), np.float64(param),
               np.int32(weight is not None), np.int32(pos_weight is not None)))
    return out


def pointwise_loss_backward(name, x, target, param=1.0, weight=None, pos_weight=None,
                            gvox=None, gscale=1.0):
    cp = rm.cupy()
    x, T = _flat_input(cp, x)
    op = _op(name, param)
    dx = cp.empty_like(x)
    g, per = _grad_in(cp, gvox, x.size)
    rm.launch(rm.kernel(_MODULE, f"pointwise_loss_backward<{T}>"), x.size,
              (x, _f64(cp, target, x.size), _f64(cp, weight, None if weight is None else x.size),
               _f64(cp, pos_weight, None if pos_weight is None else x.size), g, per,
               np.float64(gscale), dx, np.int64(x.size), np.int32(op), np.float64(param),
               np.int32(weight is not None), np.int32(pos_weight is not None)))
    return dx


def _dice_target(cp, x, target):
    """``(tg, lab, use_lab)`` device operands of a float target or integer labels."""
    N, C, S = _ncs(x.shape)
    if np.dtype(target.dtype).kind in "iu":
        return cp.zeros(1), _labels(cp, target, N * S), np.int32(1)
    return _f64(cp, target, x.size), cp.zeros(1, dtype=cp.int64), np.int32(0)


def dice_sums(x, target, activation="softmax", squared=False):
    """Float64 ``(N, C, 3)`` sums ``[p*t, p (p^2), t (t^2)]`` over this block's positions."""
    cp = rm.cupy()
    x, T = _input(cp, x)
    N, C, S = _ncs(x.shape)
    act = DICE_ACTIVATIONS.index(activation)
    if N * C * S == 0:
        return cp.zeros((N, C, 3))
    tg, lab, use_lab = _dice_target(cp, x, target)
    lse = cp.zeros(1)
    if act == 1:
        lse = cp.empty(N * S)
        rm.launch(rm.kernel(_MODULE, f"channel_lse<{T}>"), N * S, (x, lse) + rm.i64(C, S, N * S))
    blocks = max(1, min((S + rm.BLOCK - 1) // rm.BLOCK, 64))
    part = cp.empty((N, blocks, C, 3))
    rm.kernel(_MODULE, f"dice_partial<{T}>")(
        (blocks, min(N, 65535)), (rm.BLOCK,),
        (x, tg, lab, lse, use_lab, np.int32(act), np.int32(bool(squared)), part)
        + rm.i64(N, C, S))
    return part.sum(axis=1)


def dice_backward(x, target, alpha, beta, activation="softmax", squared=False):
    """Gradient in ``x`` for the float64 ``(N, C)`` coefficients; see the CPU twin."""
    cp = rm.cupy()
    x, T = _input(cp, x)
    N, C, S = _ncs(x.shape)
    tg, lab, use_lab = _dice_target(cp, x, target)
    dx = cp.empty_like(x)
    rm.launch(rm.kernel(_MODULE, f"dice_backward<{T}>"), N * S,
              (x, tg, lab, use_lab, np.int32(DICE_ACTIVATIONS.index(activation)),
               np.int32(bool(squared)), _f64(cp, alpha, N * C), _f64(cp, beta, N * C), dx)
              + rm.i64(C, S, N * S))
    return dx
