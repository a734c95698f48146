"""Resampling, adaptive pooling, padding and channel dropout as PyTorch spells them, on
:class:`~disttensor.autograd.Tensor` s of ``(N, C, *S)`` DistArrays: the differentiable
functions (re-exported by :mod:`disttensor.nn.functional`) and their layers (re-exported by
:mod:`disttensor.nn.layers` and :mod:`disttensor.nn`).

Each function runs its distributed op's forward (:mod:`disttensor.ops.adaptive_pool`, ...)
and records the op's explicit backward; everything is collective over the input's grid.
"""
from __future__ import annotations

import numpy as np

from ..autograd.tensor import make_result, unwrap
from ..ops.adaptive_pool import adaptive_pool_backward, adaptive_pool_forward
from ..ops.channel_dropout import channel_dropout_backward, channel_dropout_forward
from ..ops.pad import pad_backward, pad_forward
from ..ops.pooling import pool_backward, pool_forward
from ..ops.resample import interpolate_backward, interpolate_forward
from ..random import Generator
from .module import Module
from .operand_checks import activation as _activation_of

FUNCTIONS = ["adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
             "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d",
             "interpolate", "upsample", "pad", "dropout1d", "dropout2d", "dropout3d",
             "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d"]
LAYERS = ["AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d",
          "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "Upsample", "UpsamplingNearest2d",
          "UpsamplingBilinear2d", "ConstantPad1d", "ConstantPad2d", "ConstantPad3d",
          "ZeroPad1d", "ZeroPad2d", "ZeroPad3d", "ReflectionPad1d", "ReflectionPad2d",
          "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d",
          "CircularPad1d", "CircularPad2d", "CircularPad3d", "Dropout1d", "Dropout2d",
          "Dropout3d", "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d",
          "AvgPool3d"]
__all__ = FUNCTIONS + LAYERS


def _spatial_rank(x, nd: int, what: str) -> None:
    shape = _activation_of(what, x).shape
    if len(shape) != nd + 2:
        raise ValueError(f"{what} expects (N, C, {nd} spatial axes) input, got shape {shape}")


# -- adaptive pooling --------------------------------------------------------------------------
def _adaptive(x, mode: str, output_size, nd: int, return_indices: bool = False):
    what = f"adaptive_{mode}_pool{nd}d"
    if return_indices:
        raise NotImplementedError(f"{what}: return_indices=True is not supported (indices "
                                  "into a distributed input)")
    _spatial_rank(x, nd, what)
    y, saved = adaptive_pool_forward(unwrap(x), mode, output_size)
    return make_result(y, (x,), lambda g: (adaptive_pool_backward(saved, g),), what)


def adaptive_avg_pool1d(input, output_size):
    """``torch.nn.functional.adaptive_avg_pool1d`` (see :mod:`disttensor.ops.adaptive_pool`)."""
    return _adaptive(input, "avg", output_size, 1)


def adaptive_avg_pool2d(input, output_size):
    return _adaptive(input, "avg", output_size, 2)


def adaptive_avg_pool3d(input, output_size):
    return _adaptive(input, "avg", output_size, 3)


def adaptive_max_pool1d(input, output_size, return_indices: bool = False):
    """``torch.nn.functional.adaptive_max_pool1d``; ``return_indices=True`` raises
    ``NotImplementedError``."""
    return _adaptive(input, "max", output_size, 1, return_indices)


def adaptive_max_pool2d(input, output_size, return_indices: bool = False):
    return _adaptive(input, "max", output_size, 2, return_indices)


def adaptive_max_pool3d(input, output_size, return_indices: bool = False):
    return _adaptive(input, "max", output_size, 3, return_indices)


class _AdaptivePoolNd(Module):
    _nd, _mode = 3, "avg"

    def __init__(self, output_size, return_indices: bool = False):
        super().__init__()
        if return_indices:
            raise NotImplementedError(f"{type(self).__name__}: return_indices=True is not "
                                      "supported")
        self.output_size = output_size
        self.return_indices = return_indices

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"

    def forward(self, x):
        return _adaptive(x, self._mode, self.output_size, self._nd)


class AdaptiveAvgPool1d(_AdaptivePoolNd):
    _nd = 1

    def __init__(self, output_size):
        super().__init__(output_size)


class AdaptiveAvgPool2d(AdaptiveAvgPool1d):
    _nd = 2


class AdaptiveAvgPool3d(AdaptiveAvgPool1d):
    _nd = 3


class AdaptiveMaxPool1d(_AdaptivePoolNd):
    _nd, _mode = 1, "max"


class AdaptiveMaxPool2d(_AdaptivePoolNd):
    _nd, _mode = 2, "max"


class AdaptiveMaxPool3d(_AdaptivePoolNd):
    _nd, _mode = 3, "max"



