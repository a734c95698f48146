"""Differentiable distributed CNN ops: the ops of :mod:`disttensor.ops` on tensors.

Each function takes :class:`~disttensor.autograd.Tensor` activations holding ``(N, C, *S)``
DistArrays and replicated parameter tensors (NumPy/CuPy arrays), runs the op's forward and
records its explicit backward from :mod:`disttensor.ops` (nothing is differentiated twice).
Everything is collective over the activation's grid, forward and backward, as the ops are.

Parameters must have the activation's dtype (``RuntimeError`` otherwise, as PyTorch) except
inside :func:`disttensor.nn.amp.autocast`, where they may be stored in another floating dtype
(float32 master weights with float16 activations): cast to the activation dtype for the op and
their gradients cast back.  An activation that is not a Tensor of a DistArray raises
``TypeError`` (:mod:`disttensor.nn.operand_checks`).  Parameter gradients come back summed over
the ranks that hold different data (each op's one all-reduce), or, for parameters whose
reduction a data-parallel reducer defers (:class:`disttensor.nn.parallel.GradientReducer`), as
per-rank shares that the reducer sums in buckets (:func:`disttensor.autograd.param_share`).
"""
from __future__ import annotations

from .. import ops
from ..core.array import DistArray
from ..autograd.math import multiply
from ..autograd.tensor import Tensor, make_result, param_share, unwrap
from ..core.comm import allreduce
from ..ops._spatial import param_comm
from .operand_checks import activation as _activation_of, compute_params as _compute_params
from . import losses as _losses, resampling as _resampling
from .losses import (binary_cross_entropy, binary_cross_entropy_with_logits,  # noqa: F401
                     cross_entropy, dice_ce_loss, dice_loss, huber_loss, l1_loss, mse_loss,
                     nll_loss, one_hot, smooth_l1_loss)
from .resampling import (adaptive_avg_pool1d, adaptive_avg_pool2d,  # noqa: F401
                         adaptive_avg_pool3d, adaptive_max_pool1d, adaptive_max_pool2d,
                         adaptive_max_pool3d, avg_pool1d, avg_pool2d, avg_pool3d, dropout1d,
                         dropout2d, dropout3d, interpolate, max_pool1d, max_pool2d,
                         max_pool3d, pad, upsample)
from .resampling import _pool as _nd_pool

__all__ = ["conv", "conv1d", "conv2d", "conv3d", "conv_transpose", "conv_transpose1d",
           "conv_transpose2d", "conv_transpose3d", "max_pool", "avg_pool", "batch_norm",
           "relu", "leaky_relu", "elu", "sigmoid", "tanh", "softmax", "log_softmax",
           "dropout", "cat", "flatten", "linear", "scaled_tanh"]
__all__ += _resampling.FUNCTIONS + _losses.FUNCTIONS


def _needs(t) -> bool:
    return isinstance(t, Tensor) and t.requires_grad


def _as_compute(p, x: DistArray, op: str = "layer"):
    """Parameter value ``p`` in ``x``'s dtype (a cast copy only when they differ) under
    PyTorch's dtype rule (:func:`~disttensor.nn.operand_checks.compute_params`: another dtype
    raises outside autocast, except float32 parameters with float16/bfloat16 input)."""
    if p is None:
        return None
    return _compute_params(op, x, {"parameter": p}, mixed_low_precision=True)[0]


def _split_axes(d: DistArray) -> tuple[int, ...]:
    return tuple(g for g in d.split if g is not None)


def _param_grad(t, g, x: DistArray, reduced: bool):
    """The gradient contribution for parameter tensor ``t`` from an op's ``g``: summed over
    the ranks holding different parts of ``x`` when ``reduced``, else this rank's partial sum;
    cast to the parameter's dtype and turned into a share under deferred reduction."""
    if g is None or not _needs(t):
        return None
    g = g.astype(t.data.dtype, copy=False)
    if reduced:
        return param_share(t, g)
    if t.deferred_reduction is None:
        return allreduce(param_comm(x), g, "sum")
    return param_share(t, g, x.grid, _split_axes(x))


def _reduce_now(*params) -> bool:
    """Whether the op should all-reduce its parameter gradients itself."""
    return not any(_needs(p) and p.deferred_reduction is not None for p in params)


