"""Operand checks and geometry shared by the GPU local kernels (conv, pooling, pointwise).

Layout ``(N, C, *spatial)``; conv and pooling take exactly three spatial axes ``(N, C, D, H,
W)``; ``kernel``/``stride``/``dilation``/``pad_lo``/``pad_hi`` are 3-tuples (an int means the
same value on every axis), padding may be asymmetric (negative crops).  Inputs that are not
C-contiguous are copied.  Per rank, no MPI; CuPy is passed in as ``cp`` (never imported here).
"""
from __future__ import annotations

import math

import numpy as np

from .rawmodules import CTYPES


def triple(v, name, minimum=None):
    """``v`` (an int or 3 ints) as a 3-tuple of ints, each ``>= minimum`` when given."""
    if isinstance(v, (int, np.integer)):
        t = (int(v),) * 3
    else:
        t = tuple(int(a) for a in v)
        if len(t) != 3:
            raise ValueError(f"{name} must be an int or 3 ints, got {v!r}")
    if minimum is not None and min(t) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {t}")
    return t


def out_extents(spatial, kernel, stride, dilation, lo, hi):
    """Output extent per axis of a window op: ``(n + lo + hi - d*(k-1) - 1)//s + 1`` (>= 0)."""
    return tuple(max(0, (n + a + b - d * (k - 1) - 1) // s + 1)
                 for n, k, s, d, a, b in zip(spatial, kernel, stride, dilation, lo, hi))


def in_extents(in_spatial):
    """``in_spatial`` (the input extents a backward pass restores) as 3 ints >= 0."""
    in_spatial = tuple(int(n) for n in in_spatial)
    if len(in_spatial) != 3 or min(in_spatial) < 0:
        raise ValueError(f"in_spatial must be 3 extents >= 0, got {in_spatial}")
    return in_spatial


def as_5d(cp, a, what):
    """``a`` as a C-contiguous 5-D CuPy array (``TypeError``/``ValueError`` otherwise)."""
    if not isinstance(a, cp.ndarray):
        raise TypeError(f"{what} must be a cupy.ndarray, got {type(a).__name__}")
    if a.ndim != 5:
        raise ValueError(f"{what} must have layout (N, C, D, H, W), got shape {a.shape}")
    return cp.ascontiguousarray(a)


def as_nc(cp, a, what):
    """``a`` as a C-contiguous CuPy array of layout ``(N, C, ...)``."""
    if not isinstance(a, cp.ndarray):
        raise TypeError(f"{what} must be a cupy.ndarray, got {type(a).__name__}")
    if a.ndim < 2:
        raise ValueError(f"{what} must have layout (N, C, ...), got shape {a.shape}")
    return cp.ascontiguousarray(a)


def float_input(cp, x, what):
    """:func:`as_nc`, float16/32/64 only."""
    x = as_nc(cp, x, what)
    if np.dtype(x.dtype).name not in CTYPES:
        raise TypeError(f"{what} must be float16/32/64, got {x.dtype}")
    return x


def float_pair(cp, dy, x, what):
    """``(dy, x)`` through :func:`float_input`; they must share shape and dtype (``x`` is
    called ``what`` in the errors)."""
    dy = float_input(cp, dy, "dy")
    x = float_input(cp, x, what)
    if dy.shape != x.shape or dy.dtype != x.dtype:
        raise ValueError(f"dy and {what} must match: {dy.shape} {dy.dtype} vs {x.shape} "
                         f"{x.dtype}")
    return dy, x


def ncs(shape):
    """``(N, C, S)`` of an ``(N, C, *spatial)`` shape, ``S = prod(spatial)``."""
    return shape[0], shape[1], math.prod(shape[2:])


def per_channel(cp, v, C, what):
    """``v`` as a C-contiguous float64 ``(C,)`` array (a single value is repeated)."""
    a = cp.ascontiguousarray(cp.asarray(v, dtype=cp.float64).reshape(-1))
    if a.size == 1 and C != 1:
        a = cp.repeat(a, C)
    if a.size != C:
        raise ValueError(f"{what} must have one value per channel ({C}), got {a.size}")
    return a


# -- convolution geometry ----------------------------------------------------------------------
def conv_args(stride, dilation, pad_lo, pad_hi, groups):
    """``(stride, dilation, pad_lo, pad_hi, groups)`` normalized: three 3-tuples, stride and
    dilation >= 1, and an int groups >= 1."""
    s = triple(stride, "stride", 1)
    d = triple(dilation, "dilation", 1)
    lo = triple(pad_lo, "pad_lo")
    hi = triple(pad_hi, "pad_hi")
    g = int(groups)
    if g < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")
    return s, d, lo, hi, g


def pass_shapes(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi):
    """``(image_shape, w_shape, out_shape)`` of a conv pass (the cuDNN op's operands)."""
    out = (int(x_shape[0]), int(w_shape[0])) + out_extents(
        tuple(x_shape[2:]), tuple(w_shape[2:]), tuple(stride), tuple(dilation), tuple(pad_lo),
        tuple(pad_hi))
    return tuple(int(v) for v in x_shape), tuple(int(v) for v in w_shape), out
