"""Elementwise activations, channel softmax and dropout on DistArrays, forward and backward.

All are local to each rank's block (no messages): the output has the input's distribution.
Softmax runs over the channel axis (1), which must not be split.  Dropout draws its mask from
the counter-based :mod:`disttensor.random` generator, so for a seed the mask is the same global
array whatever the grid, the split or the device.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..array import DistArray
from ..random import Generator
from .local import kernels_for
from ._spatial import check_gradient_layout, check_layout

__all__ = ["ACTIVATIONS", "activation", "activation_forward", "activation_backward",
           "relu", "leaky_relu", "elu", "sigmoid", "tanh", "softmax", "softmax_forward",
           "softmax_backward", "log_softmax", "dropout_forward", "dropout_backward",
           "DropoutSaved"]

ACTIVATIONS = ("relu", "leaky_relu", "elu", "sigmoid", "tanh")


def activation_forward(name: str, x: DistArray, alpha=None) -> DistArray:
    """``name`` in :data:`ACTIVATIONS` applied elementwise (``alpha``: negative slope of
    ``leaky_relu``, default 0.01; scale of ``elu``, default 1.0)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {ACTIVATIONS}")
    y = kernels_for(x.local).activation_forward(name, x.local, alpha)
    return DistArray(y, x.distribution, x.grid)


def activation_backward(name: str, dy: DistArray, x: DistArray, y: DistArray, alpha=None
                        ) -> DistArray:
    """Gradient with respect to ``x`` of ``activation_forward(name, x)`` (PyTorch's
    conventions at the kinks: relu'(0) = 0, leaky_relu'(0) = alpha)."""
    check_gradient_layout(dy, x.distribution, name)
    dx = kernels_for(dy.local).activation_backward(name, dy.local, x.local, y.local, alpha)
    return DistArray(dx, x.distribution, x.grid)


def activation(name: str, x: DistArray, alpha=None) -> DistArray:
    return activation_forward(name, x, alpha)


def relu(x: DistArray) -> DistArray:
    return activation_forward("relu", x)


def leaky_relu(x: DistArray, negative_slope: float = 0.01) -> DistArray:
    return activation_forward("leaky_relu", x, negative_slope)


def elu(x: DistArray, alpha: float = 1.0) -> DistArray:
    return activation_forward("elu", x, alpha)


def sigmoid(x: DistArray) -> DistArray:
    return activation_forward("sigmoid", x)


def tanh(x: DistArray) -> DistArray:
    return activation_forward("tanh", x)


# -- channel softmax -----------------------------------------------------------------------------
def softmax_forward(x: DistArray) -> DistArray:
    """Softmax over the channel axis of ``x`` ``(N, C, ...)`` (stable)."""
    check_layout(x, "softmax", min_spatial=0)
    return DistArray(kernels_for(x.local).softmax_channels(x.local), x.distribution, x.grid)


softmax = softmax_forward


def log_softmax(x: DistArray) -> DistArray:
    check_layout(x, "log_softmax", min_spatial=0)
    return DistArray(kernels_for(x.local).log_softmax_channels(x.local), x.distribution, x.grid)


def softmax_backward(dy: DistArray, y: DistArray) -> DistArray:
    """Gradient with respect to the softmax input, from its output ``y``."""
    check_gradient_layout(dy, y.distribution, "softmax")
    dx = kernels_for(dy.local).softmax_channels_backward(dy.local, y.local)
    return DistArray(dx, y.distribution, y.grid)


# -- dropout -------------------------------------------------------------------------------------
@dataclass
class DropoutSaved:
    scaled_mask: object   # local keep-mask / (1 - p), in x's dtype; None when p == 0


def dropout_forward(x: DistArray, p: float, rng: Generator | int, training: bool = True):
    """Zero each element with probability ``p`` and scale the rest by ``1/(1-p)`` (identity
    when not training).  ``rng``: a :class:`disttensor.random.Generator` (advanced by one
    draw; every rank must make the same calls) or an int seed.  Element ``i`` is kept iff the
    generator's uniform ``u[i] >= p``, so the mask is the same global array on any grid.
    Returns ``(y, saved)``."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return x.copy(), DropoutSaved(None)
    if not isinstance(rng, Generator):
        rng = Generator(int(rng))
    d = x.distribution
    u = rng.random(x.shape, dtype="float64", grid=x.grid, split=x.split, sizes=d.split_sizes,
                   device=x.device)
    xp = x.xp
    mask = (u.local >= p).astype(x.dtype) * xp.asarray(1.0 / (1.0 - p), dtype=x.dtype)
    return DistArray(x.local * mask, d, x.grid), DropoutSaved(mask)


def dropout_backward(saved: DropoutSaved, dy: DistArray) -> DistArray:
    if saved.scaled_mask is None:
        return dy.copy()
    return DistArray(dy.local * saved.scaled_mask, dy.distribution, dy.grid)
