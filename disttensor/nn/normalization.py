"""Group, instance and layer normalization: the differentiable functions (``F.group_norm``,
``F.instance_norm``, ``F.layer_norm``, PyTorch's signatures) and the layers ``GroupNorm``,
``InstanceNorm1d/2d/3d`` and ``LayerNorm`` (PyTorch's constructor arguments, defaults,
parameter and buffer names, so ``state_dict`` keys match), over the distributed ops of
:mod:`disttensor.ops.group_norm` and :mod:`disttensor.ops.layer_norm`.

Inputs are :class:`~disttensor.autograd.Tensor` s holding DistArrays (``(N, C, *S)`` for group
and instance norm, any layout for layer norm) on any grid; the statistics are those of the
whole array (the result equals one rank's).  Parameters are replicated arrays; their gradients
come back summed over the ranks holding different data, or as per-rank shares where a
data-parallel reducer defers their reduction (as :mod:`.functional` does for every op).
Collective, forward and backward.  An input that is not a Tensor of a DistArray raises
``TypeError``; parameters follow PyTorch's dtype rule (:mod:`.operand_checks`).  Differences
from PyTorch: the shape errors are
``ValueError`` (PyTorch: ``RuntimeError``); an instance norm given a channel count other than
``num_features`` raises without affine too (PyTorch only warns then); inputs must be batched
(no unbatched ``(C, *S)`` form).
"""
from __future__ import annotations

from ..autograd.tensor import make_result, unwrap
from ..core.backend import xp_for
from ..ops.group_norm import group_norm_backward, group_norm_forward
from ..ops.layer_norm import layer_norm_backward, layer_norm_forward, normalized_tuple
from .functional import _as_compute, _param_grad, _reduce_now
from .operand_checks import activation as _activation_of
from .module import Module, Parameter

__all__ = ["group_norm", "instance_norm", "layer_norm", "GroupNorm", "InstanceNorm1d",
           "InstanceNorm2d", "InstanceNorm3d", "LayerNorm"]

def _group_norm(x, groups, weight, bias, eps, running_mean=None, running_var=None,
                use_input_stats=True, momentum=0.1, kind="group"):
    op = f"{kind}_norm"
    xv = _activation_of(op, x)
    y, saved = group_norm_forward(xv, groups, _as_compute(unwrap(weight), xv, op),
                                  _as_compute(unwrap(bias), xv, op), eps, unwrap(running_mean),
                                  unwrap(running_var), use_input_stats, momentum, kind)

    def backward(g):
        reduce = _reduce_now(weight, bias)
        dx, dgamma, dbeta = group_norm_backward(saved, g, reduce=reduce)
        reduced = reduce or saved.param_sums_in_stats
        return (dx, _param_grad(weight, dgamma, xv, reduced),
                _param_grad(bias, dbeta, xv, reduced))
    return make_result(y, (x, weight, bias), backward, op)


def group_norm(input, num_groups: int, weight=None, bias=None, eps: float = 1e-5):
    """Group normalization (``torch.nn.functional.group_norm``): ``input`` ``(N, C, *S)``
    normalized per sample over groups of ``C // num_groups`` channels and all positions;
    ``weight``/``bias`` per channel (or ``None``)."""
    return _group_norm(input, num_groups, weight, bias, eps)


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5):
    """Instance normalization (``torch.nn.functional.instance_norm``): per sample and channel
    over the positions; ``running_mean``/``running_var`` (plain ``(C,)`` arrays) are updated in
    place with the batch's mean of the per-instance statistics when ``use_input_stats``, and
    normalize when not."""
    shape = _activation_of("instance_norm", input).shape
    c = shape[1] if len(shape) > 1 else 1
    return _group_norm(input, c, weight, bias, eps, running_mean, running_var,
                       use_input_stats, 0.0 if momentum is None else momentum, "instance")


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """Layer normalization (``torch.nn.functional.layer_norm``) over the trailing
    ``normalized_shape`` axes of ``input`` (which may be split over the grid); ``weight`` and
    ``bias`` of shape ``normalized_shape`` (or ``None``)."""
    xv = _activation_of("layer_norm", input)
    y, saved = layer_norm_forward(xv, normalized_shape,
                                  _as_compute(unwrap(weight), xv, "layer_norm"),
                                  _as_compute(unwrap(bias), xv, "layer_norm"), eps)

    def backward(g):
        reduce = _reduce_now(weight, bias)
        dx, dgamma, dbeta = layer_norm_backward(saved, g, reduce=reduce)
        reduced = reduce or saved.param_sums_in_stats
        return (dx, _param_grad(weight, dgamma, xv, reduced),
                _param_grad(bias, dbeta, xv, reduced))
    return make_result(y, (input, weight, bias), backward, "layer_norm")


