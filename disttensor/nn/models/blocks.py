"""Pieces shared by the reference models: the spatial size argument, the pooling-depth check,
the dense head (flatten, then Linear -> activation (-> Dropout) per hidden size, then the
output Linear) and the sample-shape check of ``forward``.

Layers are constructed in forward order, so the parameters drawn from a shared ``rng`` (and
their names inside a ``Sequential``) are those of the models' own loops.  Nothing here
communicates.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from ..layers import Dropout, Flatten, Linear
from ..module import Module

__all__ = ["spatial_size", "check_pool_stages", "dense_head", "check_samples"]


def spatial_size(input_size) -> tuple:
    """``(D, H, W)`` of ``input_size``: a cube's extent ``S`` or a ``(D, H, W)`` sequence."""
    return tuple(input_size) if isinstance(input_size, (tuple, list)) else (input_size,) * 3


def check_pool_stages(model: str, size: Sequence[int], stages: int) -> None:
    """Raise ``ValueError`` unless every extent of ``size`` survives ``stages`` poolings by 2
    (``>= 2**stages``)."""
    need = 2 ** stages
    if any(n < need for n in size):
        raise ValueError(f"{model}: input of spatial size {size} is too small for "
                         f"{stages} pooling stages (each extent must be >= {need})")


def dense_head(channels: int, size: Sequence[int], dense: Sequence[int], outputs: int,
               activation: Callable[[], Module], dropout: float = 0.0, seed: int = 0,
               **kw) -> list:
    """``[Flatten, Linear(f, dense[0]), activation(), (Dropout(dropout, seed)), ...,
    Linear(dense[-1], outputs)]`` for a ``(channels, *size)`` input (``f = channels *
    prod(size)`` features); the ``i``-th dropout is seeded ``seed + i``; ``kw`` (dtype, device,
    rng) goes to every Linear."""
    head = [Flatten()]
    f = channels * math.prod(size)
    for i, d in enumerate(dense):
        head += [Linear(f, d, **kw), activation()]
        if dropout:
            head.append(Dropout(dropout, seed=seed + i))
        f = d
    head.append(Linear(f, outputs, **kw))
    return head


def check_samples(model: str, x, input_shape: tuple) -> None:
    """Raise ``ValueError`` unless the samples of ``x`` (``x.shape[1:]``) are ``input_shape``
    ``(C, D, H, W)``."""
    if tuple(x.shape[1:]) != input_shape:
        raise ValueError(f"{model} expects samples of shape {input_shape} "
                         f"(C, D, H, W), got {tuple(x.shape[1:])}")
