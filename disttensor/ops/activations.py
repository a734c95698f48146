"""Elementwise activations, channel softmax and dropout on DistArrays, forward and backward.

All are local to each rank's block (no messages): the output has the input's distribution.
Softmax runs over the channel axis (1), which must not be split.  Dropout draws its mask from
the counter-based :mod:`disttensor.random` generator, so for a seed the mask is the same global
array whatever the grid, the split or the device.

Argument agreement (see "Argument agreement" in ``docs/ops.md``): the activations with a
hyper-parameter (``leaky_relu``, ``elu``: a slope that differed between ranks would compute an
inconsistent global array silently) and dropout (probability, seed and stream; its mask is a
collective random draw anyway) agree on their arguments, forward and backward: dropout with one
small all-reduce, the activations (which move no data) deferred to the next agreement over the
grid (:func:`~disttensor.core.entry.deferrable`), so that they cost no all-reduce.  ``relu``,
``sigmoid`` and ``tanh`` take nothing but the input and defer likewise, on the arrays alone:
a gradient laid out differently on one rank, or a kernel failing there, then raises on every
rank at the next agreement instead of on that rank alone.  The channel softmax takes nothing
but the input, whose metadata the op that produced it agreed on, and makes no agreement.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, deferrable
from ..random import Generator
from .local import kernels_for
from ._spatial import check_gradient_layout, check_layout, meaning

__all__ = ["ACTIVATIONS", "activation", "activation_forward", "activation_backward",
           "relu", "leaky_relu", "elu", "sigmoid", "tanh", "softmax", "softmax_forward",
           "softmax_backward", "log_softmax", "dropout_forward", "dropout_backward",
           "DropoutSaved"]

ACTIVATIONS = ("relu", "leaky_relu", "elu", "sigmoid", "tanh")


HYPER_PARAMETERS = ("leaky_relu", "elu")  # the activations that agree on their arguments


def _agreed(comm, call: str, name, alpha, **arrays):
    """The deferred agreement block of an activation: on its name, its hyper-parameter (for
    those that have one) and the arrays' metadata.  No all-reduce of its own: it rides on
    the next agreement over the grid, and a rank whose block raises agrees at once, so the
    failure raises on every rank."""
    if name in HYPER_PARAMETERS:
        return deferrable(comm, call, name=name,
                          alpha=meaning(lambda a: None if a is None else float(a), alpha),
                          **arrays)
    return deferrable(comm, call, name=canon(name), **arrays)


@collective_entry
def activation_forward(name: str, x: DistArray, alpha=None) -> DistArray:
    """``name`` in :data:`ACTIVATIONS` applied elementwise (``alpha``: negative slope of
    ``leaky_relu``, default 0.01; scale of ``elu``, default 1.0).  No data moves; the
    agreement on the name, ``alpha`` and ``x``'s metadata is deferred to the next one."""
    with _agreed(x.grid.cart, "activation_forward", name, alpha, x=x):
        if name not in ACTIVATIONS:
            raise ValueError(f"unknown activation {name!r}; choose one of {ACTIVATIONS}")
        y = kernels_for(x.local).activation_forward(name, x.local, alpha)
    return DistArray(y, x.distribution, x.grid)


@collective_entry
def activation_backward(name: str, dy: DistArray, x: DistArray, y: DistArray, alpha=None
                        ) -> DistArray:
    """Gradient with respect to ``x`` of ``activation_forward(name, x)`` (PyTorch's
    conventions at the kinks: relu'(0) = 0, leaky_relu'(0) = alpha).  No data moves; the
    agreement on the name, ``alpha`` and ``dy``'s metadata is deferred to the next one."""
    with _agreed(dy.grid.cart, "activation_backward", name, alpha, dy=dy):
        check_gradient_layout(dy, x.distribution, name)
        dx = kernels_for(dy.local).activation_backward(name, dy.local, x.local, y.local,
                                                       alpha)
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
    """Log-softmax over the channel axis of ``x`` ``(N, C, ...)`` (stable)."""
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
    dist: object = None   # the input's (and output's) distribution


@collective_entry
def dropout_forward(x: DistArray, p: float, rng: Generator | int, training: bool = True):
    """Zero each element with probability ``p`` and scale the rest by ``1/(1-p)`` (identity
    when not training).  ``rng``: a :class:`disttensor.random.Generator` (advanced by one
    draw; every rank must make the same calls) or an int seed.  Element ``i`` is kept iff the
    generator's uniform ``u[i] >= p``, so the mask is the same global array on any grid.
    Collective (the ranks agree on ``p``, ``training`` and the generator's seed and stream).
    Returns ``(y, saved)``."""
    seed, stream = (rng.seed, rng.counter) if isinstance(rng, Generator) else (rng, 0)
    with agreed(x.grid.cart, "dropout_forward", x=x, p=meaning(float, p),
                training=bool(training), seed=meaning(int, seed), stream=stream):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return x.copy(), DropoutSaved(None, x.distribution)
    if not isinstance(rng, Generator):
        rng = Generator(int(rng))
    d = x.distribution
    u = rng.random(x.shape, dtype="float64", grid=x.grid, split=x.split, sizes=d.split_sizes,
                   device=x.device)
    xp = x.xp
    mask = (u.local >= p).astype(x.dtype) * xp.asarray(1.0 / (1.0 - p), dtype=x.dtype)
    return DistArray(x.local * mask, d, x.grid), DropoutSaved(mask, d)


@collective_entry
def dropout_backward(saved: DropoutSaved, dy: DistArray) -> DistArray:
    """Gradient with respect to the dropout input (collective only to agree on ``dy``)."""
    with agreed(dy.grid.cart, "dropout_backward", dy=dy,
                masked=saved.scaled_mask is not None):
        if saved.dist is not None:
            check_gradient_layout(dy, saved.dist, "dropout")
    if saved.scaled_mask is None:
        return dy.copy()
    return DistArray(dy.local * saved.scaled_mask, dy.distribution, dy.grid)