def _ones_zeros(module, shape, affine, bias, dtype, device):
    xp = xp_for(device)
    if affine:
        module.weight = Parameter(xp.ones(shape, dtype=dtype))
        if bias:
            module.bias = Parameter(xp.zeros(shape, dtype=dtype))
        else:
            module.register_parameter("bias", None)
    else:
        module.register_parameter("weight", None)
        module.register_parameter("bias", None)


class GroupNorm(Module):
    """``torch.nn.GroupNorm(num_groups, num_channels, eps=1e-5, affine=True)``: parameters
    ``weight`` (ones) and ``bias`` (zeros) of shape ``(num_channels,)``."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, *, bias: bool = True, dtype="float32",
                 device: str = "cpu"):
        super().__init__()
        if num_channels % num_groups:
            raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups "
                             f"({num_groups})")
        self.num_groups, self.num_channels, self.eps, self.affine = (num_groups, num_channels,
                                                                     eps, affine)
        _ones_zeros(self, (num_channels,), affine, bias, dtype, device)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"

    def forward(self, x):
        return group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class _InstanceNorm(Module):
    _nd = 3

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = False, track_running_stats: bool = False, *,
                 bias: bool = True, dtype="float32", device: str = "cpu"):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        _ones_zeros(self, (num_features,), affine, bias, dtype, device)
        xp = xp_for(device)
        if track_running_stats:
            self.register_buffer("running_mean", xp.zeros(num_features, dtype=dtype))
            self.register_buffer("running_var", xp.ones(num_features, dtype=dtype))
            self.register_buffer("num_batches_tracked", xp_for("cpu").zeros((), dtype="int64"))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")

    def forward(self, x):
        shape = x.shape
        if len(shape) != self._nd + 2:
            raise ValueError(f"expected {self._nd + 2}D input (got {len(shape)}D input); "
                             f"{type(self).__name__} takes batched (N, C, {self._nd} spatial "
                             "axes) input")
        if shape[1] != self.num_features:
            raise ValueError(f"expected input's size at dim=1 to match num_features "
                             f"({self.num_features}), but got: {shape[1]}.")
        # PyTorch's rule: batch statistics in training or without running statistics;
        # num_batches_tracked is never advanced by instance norm (as PyTorch's)
        return instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                             self.training or not self.track_running_stats,
                             self.momentum if self.momentum is not None else 0.0, self.eps)


class InstanceNorm1d(_InstanceNorm):
    """Instance norm of ``(N, C, L)`` inputs (``torch.nn.InstanceNorm1d``)."""
    _nd = 1


class InstanceNorm2d(_InstanceNorm):
    """Instance norm of ``(N, C, H, W)`` inputs (``torch.nn.InstanceNorm2d``)."""
    _nd = 2


class InstanceNorm3d(_InstanceNorm):
    """Instance norm of ``(N, C, D, H, W)`` inputs (``torch.nn.InstanceNorm3d``)."""
    _nd = 3


class LayerNorm(Module):
    """``torch.nn.LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True, bias=True)``:
    ``weight`` (ones) and ``bias`` (zeros) of shape ``normalized_shape``."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, *, dtype="float32", device: str = "cpu"):
        super().__init__()
        self.normalized_shape = normalized_tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        _ones_zeros(self, self.normalized_shape, elementwise_affine, bias, dtype, device)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")

    def forward(self, x):
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