# -- interpolation -----------------------------------------------------------------------------
def interpolate(input, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                recompute_scale_factor=None, antialias: bool = False):
    """``torch.nn.functional.interpolate`` (same arguments and order; ``size`` comes second,
    so ``interpolate(x, 2)`` asks for an output extent 2): nearest, nearest-exact,
    (bi/tri)linear with ``align_corners``, area; see :mod:`disttensor.ops.resample`.
    ``antialias=True`` and bicubic are not supported (raise)."""
    y, saved = interpolate_forward(_activation_of("interpolate", input), size, scale_factor,
                                   mode, align_corners, recompute_scale_factor, antialias)
    return make_result(y, (input,), lambda g: (interpolate_backward(saved, g),), "interpolate")


def upsample(input, size=None, scale_factor=None, mode: str = "nearest", align_corners=None):
    """``torch.nn.functional.upsample`` (PyTorch's deprecated spelling of
    :func:`interpolate`)."""
    return interpolate(input, size, scale_factor, mode, align_corners)


class Upsample(Module):
    """``torch.nn.Upsample(size=None, scale_factor=None, mode='nearest', align_corners=None,
    recompute_scale_factor=None)``."""

    def __init__(self, size=None, scale_factor=None, mode: str = "nearest",
                 align_corners=None, recompute_scale_factor=None):
        super().__init__()
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners, self.recompute_scale_factor = align_corners, recompute_scale_factor

    def extra_repr(self) -> str:
        what = f"size={self.size}" if self.size is not None else \
            f"scale_factor={self.scale_factor}"
        return f"{what}, mode={self.mode!r}"

    def forward(self, x):
        return interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                           self.recompute_scale_factor)


class UpsamplingNearest2d(Upsample):
    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, "nearest")