# -- convolutions ----------------------------------------------------------------------------
def conv(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
         padding_mode: str = "zeros", overlap=None):
    """Convolution (``torch.nn.functional.conv{1,2,3}d``) of ``x`` ``(N, Cin, *S)`` with
    ``weight`` ``(Cout, Cin // groups, *K)``; see :func:`disttensor.ops.conv_forward`."""
    xv = _activation_of("conv", x)
    wv, bv = _compute_params("conv", xv, {"weight": weight, "bias": bias})
    y, saved = ops.conv_forward(xv, wv, bv, stride, padding, dilation, groups, padding_mode,
                                overlap)

    def backward(g):
        reduce = _reduce_now(weight, bias)
        dx, dw, db = ops.conv_backward(saved, g, need_dx=_needs(x),
                                       need_dw=_needs(weight) or _needs(bias), reduce=reduce)
        return (dx, _param_grad(weight, dw, xv, reduce), _param_grad(bias, db, xv, reduce))
    return make_result(y, (x, weight, bias), backward, "conv")


conv1d = conv2d = conv3d = conv


def conv_transpose(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                   dilation=1):
    """Transposed convolution (``torch.nn.functional.conv_transpose{1,2,3}d``, same argument
    order) of ``x`` ``(N, Cin, *S)`` with ``weight`` ``(Cin, Cout // groups, *K)``."""
    xv = _activation_of("conv_transpose", x)
    wv, bv = _compute_params("conv_transpose", xv, {"weight": weight, "bias": bias})
    y, saved = ops.conv_transpose_forward(xv, wv, bv, stride, padding, output_padding,
                                          dilation, groups)

    def backward(g):
        reduce = _reduce_now(weight, bias)
        dx, dw, db = ops.conv_transpose_backward(saved, g, need_dy=_needs(x),
                                                 need_dw=_needs(weight) or _needs(bias),
                                                 reduce=reduce)
        return (dx, _param_grad(weight, dw, g, reduce), _param_grad(bias, db, g, reduce))
    return make_result(y, (x, weight, bias), backward, "conv_transpose")


conv_transpose1d = conv_transpose2d = conv_transpose3d = conv_transpose


