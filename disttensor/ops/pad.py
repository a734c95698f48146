"""Distributed padding (``torch.nn.functional.pad``), forward and backward.

``pad`` lists ``(lo, hi)`` pairs from the *last* axis backwards, as PyTorch's; negative entries
crop.  Modes ``'constant'`` (any axis, ``value`` default 0), ``'reflect'`` (the edge cell not
repeated: ``np.pad``'s ``'reflect'``), ``'replicate'`` (``'edge'``) and ``'circular'``
(``'wrap'``), the latter three on every spatial axis of an ``(N, C, *S)`` array, no more and
no fewer, as PyTorch for batched input.

The work is :func:`disttensor.routines.padding.halo_pad` (shared with ``dt.pad``): cropping
keeps each block's part of the kept range, the pad cells go to the first and last blocks of an
axis, filled through the halo exchange (periodic for circular) and
:class:`disttensor.core.halo.EdgeFill`; the backward is its adjoint
(:func:`~disttensor.routines.padding.halo_pad_adjoint`).

Bad input raises on every rank: reflect padding not narrower than the (cropped) axis,
circular wider than it (PyTorch: "wrapping around more than once"), replicate wider than the
axis (here only: one halo exchange fetches the padding), a value with a non-constant mode.
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry
from ..routines.padding import HaloPad, halo_pad, halo_pad_adjoint
from ._spatial import check_gradient_layout

__all__ = ["pad_forward", "pad_backward", "pad", "normalize_pad"]

MODES = ("constant", "reflect", "replicate", "circular")
_NUMPY_MODE = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
               "circular": "wrap"}


def normalize_pad(pad, shape, mode: str) -> tuple[tuple[int, int], ...]:
    """PyTorch's ``pad`` sequence as one ``(lo, hi)`` pair per tensor axis (pure; raises as
    PyTorch on a bad sequence or mode)."""
    if mode not in MODES:
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    pad = tuple(pad)
    for v in pad:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"pad must be a tuple of ints, but found element of type "
                            f"{type(v).__name__}")
    ndim = len(shape)
    if len(pad) % 2:
        raise ValueError("Padding length must be divisible by 2")
    if len(pad) // 2 > ndim:
        raise ValueError("Padding length should be less than or equal to two times the "
                         f"input dimension but got padding length {len(pad)} and input of "
                         f"dimension {ndim}")
    if mode != "constant" and len(pad) != 2 * (ndim - 2):
        raise NotImplementedError(
            f"Padding size {len(pad)} is not supported for {ndim}D input tensor: mode {mode!r} "
            f"pads every spatial axis of an (N, C, *S) array (padding size {2 * (ndim - 2)})")
    pairs = [(0, 0)] * ndim
    for k in range(len(pad) // 2):
        pairs[ndim - 1 - k] = (int(pad[2 * k]), int(pad[2 * k + 1]))
    for t, (lo, hi) in enumerate(pairs):
        kept = shape[t] + min(lo, 0) + min(hi, 0)
        if kept < 0:
            raise ValueError(f"padding {(lo, hi)} crops more than the extent {shape[t]} of "
                             f"axis {t}")
        if mode == "reflect" and max(lo, hi) >= kept and (lo > 0 or hi > 0):
            raise ValueError(f"Padding size should be less than the corresponding input "
                             f"dimension, but got: padding ({lo}, {hi}) at dimension {t} of "
                             f"input {list(shape)}")
        if mode == "circular" and max(lo, hi) > kept:
            raise ValueError(f"Padding value causes wrapping around more than once: padding "
                             f"({lo}, {hi}) at dimension {t} of input {list(shape)}")
        if mode == "replicate" and max(lo, hi) > kept:
            raise ValueError(f"replicate padding ({lo}, {hi}) wider than dimension {t} "
                             f"({kept} cells) is not supported")
        if mode != "constant" and kept == 0 and (lo > 0 or hi > 0):
            raise ValueError(f"mode {mode!r} cannot pad the empty dimension {t}")
    return tuple(pairs)


@collective_entry
def pad_forward(x: DistArray, pad, mode: str = "constant", value=None):
    """``torch.nn.functional.pad(x, pad, mode, value)`` (see the module docstring).
    Collective.  Returns ``(y, saved)``: ``saved`` is the
    :class:`disttensor.routines.padding.HaloPad` state of the padding."""
    with agreed(x.grid.cart, "pad_forward", x=x, pad=canon(pad), mode=mode,
                value=canon(value)):
        if value is not None and mode != "constant":
            raise ValueError(f'Padding mode "{mode}" doesn\'t take in value argument')
        pairs = normalize_pad(pad, x.shape, mode)
        if mode != "constant" and x.split[1] is not None:
            raise ValueError("pad: the channel axis (1) must not be split")
    return halo_pad(x, pairs, _NUMPY_MODE[mode], 0.0 if value is None else value)


@collective_entry
def pad_backward(saved: HaloPad, dy: DistArray) -> DistArray:
    """Gradient with respect to the padding input for the output gradient ``dy``
    (distributed like the output).  Collective (the adjoint exchanges of the forward)."""
    with agreed(dy.grid.cart, "pad_backward", dy=dy, mode=saved.mode):
        check_gradient_layout(dy, saved.out_dist, "pad")
    return halo_pad_adjoint(saved, dy)


def pad(x: DistArray, pad, mode: str = "constant", value=None) -> DistArray:
    """:func:`pad_forward` without the saved state."""
    return pad_forward(x, pad, mode, value)[0]