class UpsamplingBilinear2d(Upsample):
    """Bilinear with ``align_corners=True`` (PyTorch's)."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, "bilinear", True)


# -- padding -----------------------------------------------------------------------------------
def pad(input, pad, mode: str = "constant", value=None):
    """``torch.nn.functional.pad``: ``pad`` lists ``(lo, hi)`` from the last axis backwards
    (negative entries crop); modes constant, reflect, replicate, circular; see
    :mod:`disttensor.ops.pad`."""
    y, saved = pad_forward(_activation_of("pad", input), pad, mode, value)
    return make_result(y, (input,), lambda g: (pad_backward(saved, g),), "pad")


class _PadNd(Module):
    _nd, _mode = 1, "constant"

    def __init__(self, padding, value=None):
        super().__init__()
        if isinstance(padding, (int, np.integer)):
            padding = (int(padding),) * (2 * self._nd)
        padding = tuple(padding)
        if len(padding) != 2 * self._nd:
            raise ValueError(f"{type(self).__name__}: padding needs {2 * self._nd} entries, "
                             f"got {padding}")
        self.padding = padding
        self.value = value

    def extra_repr(self) -> str:
        return f"{self.padding}" + ("" if self.value is None else f", value={self.value}")

    def forward(self, x):
        k = len(_activation_of(type(self).__name__, x).shape)
        if k != self._nd + 2:
            raise ValueError(f"{type(self).__name__}: expected {self._nd + 1}D or "
                             f"{self._nd + 2}D input (got {k}D input); inputs here are "
                             f"batched (N, C, {self._nd} spatial axes)")
        return pad(x, self.padding, self._mode, self.value)


class _ConstantPadNd(_PadNd):
    def __init__(self, padding, value: float):
        super().__init__(padding, float(value))


class ConstantPad1d(_ConstantPadNd):
    _nd = 1


class ConstantPad2d(_ConstantPadNd):
    _nd = 2


class ConstantPad3d(_ConstantPadNd):
    _nd = 3


class _ZeroPadNd(_PadNd):
    def __init__(self, padding):
        super().__init__(padding, 0.0)


class ZeroPad1d(_ZeroPadNd):
    _nd = 1


class ZeroPad2d(_ZeroPadNd):
    _nd = 2


class ZeroPad3d(_ZeroPadNd):
    _nd = 3


class ReflectionPad1d(_PadNd):
    _nd, _mode = 1, "reflect"


class ReflectionPad2d(_PadNd):
    _nd, _mode = 2, "reflect"


class ReflectionPad3d(_PadNd):
    _nd, _mode = 3, "reflect"


class ReplicationPad1d(_PadNd):
    _nd, _mode = 1, "replicate"


class ReplicationPad2d(_PadNd):
    _nd, _mode = 2, "replicate"


class ReplicationPad3d(_PadNd):
    _nd, _mode = 3, "replicate"


class CircularPad1d(_PadNd):
    _nd, _mode = 1, "circular"


class CircularPad2d(_PadNd):
    _nd, _mode = 2, "circular"


class CircularPad3d(_PadNd):
    _nd, _mode = 3, "circular"


# -- channel dropout ---------------------------------------------------------------------------
def _channel_dropout(input, p, training, inplace, rng, nd):
    if inplace:
        raise NotImplementedError(f"dropout{nd}d: inplace=True is not supported")
    _spatial_rank(input, nd, f"dropout{nd}d")
    y, saved = channel_dropout_forward(unwrap(input), p, rng, training)
    return make_result(y, (input,), lambda g: (channel_dropout_backward(saved, g),),
                       f"dropout{nd}d")


def dropout1d(input, p: float = 0.5, training: bool = True, inplace: bool = False, rng=0):
    """``torch.nn.functional.dropout1d``: whole ``(n, c)`` maps zeroed with probability
    ``p`` (:mod:`disttensor.ops.channel_dropout`); ``rng``: a
    :class:`disttensor.random.Generator` (advanced by one draw) or a seed."""
    return _channel_dropout(input, p, training, inplace, rng, 1)


def dropout2d(input, p: float = 0.5, training: bool = True, inplace: bool = False, rng=0):
    return _channel_dropout(input, p, training, inplace, rng, 2)


def dropout3d(input, p: float = 0.5, training: bool = True, inplace: bool = False, rng=0):
    return _channel_dropout(input, p, training, inplace, rng, 3)


class _DropoutNd(Module):
    """Channel dropout whose masks come from a counter-based generator seeded with ``seed``
    and advanced once per call (a buffer, so checkpoints resume the same masks), as
    :class:`disttensor.nn.Dropout`."""
    _nd = 1

    def __init__(self, p: float = 0.5, inplace: bool = False, seed: int = 0):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        if inplace:
            raise NotImplementedError(f"{type(self).__name__}: inplace=True is not supported")
        self.p, self.inplace, self.seed = p, inplace, int(seed)
        self.register_buffer("rng_counter", np.zeros((), dtype=np.int64))

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def forward(self, x):
        gen = Generator(self.seed)
        gen.counter = int(self.rng_counter)
        y = _channel_dropout(x, self.p, self.training, False, gen, self._nd)
        self.rng_counter[...] = gen.counter
        return y


class Dropout1d(_DropoutNd):
    _nd = 1


class Dropout2d(_DropoutNd):
    _nd = 2


class Dropout3d(_DropoutNd):
    _nd = 3


# -- pooling with PyTorch's full signatures (ceil_mode, dilation, divisor_override) ------------
def _pool(input, nd, mode, kernel_size, stride, padding, ceil_mode, count_include_pad=True,
          dilation=1, divisor_override=None, return_indices=False):
    what = f"{mode}_pool{nd}d"
    if return_indices:
        raise NotImplementedError(f"{what}: return_indices=True is not supported")
    _spatial_rank(input, nd, what)
    y, saved = pool_forward(_activation_of(what, input), mode, kernel_size,
                            kernel_size if stride is None or stride == [] else stride, padding,
                            count_include_pad, ceil_mode, dilation, divisor_override)
    return make_result(y, (input,), lambda g: (pool_backward(saved, g),), what)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """``torch.nn.functional.max_pool1d`` (``return_indices=True`` raises): see
    :func:`disttensor.ops.pool_forward`."""
    return _pool(input, 1, "max", kernel_size, stride, padding, ceil_mode, True, dilation,
                 None, return_indices)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    return _pool(input, 2, "max", kernel_size, stride, padding, ceil_mode, True, dilation,
                 None, return_indices)


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    return _pool(input, 3, "max", kernel_size, stride, padding, ceil_mode, True, dilation,
                 None, return_indices)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """``torch.nn.functional.avg_pool1d`` (``divisor_override`` too, which PyTorch's 1-D form
    lacks)."""
    return _pool(input, 1, "avg", kernel_size, stride, padding, ceil_mode, count_include_pad,
                 1, divisor_override)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    return _pool(input, 2, "avg", kernel_size, stride, padding, ceil_mode, count_include_pad,
                 1, divisor_override)


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    return _pool(input, 3, "avg", kernel_size, stride, padding, ceil_mode, count_include_pad,
                 1, divisor_override)


class _MaxPoolNd(Module):
    _nd = 3

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 return_indices: bool = False, ceil_mode: bool = False):
        super().__init__()
        if return_indices:
            raise NotImplementedError(f"{type(self).__name__}: return_indices=True is not "
                                      "supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding},"
                f" dilation={self.dilation}, ceil_mode={self.ceil_mode}")

    def forward(self, x):
        return _pool(x, self._nd, "max", self.kernel_size, self.stride, self.padding,
                     self.ceil_mode, True, self.dilation)


class MaxPool1d(_MaxPoolNd):
    _nd = 1


class MaxPool2d(_MaxPoolNd):
    _nd = 2


class MaxPool3d(_MaxPoolNd):
    _nd = 3


class _AvgPoolNd(Module):
    _nd = 3

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override=None):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"

    def forward(self, x):
        return _pool(x, self._nd, "avg", self.kernel_size, self.stride, self.padding,
                     self.ceil_mode, self.count_include_pad, 1, self.divisor_override)


class AvgPool1d(_AvgPoolNd):
    _nd = 1


class AvgPool2d(_AvgPoolNd):
    _nd = 2


class AvgPool3d(_AvgPoolNd):
    _nd = 3
