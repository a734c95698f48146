"""GPU 3-D max / average pooling (``pool_forward``, ``pool_backward``) on CuPy arrays: the
contracts of :mod:`..cpu.pool`, with the RawKernels of ``kernels/pool.cu``.

``x`` is ``(N, C, D, H, W)``; ``kernel``/``stride``/``pad_lo``/``pad_hi`` are 3-tuples (an int
means the same value on every axis), padding may be asymmetric.  Outputs have the input dtype
(float16, float32, float64).  Per rank, no MPI.
"""
from __future__ import annotations

import math

import numpy as np

from .operands import as_5d, in_extents, out_extents, triple
from . import rawmodules
from .rawmodules import ctype, cupy, i64, launch


def _kernel(expr):
    """The ``kernels/pool.cu`` kernel of name expression ``expr``."""
    return rawmodules.kernel("pool", expr)


def _pool_args(mode, kernel, stride, pad_lo, pad_hi):
    if mode not in ("max", "avg"):
        raise ValueError(f"mode must be 'max' or 'avg', got {mode!r}")
    return (triple(kernel, "kernel", 1), triple(stride, "stride", 1),
            triple(pad_lo, "pad_lo", 0), triple(pad_hi, "pad_hi", 0))


def pool_forward(x, mode, kernel, stride, pad_lo, pad_hi, count_include_pad=True):
    """Max or average pooling of ``x`` (N, C, D, H, W) -> ``(y, argmax)``.

    max: padding acts as -inf; ``argmax`` (y's shape; uint8 for windows of at most 256 cells,
    else int32, as on the CPU) is the flat window position
    ``kd*kH*kW + kh*kW + kw`` of the first maximal element (NaN counts as maximal, the first NaN
    wins).  avg: divisor ``kD*kH*kW`` if ``count_include_pad`` else the number of non-padding
    cells of the window (0 of them gives 0); ``argmax`` is None."""
    cp = cupy()
    k, s, lo, hi = _pool_args(mode, kernel, stride, pad_lo, pad_hi)
    x = as_5d(cp, x, "x")
    T = ctype(x.dtype, "pool")
    N, C = x.shape[:2]
    osp = out_extents(x.shape[2:], k, s, (1, 1, 1), lo, hi)
    y = cp.empty((N, C) + osp, x.dtype)
    dims = i64(y.size, *x.shape[2:], *osp, *k, *s, *lo)
    if mode == "max":
        am = cp.empty(y.shape, cp.int32)
        launch(_kernel(f"max_pool3d_forward<{T}>"), y.size, (x, y, am) + dims)
        if math.prod(k) <= 256:  # saved for backward: 1 byte per output (the CPU's dtype)
            am = am.astype(cp.uint8)
        return y, am
    launch(_kernel(f"avg_pool3d_forward<{T}>"), y.size,
           (x, y) + dims + (np.int32(bool(count_include_pad)),))
    return y, None


def pool_backward(dy, argmax, mode, in_spatial, kernel, stride, pad_lo, pad_hi,
                  count_include_pad=True):
    """The adjoint of :func:`pool_forward`: ``dx`` (N, C, *in_spatial).  max: each ``dy`` goes
    to its argmax cell (dropped where that is padding); avg: ``dy/divisor`` to every
    non-padding cell of the window; overlapping windows add."""
    cp = cupy()
    k, s, lo, hi = _pool_args(mode, kernel, stride, pad_lo, pad_hi)
    dy = as_5d(cp, dy, "dy")
    T = ctype(dy.dtype, "pool")
    in_spatial = in_extents(in_spatial)
    osp = out_extents(in_spatial, k, s, (1, 1, 1), lo, hi)
    if tuple(dy.shape[2:]) != osp:
        raise ValueError(f"dy spatial extents {dy.shape[2:]} != pooling output extents {osp} "
                         f"of {in_spatial}")
    N, C = dy.shape[:2]
    dx = cp.empty((N, C) + in_spatial, dy.dtype)
    dims = i64(dx.size, *in_spatial, *osp, *k, *s, *lo)
    if mode == "max":
        if argmax is None:
            raise ValueError("max pooling backward needs the argmax of the forward pass")
        argmax = cp.ascontiguousarray(cp.asarray(argmax, dtype=cp.int32))
        if argmax.shape != dy.shape:
            raise ValueError(f"argmax shape {argmax.shape} != dy shape {dy.shape}")
        launch(_kernel(f"max_pool3d_backward<{T}>"), dx.size, (dy, argmax, dx) + dims)
    else:
        launch(_kernel(f"avg_pool3d_backward<{T}>"), dx.size,
               (dy, dx) + dims + (np.int32(bool(count_include_pad)),))
    return dx
