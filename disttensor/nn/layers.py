"""Layers in PyTorch's style over the distributed ops of :mod:`disttensor.nn.functional`.

Constructor arguments and parameter names/layouts follow ``torch.nn`` (``Conv3d(in, out,
kernel_size, stride, padding, dilation, groups, bias, padding_mode)``, weights
``(out, in // groups, *k)``, ...), so ``state_dict`` names and shapes match PyTorch's.  Extra
keyword arguments: ``dtype`` (default float32), ``device`` (``'cpu'``/``'cuda'``), ``rng``
(a ``numpy.random.Generator`` for the initial weights; default: the generator of
:func:`disttensor.nn.init.manual_seed`).  Weights are drawn on the host in float64 from that
generator with PyTorch's default initialization, so a seed gives the same model on any grid.
Inputs are :class:`~disttensor.autograd.Tensor` s holding ``(N, C, *S)`` DistArrays.
"""
from __future__ import annotations

import numpy as np

from ..core.backend import xp_for
from ..random import Generator
from . import functional as F
from . import init
from .module import Module, Parameter
from .operand_checks import activation
from . import losses as _losses, resampling as _resampling
from .losses import (BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, DiceCELoss,  # noqa: F401
                     DiceLoss, HuberLoss, L1Loss, MSELoss, NLLLoss, SmoothL1Loss)
from .resampling import (AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveAvgPool3d,  # noqa: F401
                         AdaptiveMaxPool1d, AdaptiveMaxPool2d, AdaptiveMaxPool3d, AvgPool1d,
                         AvgPool2d, AvgPool3d, CircularPad1d, CircularPad2d, CircularPad3d,
                         ConstantPad1d, ConstantPad2d, ConstantPad3d, Dropout1d, Dropout2d,
                         Dropout3d, MaxPool1d, MaxPool2d, MaxPool3d, ReflectionPad1d,
                         ReflectionPad2d, ReflectionPad3d, ReplicationPad1d, ReplicationPad2d,
                         ReplicationPad3d, Upsample, UpsamplingBilinear2d,
                         UpsamplingNearest2d, ZeroPad1d, ZeroPad2d, ZeroPad3d)

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
           "ConvTranspose3d", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "ReLU", "LeakyReLU",
           "ELU", "Sigmoid", "Tanh", "ScaledTanh", "Softmax", "LogSoftmax", "Dropout",
           "Flatten", "Linear", "Identity"]
__all__ += _resampling.LAYERS + _losses.MODULES


def _tuple(v, n: int, name: str) -> tuple:
    t = tuple(v) if isinstance(v, (tuple, list)) else (v,) * n
    if len(t) != n:
        raise ValueError(f"{name} needs {n} entries, got {v!r}")
    return t


def _empty(shape, dtype, device):
    return xp_for(device).zeros(shape, dtype=dtype)


def _check_input(x, nd: int, channels: int | None, what: str) -> None:
    shape = activation(what.lower(), x).shape  # TypeError unless a Tensor of a DistArray
    if len(shape) != nd + 2:
        raise ValueError(f"{what} expects (N, C, {nd} spatial axes) input, got shape {shape}")
    if channels is not None and shape[1] != channels:
        raise ValueError(f"{what} expects {channels} input channels, got {shape[1]} (input "
                         f"shape {shape})")


