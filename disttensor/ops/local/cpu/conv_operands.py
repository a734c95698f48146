"""Operand checks and output geometry shared by every CPU convolution kernel (per rank, no MPI).

Contract: layout ``(N, C, D, H, W)``, weights ``(Cout, Cin // groups, kD, kH, kW)``;
``stride``, ``dilation``, ``pad_lo``, ``pad_hi`` are 3-tuples of ints (padding zero, possibly
asymmetric); the output extent per axis is ``(n + lo + hi - dilation*(k-1) - 1) // stride +
1``.  The CPU kernels take float32 or float64 and return the operands' common dtype.

``forward_operands``, ``data_operands`` and ``filter_operands`` check one pass's operands
(``ValueError`` for inconsistent shapes, ``TypeError`` for other dtypes) and return them
C-contiguous in their common float dtype (the input may keep its strides where the caller
copies it anyway) with the geometry as int tuples; the im2col
(:mod:`.conv_im2col`), direct (:mod:`.conv_direct`) and planned
(:mod:`disttensor.ops.local.microbatch`) entry points all use them, so malformed input raises
the same errors whichever algorithm runs.
"""
from __future__ import annotations

import numpy as np

__all__ = ["conv_out_shape", "float_dtype", "check_shapes", "forward_operands",
           "data_operands", "filter_operands"]


def conv_out_shape(in_spatial, kernel, stride, dilation, pad_lo, pad_hi) -> tuple[int, ...]:
    out = []
    for n, k, s, d, lo, hi in zip(in_spatial, kernel, stride, dilation, pad_lo, pad_hi):
        if s < 1 or d < 1 or k < 1:
            raise ValueError(f"stride {s}, dilation {d} and kernel extent {k} must be >= 1")
        span = d * (k - 1) + 1
        if n + lo + hi < span:
            raise ValueError(f"input extent {n} padded by ({lo}, {hi}) is shorter than the "
                             f"kernel span {span}")
        out.append((n + lo + hi - span) // s + 1)
    return tuple(out)


def float_dtype(*arrays) -> np.dtype:
    """The common dtype of the operands, which the CPU kernels take as float32 or float64."""
    dtype = np.result_type(*(a.dtype for a in arrays))
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"CPU convolution kernels take float32 or float64 arrays, got "
                        f"{', '.join(str(a.dtype) for a in arrays)} (use astype; float16 and "
                        "bfloat16 are for GPU blocks)")
    return dtype


def check_shapes(x_shape, w_shape, groups) -> None:
    """Raise ``ValueError`` unless ``x_shape`` is ``(N, C, D, H, W)``, ``w_shape`` a 5-d
    ``(Cout, C // groups, kD, kH, kW)`` and ``groups`` divides both channel counts."""
    if len(x_shape) != 5 or len(w_shape) != 5:
        raise ValueError(f"local conv kernels take (N, C, D, H, W) inputs and 5-d weights, got "
                         f"{tuple(x_shape)} and {tuple(w_shape)}")
    if groups < 1 or x_shape[1] % groups or w_shape[0] % groups:
        raise ValueError(f"groups={groups} must divide the input channels {x_shape[1]} and the "
                         f"output channels {w_shape[0]}")
    if w_shape[1] * groups != x_shape[1]:
        raise ValueError(f"weight {tuple(w_shape)} expects {w_shape[1] * groups} input channels "
                         f"with groups={groups}, input has {x_shape[1]}")


def _out_shape(in_spatial, kernel, geo) -> tuple[int, ...]:
    """:func:`conv_out_shape` of int tuples (shapes and the normalized ``geo``), memoised."""
    key = (tuple(in_spatial), tuple(kernel), geo)
    out = _OUT_SHAPES.get(key)
    if out is None:
        out = conv_out_shape(key[0], key[1], *geo)
        if len(_OUT_SHAPES) > 4096:
            _OUT_SHAPES.clear()
        _OUT_SHAPES[key] = out
    return out


_OUT_SHAPES: dict = {}


def _ints(*tuples) -> tuple:
    try:  # (memoised: values equal as keys convert alike, 1 == 1.0 == True -> 1)
        return _INTS[tuples]
    except (KeyError, TypeError):
        pass
    out = tuple(tuple(int(v) for v in t) for t in tuples)
    try:
        if len(_INTS) > 4096:
            _INTS.clear()
        _INTS[tuples] = out
    except TypeError:  # unhashable (a list): not kept
        pass
    return out


_INTS: dict = {}


def _common_float(a, b, strided_a: bool = False):
    """``(a, b, dtype)``: both operands C-contiguous in their common float dtype
    (``strided_a``: ``a`` only in that dtype, with its strides where it has it already)."""
    dtype = float_dtype(a, b)
    a = (a if a.dtype == dtype else a.astype(dtype)) if strided_a else \
        np.ascontiguousarray(a, dtype=dtype)
    return a, np.ascontiguousarray(b, dtype=dtype), dtype


def forward_operands(x, w, stride, dilation, pad_lo, pad_hi, groups, strided_x: bool = False):
    """The checked operands of a forward call, shared by every CPU algorithm:
    ``(x, w, dtype, (stride, dilation, pad_lo, pad_hi), out_spatial)`` with ``x`` and ``w``
    C-contiguous in their common float dtype and the geometry as int tuples.
    ``strided_x=True`` leaves ``x`` with its strides (a window of a halo'd buffer) for a
    caller that copies it anyway (the direct kernels pad it into scratch; the micro-batch
    planner hands it on to an algorithm that makes its own operands)."""
    check_shapes(x.shape, w.shape, groups)
    x, w, dtype = _common_float(x, w, strided_x)
    geo = _ints(stride, dilation, pad_lo, pad_hi)
    return x, w, dtype, geo, _out_shape(x.shape[2:], w.shape[2:], geo)


def data_operands(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups):
    """The checked operands of a backward-data call: ``(dy, w, dtype, in_spatial, geo)``
    (``dy`` must have the convolution's output extent)."""
    dy, w, dtype = _common_float(dy, w)
    in_spatial, = _ints(in_spatial)
    geo = _ints(stride, dilation, pad_lo, pad_hi)
    check_shapes((dy.shape[0], w.shape[1] * groups) + in_spatial, w.shape, groups)
    out_sp = _out_shape(in_spatial, w.shape[2:], geo)
    if tuple(dy.shape[2:]) != out_sp:
        raise ValueError(f"dy has spatial shape {dy.shape[2:]}, the convolution gives {out_sp}")
    return dy, w, dtype, in_spatial, geo


def filter_operands(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups,
                    strided_x: bool = False):
    """The checked operands of a backward-filter call: ``(x, dy, dtype, kernel, geo,
    out_spatial)`` (``dy`` must be ``(N, Cout) + out_spatial``; ``strided_x`` as in
    :func:`forward_operands`)."""
    x, dy, dtype = _common_float(x, dy, strided_x)
    kernel, = _ints(kernel)
    geo = _ints(stride, dilation, pad_lo, pad_hi)
    n_n, cin = x.shape[:2]
    cout = dy.shape[1]
    check_shapes(x.shape, (cout, cin // max(groups, 1)) + kernel, groups)
    out_sp = _out_shape(x.shape[2:], kernel, geo)
    if tuple(dy.shape[2:]) != out_sp or dy.shape[0] != n_n:
        raise ValueError(f"dy has shape {dy.shape}, the convolution gives {(n_n, cout) + out_sp}")
    return x, dy, dtype, kernel, geo, out_sp
