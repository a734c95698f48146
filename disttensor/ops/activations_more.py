"""GELU, SiLU, Softplus, Mish, Hardswish, Hardsigmoid and PReLU on DistArrays, forward and
backward side by side (PyTorch 2.13's formulas: :mod:`.local.cpu.activations_more`).

Elementwise on each rank's block: the output has the input's distribution, any layout, any
split (PReLU with one weight per channel needs ``(N, C, *spatial)`` with the channel axis not
split).  Their derivatives are functions of the input, so the backward keeps ``x`` (the
``saved`` dataclasses), unlike :mod:`.activations`' relu/sigmoid/tanh which keep only ``y``.

Argument agreement (``docs/ops.md``): the activations with a hyper-parameter (``softplus``:
``beta``, ``threshold``; ``gelu``: ``approximate``, which picks the kernel) agree on it with
one small all-reduce forward and backward, as ``leaky_relu``/``elu`` do; the others take only
the input and send no message.  PReLU agrees on the weight's shape and dtype forward and
backward, and its backward sums the weight gradient over the ranks holding different parts
of ``x`` with one all-reduce (``reduce=False``: per-rank partial sums, for a data-parallel
reducer's bucketed all-reduce).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from ..core.array import DistArray
from ..core.comm import allreduce
from ..core.entry import agreed, collective_entry
from .local import kernels_for
from ._spatial import array_key, check_gradient_layout, meaning, param_comm

__all__ = ["POINTWISE_ACTIVATIONS", "PointwiseActivationSaved", "PReLUSaved",
           "pointwise_activation_forward", "pointwise_activation_backward", "prelu_forward",
           "prelu_backward", "gelu", "silu", "softplus", "mish", "hardswish", "hardsigmoid",
           "prelu"]

POINTWISE_ACTIVATIONS = ("gelu", "gelu_tanh", "silu", "softplus", "mish", "hardswish",
                         "hardsigmoid")
_WITH_PARAMETERS = ("gelu", "gelu_tanh", "softplus")


@dataclass
class PointwiseActivationSaved:
    name: str
    x: DistArray          # the input: every derivative here is a function of it
    beta: float
    threshold: float


@dataclass
class PReLUSaved:
    x: DistArray
    weight: object        # the replicated weight, in x's dtype, on x's device


def _real(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(float(v)):
        raise TypeError(f"{name} must be a real number, got {v!r}")
    return float(v)


def _agreed(comm, call, name, beta, threshold, **arrays):
    if name in _WITH_PARAMETERS:
        return agreed(comm, call, name=name, beta=meaning(float, beta),
                      threshold=meaning(float, threshold), **arrays)
    return contextlib.nullcontext()


@collective_entry
def pointwise_activation_forward(name: str, x: DistArray, beta: float = 1.0,
                                 threshold: float = 20.0):
    """``name`` of :data:`POINTWISE_ACTIVATIONS` applied to ``x`` (``beta``/``threshold``:
    softplus's, ignored by the others).  No data moves; collective for gelu and softplus only
    (agreement).  Returns ``(y, saved)``."""
    with _agreed(x.grid.cart, "pointwise_activation_forward", name, beta, threshold, x=x):
        if name not in POINTWISE_ACTIVATIONS:
            raise ValueError(f"unknown activation {name!r}; choose one of "
                             f"{POINTWISE_ACTIVATIONS}")
        beta, threshold = _real("beta", beta), _real("threshold", threshold)
        if name == "softplus" and beta == 0:
            raise ValueError("softplus: beta must not be 0")
    y = kernels_for(x.local).pointwise_activation_forward(name, x.local, beta, threshold)
    return (DistArray(y, x.distribution, x.grid),
            PointwiseActivationSaved(name, x, beta, threshold))


@collective_entry
def pointwise_activation_backward(saved: PointwiseActivationSaved, dy: DistArray) -> DistArray:
    """Gradient with respect to the input of :func:`pointwise_activation_forward`
    (collective for gelu and softplus only)."""
    x = saved.x
    with _agreed(dy.grid.cart, "pointwise_activation_backward", saved.name, saved.beta,
                 saved.threshold, dy=dy):
        check_gradient_layout(dy, x.distribution, saved.name)
    dx = kernels_for(dy.local).pointwise_activation_backward(saved.name, dy.local, x.local,
                                                             saved.beta, saved.threshold)
    return DistArray(dx, x.distribution, x.grid)


def _prelu_checks(x: DistArray, weight) -> None:
    shape = tuple(getattr(weight, "shape", ()))
    if len(shape) != 1 or shape[0] < 1:
        raise ValueError(f"prelu: weight must be a 1-D array (1 or C values), got shape {shape}")
    if shape[0] > 1:
        if x.ndim < 2 or x.shape[1] != shape[0]:
            raise ValueError("Mismatch of parameter numbers and input channel size. Found "
                             f"parameter numbers = {shape[0]} and channel size = "
                             f"{x.shape[1] if x.ndim > 1 else 1}.")
        if x.split[1] is not None:
            raise ValueError(f"prelu: the channel axis (1) must not be split (split={x.split}) "
                             "with one weight per channel; redistribute first")


@collective_entry
def prelu_forward(x: DistArray, weight):
    """``x if x > 0 else weight[c] * x`` (``weight``: a replicated 1-D array of 1 or C values on
    ``x``'s device).  Collective (agreement on the weight's shape).  Returns ``(y, saved)``."""
    with agreed(x.grid.cart, "prelu_forward", x=x, weight=array_key(weight)):
        _prelu_checks(x, weight)
    w = weight if weight.dtype == x.dtype else weight.astype(x.dtype)
    y = kernels_for(x.local).prelu_forward(x.local, w)
    return DistArray(y, x.distribution, x.grid), PReLUSaved(x, w)


@collective_entry
def prelu_backward(saved: PReLUSaved, dy: DistArray, need_dx: bool = True,
                   need_dw: bool = True, reduce: bool = True):
    """``(dx, dw)`` (either ``None`` when not needed).  ``dw`` (float64, the weight's size) is
    summed over the ranks holding different parts of ``x`` (one all-reduce), or is this
    rank's partial sum with ``reduce=False``.  Collective."""
    x = saved.x
    with agreed(dy.grid.cart, "prelu_backward", rank_local=True, dy=dy, need_dx=bool(need_dx),
                need_dw=bool(need_dw), reduce=bool(reduce), weight=array_key(saved.weight)):
        check_gradient_layout(dy, x.distribution, "prelu")
        dx, dw = kernels_for(dy.local).prelu_backward(dy.local, x.local, saved.weight)
    if need_dw and reduce:
        dw = allreduce(param_comm(x), dw, "sum")
    return (DistArray(dx, x.distribution, x.grid) if need_dx else None,
            dw if need_dw else None)


# -- forward-only conveniences (PyTorch's functional names) ----------------------------------
def gelu(x: DistArray, approximate: str = "none") -> DistArray:
    if approximate not in ("none", "tanh"):
        raise ValueError("approximate argument must be either none or tanh.")
    return pointwise_activation_forward("gelu" if approximate == "none" else "gelu_tanh", x)[0]


def silu(x: DistArray) -> DistArray:
    return pointwise_activation_forward("silu", x)[0]


def softplus(x: DistArray, beta: float = 1.0, threshold: float = 20.0) -> DistArray:
    return pointwise_activation_forward("softplus", x, beta, threshold)[0]


def mish(x: DistArray) -> DistArray:
    return pointwise_activation_forward("mish", x)[0]


def hardswish(x: DistArray) -> DistArray:
    return pointwise_activation_forward("hardswish", x)[0]


def hardsigmoid(x: DistArray) -> DistArray:
    return pointwise_activation_forward("hardsigmoid", x)[0]


def prelu(x: DistArray, weight) -> DistArray:
    return prelu_forward(x, weight)[0]