class _ConvNd(Module):
    _nd = 3
    _transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 output_padding=0, *, dtype="float32", device: str = "cpu", rng=None):
        super().__init__()
        nd = self._nd
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels {in_channels} and out_channels {out_channels} must "
                             f"be divisible by groups {groups}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _tuple(kernel_size, nd, "kernel_size")
        self.stride = _tuple(stride, nd, "stride")
        self.padding = padding if isinstance(padding, str) else _tuple(padding, nd, "padding")
        self.dilation = _tuple(dilation, nd, "dilation")
        self.output_padding = _tuple(output_padding, nd, "output_padding")
        self.padding_mode = padding_mode
        wshape = ((in_channels, out_channels // groups) if self._transposed
                  else (out_channels, in_channels // groups)) + self.kernel_size
        self.weight = Parameter(_empty(wshape, dtype, device))
        self.bias = Parameter(_empty((out_channels,), dtype, device)) if bias else None
        if not bias:
            self.register_parameter("bias", None)
        init.default_conv_init(self.weight.data, None if self.bias is None else self.bias.data,
                               init.resolve_rng(rng))

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")

    def forward(self, x):
        _check_input(x, self._nd, self.in_channels, type(self).__name__)
        if self._transposed:
            return F.conv_transpose(x, self.weight, self.bias, self.stride, self.padding,
                                    self.output_padding, self.groups, self.dilation)
        return F.conv(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                      self.groups, self.padding_mode)


class Conv1d(_ConvNd):
    _nd = 1


class Conv2d(_ConvNd):
    _nd = 2


class Conv3d(_ConvNd):
    _nd = 3


class _ConvTransposeNd(_ConvNd):
    _transposed = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1, *,
                 dtype="float32", device: str = "cpu", rng=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, "zeros", output_padding, dtype=dtype, device=device,
                         rng=rng)


class ConvTranspose1d(_ConvTransposeNd):
    _nd = 1


class ConvTranspose2d(_ConvTransposeNd):
    _nd = 2


class ConvTranspose3d(_ConvTransposeNd):
    _nd = 3


class _BatchNorm(Module):
    _nd = 3

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True, stats: str = "global",
                 *, dtype="float32", device: str = "cpu"):
        super().__init__()
        if stats not in ("global", "local"):
            raise ValueError(f"stats must be 'global' or 'local', got {stats!r}")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats, self.stats = affine, track_running_stats, stats
        xp = xp_for(device)
        if affine:
            self.weight = Parameter(xp.ones(num_features, dtype=dtype))
            self.bias = Parameter(xp.zeros(num_features, dtype=dtype))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", xp.zeros(num_features, dtype=dtype))
            self.register_buffer("running_var", xp.ones(num_features, dtype=dtype))
            self.register_buffer("num_batches_tracked", np.zeros((), dtype=np.int64))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, " \
               f"stats={self.stats!r}"

    def forward(self, x):
        _check_input(x, self._nd, self.num_features, type(self).__name__)
        use_batch = self.training or not self.track_running_stats
        if self.training and self.track_running_stats:
            self.num_batches_tracked += 1
        w, b = self.weight, self.bias
        if w is None:
            xp = x.data.xp
            w = xp.ones(self.num_features, dtype=x.dtype)
            b = xp.zeros(self.num_features, dtype=x.dtype)
        return F.batch_norm(x, self.running_mean if self.track_running_stats else None,
                            self.running_var if self.track_running_stats else None, w, b,
                            training=use_batch, momentum=self.momentum, eps=self.eps,
                            stats=self.stats)


class BatchNorm1d(_BatchNorm):
    """Batch norm of ``(N, C, L)`` inputs."""
    _nd = 1


class BatchNorm2d(_BatchNorm):
    _nd = 2


class BatchNorm3d(_BatchNorm):
    _nd = 3


class _Activation(Module):
    """An activation: ``forward(x)`` is ``_fn(x, **kw)``, ``_fn`` the subclass's function of
    :mod:`disttensor.nn.functional`, ``kw`` the keyword arguments it was built with."""
    _fn = None

    def __init__(self, **kw):
        super().__init__()
        self._kw = kw

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self._kw.items())

    def forward(self, x):
        return self._fn(x, **self._kw)


class ReLU(_Activation):
    _fn = staticmethod(F.relu)


class LeakyReLU(_Activation):
    _fn = staticmethod(F.leaky_relu)

    def __init__(self, negative_slope: float = 0.01):
        super().__init__(negative_slope=negative_slope)


class ELU(_Activation):
    _fn = staticmethod(F.elu)

    def __init__(self, alpha: float = 1.0):
        super().__init__(alpha=alpha)


class Sigmoid(_Activation):
    _fn = staticmethod(F.sigmoid)


class Tanh(_Activation):
    _fn = staticmethod(F.tanh)


class ScaledTanh(_Activation):
    """``scale * tanh(x)`` (CosmoFlow's output: scale 1.2)."""
    _fn = staticmethod(F.scaled_tanh)

    def __init__(self, scale: float = 1.2):
        super().__init__(scale=scale)


class Softmax(_Activation):
    """Softmax over the channel axis (``dim=1``)."""
    _fn = staticmethod(F.softmax)

    def __init__(self, dim: int = 1):
        super().__init__(dim=dim)


class LogSoftmax(_Activation):
    _fn = staticmethod(F.log_softmax)

    def __init__(self, dim: int = 1):
        super().__init__(dim=dim)


class Dropout(Module):
    """Dropout whose masks come from a counter-based generator seeded with ``seed`` and
    advanced once per call, so a run draws the same global masks on any grid."""

    def __init__(self, p: float = 0.5, seed: int = 0):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self.seed = int(seed)
        # the generator's position, a buffer so checkpoints resume the same masks
        self.register_buffer("rng_counter", np.zeros((), dtype=np.int64))

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def forward(self, x):
        gen = Generator(self.seed)
        gen.counter = int(self.rng_counter)
        y = F.dropout(x, self.p, self.training, gen)
        self.rng_counter[...] = gen.counter
        return y


class Flatten(Module):
    """``(N, ...) -> (N, features)`` (the sample axis keeps its split)."""

    def forward(self, x):
        return F.flatten(x)


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 dtype="float32", device: str = "cpu", rng=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(_empty((out_features, in_features), dtype, device))
        if bias:
            self.bias = Parameter(_empty((out_features,), dtype, device))
        else:
            self.register_parameter("bias", None)
        init.default_linear_init(self.weight.data,
                                 None if self.bias is None else self.bias.data,
                                 init.resolve_rng(rng))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"

    def forward(self, x):
        activation("linear", x)  # TypeError for anything but a Tensor of a DistArray
        if len(x.shape) != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"Linear expects (N, {self.in_features}) input, got shape "
                             f"{x.shape}")
        return F.linear(x, self.weight, self.bias)


class Identity(Module):
    def forward(self, x):
        return x
