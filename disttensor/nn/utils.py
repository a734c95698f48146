"""Gradient clipping (PyTorch's ``torch.nn.utils.clip_grad_norm_`` and ``clip_grad_value_``).

Gradients of :mod:`disttensor.nn` parameters are replicated: after the backward pass has
all-reduced them, every rank holds the same full gradient arrays. So the total norm is computed
locally, with no communication, and every rank finds the same norm and applies the same
scaling. (Calling these on gradients that still differ between ranks would clip each rank
differently: clip after the all-reduce.)
"""
from __future__ import annotations

import math

from ..core.backend import array_module

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _grads(parameters) -> list:
    if hasattr(parameters, "grad") and hasattr(parameters, "data"):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def _power_sum(g, norm_type: float) -> float:
    """``sum(|g|**norm_type)`` of one gradient array accumulated in float64 (``max(|g|)`` for
    the inf norm)."""
    xp = array_module(g)
    if g.size == 0:
        return 0.0
    if norm_type == math.inf:
        return float(xp.abs(g).max())
    a = xp.abs(g.ravel()).astype(xp.float64, copy=False)
    if norm_type == 2.0:
        return float(xp.dot(a, a))
    if norm_type == 1.0:
        return float(a.sum())
    return float((a ** norm_type).sum())


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> float:
    """Scale the gradients of ``parameters`` in place so that their total norm is at most
    ``max_norm``; return the total norm before clipping (a Python float).

    ``parameters`` is a parameter or an iterable of parameters (objects with ``.grad``;
    those whose grad is ``None`` are skipped). The total norm is the ``norm_type``-norm of all
    gradients taken together as one vector (``norm_type`` a positive number or ``math.inf``
    for the max-abs norm). As in PyTorch every gradient is multiplied by
    ``min(1, max_norm / (total_norm + 1e-6))``. A NaN or infinite total norm raises
    ``RuntimeError`` when ``error_if_nonfinite``; otherwise the gradients are multiplied by the
    resulting coefficient (NaN for a NaN norm, 0 for an infinite one) as PyTorch does. The
    norms are accumulated in float64 (a float32 gradient is converted one array at a time).

    The gradients are replicated on every rank (already all-reduced), so the norm is computed
    locally: no communication, and the same result on every rank.
    """
    max_norm = float(max_norm)
    norm_type = float(norm_type)
    if not (norm_type > 0):
        raise ValueError(f"norm_type must be positive or inf, got {norm_type}")
    grads = _grads(parameters)
    if not grads:
        return 0.0
    sums = [_power_sum(g, norm_type) for g in grads]
    if any(math.isnan(x) for x in sums):
        total = math.nan
    elif norm_type == math.inf:
        total = max(sums)
    elif norm_type == 2.0:
        total = math.sqrt(math.fsum(sums))
    else:
        total = math.fsum(sums) ** (1.0 / norm_type)
    if math.isnan(total) or math.isinf(total):
        if error_if_nonfinite:
            raise RuntimeError(
                f"The total norm of order {norm_type} for gradients from `parameters` is "
                "non-finite, so it cannot be clipped. To disable this error and scale the "
                "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")
    coef = max_norm / (total + 1e-6)
    coef = coef if math.isnan(coef) else min(coef, 1.0)
    if coef != 1.0:
        for g in grads:
            g *= coef
    return total


def clip_grad_value_(parameters, clip_value: float) -> None:
    """Clamp every gradient of ``parameters`` in place to ``[-clip_value, clip_value]``
    (grads that are ``None`` are skipped). Element-wise, so no communication is involved;
    gradients are replicated on every rank and stay so."""
    clip_value = float(clip_value)
    if math.isnan(clip_value):
        raise ValueError("clip_value must not be NaN")
    for g in _grads(parameters):
        xp = array_module(g)
        xp.clip(g, -clip_value, clip_value, out=g)
