"""Resampling, adaptive pooling, padding and channel dropout as PyTorch spells them, on
:class:`~disttensor.autograd.Tensor` s of ``(N, C, *S)`` DistArrays: the differentiable
functions (re-exported by :mod:`disttensor.nn.functional`) and their layers (re-exported by
:mod:`disttensor.nn.layers` and :mod:`disttensor.nn`).

Each function runs its distributed op's forward (:mod:`disttensor.ops.adaptive_pool`, ...)
and records the op's explicit backward; everything is collective over the input's grid.
"""
from __future__ import annotations

from ..autograd.tensor import make_result, unwrap
from ..ops.adaptive_pool import adaptive_pool_backward, adaptive_pool_forward
from ..ops.resample import interpolate_backward, interpolate_forward
from .module import Module

FUNCTIONS = ["adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
             "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d",
             "interpolate", "upsample"]
LAYERS = ["AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d",
          "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "Upsample", "UpsamplingNearest2d",
          "UpsamplingBilinear2d"]
__all__ = FUNCTIONS + LAYERS


def _spatial_rank(x, nd: int, what: str) -> None:
    shape = unwrap(x).shape
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
    y, saved = interpolate_forward(unwrap(input), size, scale_factor, mode, align_corners,
                                   recompute_scale_factor, antialias)
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