# -- pooling and upsampling ------------------------------------------------------------------
def max_pool(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Max pooling over every spatial axis of ``x`` ``(N, C, *S)`` (:func:`max_pool3d` and
    friends for any number of spatial axes)."""
    return _nd_pool(x, len(getattr(x, "shape", ())) - 2, "max", kernel_size, stride, padding, ceil_mode,
                    dilation=dilation)


def avg_pool(x, kernel_size, stride=None, padding=0, ceil_mode=False,
             count_include_pad: bool = True, divisor_override=None):
    """Average pooling over every spatial axis of ``x`` ``(N, C, *S)`` (:func:`avg_pool3d` and
    friends for any number of spatial axes)."""
    return _nd_pool(x, len(getattr(x, "shape", ())) - 2, "avg", kernel_size, stride, padding, ceil_mode,
                    count_include_pad, divisor_override=divisor_override)


def batch_norm(x, running_mean, running_var, weight, bias, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5, stats: str = "global"):
    """Batch norm (``torch.nn.functional.batch_norm`` argument order): ``running_mean`` and
    ``running_var`` are plain arrays updated in place when training; ``stats='global'``
    normalizes with the statistics of the whole distributed batch (synchronized batch norm,
    the same result as one rank), ``'local'`` with each rank's block (LBANN's local mode)."""
    xv = _activation_of("batch_norm", x)
    wv, bv = _compute_params("batch_norm", xv, {"weight": weight, "bias": bias}, cast=False,
                             mixed_low_precision=True)
    y, saved = ops.batch_norm_forward(xv, wv, bv, unwrap(running_mean), unwrap(running_var),
                                      training, momentum, eps, stats)

    def backward(g):
        reduce = _reduce_now(weight, bias)
        dx, dgamma, dbeta = ops.batch_norm_backward(saved, g, reduce=reduce)
        reduced = reduce or (training and stats == "global")
        return (dx, _param_grad(weight, dgamma, xv, reduced),
                _param_grad(bias, dbeta, xv, reduced))
    return make_result(y, (x, weight, bias), backward, "batch_norm")


# -- activations -----------------------------------------------------------------------------
def _activation(name, x, alpha=None):
    """Backward keeps only the output ``y`` where it determines the derivative: relu, and
    leaky_relu / elu with ``alpha >= 0`` (``y > 0`` exactly where ``x > 0``; the kernels read
    ``x`` only through that sign test), sigmoid and tanh (derivative from ``y``).  The input
    can then be freed after the forward: half the activation memory of a conv -> activation
    pair.  A negative ``alpha`` keeps ``x`` as well."""
    xv = _activation_of(name, x)
    y = ops.activation_forward(name, xv, alpha)
    if name in ("relu", "sigmoid", "tanh") or alpha is None or float(alpha) >= 0:
        return make_result(y, (x,), lambda g: (ops.activation_backward(name, g, y, y, alpha),),
                           name)
    return make_result(y, (x,), lambda g: (ops.activation_backward(name, g, xv, y, alpha),),
                       name)


def relu(x):
    return _activation("relu", x)


def leaky_relu(x, negative_slope: float = 0.01):
    return _activation("leaky_relu", x, negative_slope)


def elu(x, alpha: float = 1.0):
    return _activation("elu", x, alpha)


def sigmoid(x):
    return _activation("sigmoid", x)


def tanh(x):
    return _activation("tanh", x)


def softmax(x, dim: int = 1):
    """Softmax over the channel axis (``dim`` must be 1: channels are never split)."""
    if dim != 1:
        raise ValueError("softmax runs over the channel axis (dim=1) of an (N, C, ...) array")
    y = ops.softmax_forward(_activation_of("softmax", x))
    return make_result(y, (x,), lambda g: (ops.softmax_backward(g, y),), "softmax")


def log_softmax(x, dim: int = 1):
    """Log-softmax over the channel axis; backward ``g - softmax * sum_c g`` (local)."""
    if dim != 1:
        raise ValueError("log_softmax runs over the channel axis (dim=1) of an (N, C, ...) "
                         "array")
    y = ops.log_softmax(_activation_of("log_softmax", x))

    def backward(g):
        xp = g.xp
        dx = g.local - xp.exp(y.local) * g.local.sum(axis=1, keepdims=True)
        return (DistArray(dx, g.distribution, g.grid),)
    return make_result(y, (x,), backward, "log_softmax")


def dropout(x, p: float = 0.5, training: bool = True, rng=0):
    """Dropout with a mask that is the same global array for a generator state on any grid
    (``rng``: a :class:`disttensor.random.Generator`, advanced by one draw, or a seed)."""
    y, saved = ops.dropout_forward(_activation_of("dropout", x), p, rng, training)
    return make_result(y, (x,), lambda g: (ops.dropout_backward(saved, g),), "dropout")


# -- shape -----------------------------------------------------------------------------------
def cat(xs, dim: int = 1):
    """Concatenate ``(N, C_i, *S)`` tensors along the channels (U-Net skip connections)."""
    if dim != 1:
        raise ValueError("cat joins along the channel axis (dim=1); use "
                         "disttensor.autograd.concatenate for other axes")
    xs = list(xs)
    y, layouts = ops.concat_channels([_activation_of("cat", t, "tensors") for t in xs])
    return make_result(y, xs, lambda g: tuple(ops.concat_channels_backward(layouts, g)),
                       "cat")


def flatten(x):
    """``(N, ...) -> (N, features)``, the sample axis keeping its split (spatial blocks are
    gathered over the spatial grid axes, whose ranks then hold replicas)."""
    y, saved = ops.flatten_forward(_activation_of("flatten", x))
    return make_result(y, (x,), lambda g: (ops.flatten_backward(saved, g),), "flatten")


def linear(x, weight, bias=None):
    """``x @ weight.T + bias`` on ``(N, F)`` (``torch.nn.functional.linear``)."""
    xv = _activation_of("linear", x)
    wv, bv = _compute_params("linear", xv, {"weight": weight, "bias": bias})
    y, saved = ops.dense_forward(xv, wv, bv)

    def backward(g):
        reduce = _reduce_now(weight, bias)
        dx, dw, db = ops.dense_backward(saved, g, need_dx=_needs(x), reduce=reduce)
        return (dx, _param_grad(weight, dw, xv, reduce), _param_grad(bias, db, xv, reduce))
    return make_result(y, (x, weight, bias), backward, "linear")


# -- losses ----------------------------------------------------------------------------------
def scaled_tanh(x, scale: float):
    """``scale * tanh(x)`` (CosmoFlow's output layer uses 1.2)."""
    return multiply(tanh(x), float(scale))


# layers written in their own modules on top of the helpers above (they import this one)
from .normalization import group_norm, instance_norm, layer_norm  # noqa: E402
from .activation import (gelu, hardsigmoid, hardswish, mish, prelu, silu,  # noqa: E402
                         softplus)

__all__ += ["group_norm", "instance_norm", "layer_norm", "gelu", "silu", "softplus", "mish",
            "hardswish", "hardsigmoid", "prelu"]
