"""GPU local kernels (per rank, no MPI): the same functions and contracts as the CPU kernels in
:mod:`..cpu.conv_im2col`, :mod:`..cpu.pool` and :mod:`..cpu.pointwise`, on CuPy arrays.

* Convolution (``conv_forward``, ``conv_backward_data``, ``conv_backward_filter``;
  :mod:`.conv`): cuDNN through NVIDIA's cuDNN frontend (:mod:`.cudnn_conv`) when it imports,
  otherwise (or with ``DISTTENSOR_CONV_BACKEND=im2col``, or ``backend='im2col'``, or where
  cuDNN reports no engine for a configuration) im2col + cuBLAS (:mod:`.im2col_conv`); with
  ``backend=None`` through the micro-batch planner of :mod:`..microbatch`.
* Pooling (``pool_forward``, ``pool_backward``): :mod:`.pooling`.
* Per-channel statistics and batch-norm apply: :mod:`.batchnorm`; activations and channel
  softmax: :mod:`.activations`; GELU, SiLU, Softplus, Mish, Hardswish, Hardsigmoid and PReLU:
  :mod:`.activations_more`.
* The RawKernels are compiled by NVRTC from ``kernels/*.cu`` (:mod:`.rawmodules`); operand
  checks shared by all of them live in :mod:`.operands`.

Layout ``(N, C, *spatial)``; conv and pooling take exactly three spatial axes ``(N, C, D, H,
W)``; ``kernel``/``stride``/``dilation``/``pad_lo``/``pad_hi`` are 3-tuples (an int means the
same value on every axis), padding may be asymmetric.  Outputs have the input dtype (float16,
float32, float64); reductions are float64.  Inputs that are not C-contiguous are copied first.

CuPy (and the cuDNN frontend) are imported lazily, so ``import disttensor.ops.local.gpu`` works
on a machine without them.
"""
from __future__ import annotations

from .activations import (activation_backward, activation_forward, add_channel_bias,
                          log_softmax_channels, softmax_channels, softmax_channels_backward)
from .activations_more import (pointwise_activation_backward, pointwise_activation_forward,
                               prelu_backward, prelu_forward)
from .batchnorm import bn_backward_apply, bn_forward_apply, channel_sums, channel_sums_backward
from .conv import (conv_algorithms, conv_backend, conv_backward_data, conv_backward_filter,
                   conv_forward, last_conv_backend)
from .cudnn_conv import cudnn_available
from .pooling import pool_backward, pool_forward
from .losses import (class_ce_backward, class_ce_forward, dice_backward, dice_sums,
                     pointwise_loss_backward, pointwise_loss_forward, prob_ce_backward,
                     prob_ce_forward)

__all__ = [
    "cudnn_available", "conv_backend", "last_conv_backend", "conv_algorithms",
    "conv_forward", "conv_backward_data", "conv_backward_filter",
    "pool_forward", "pool_backward",
    "channel_sums", "bn_forward_apply", "channel_sums_backward", "bn_backward_apply",
    "activation_forward", "activation_backward", "add_channel_bias",
    "softmax_channels", "log_softmax_channels", "softmax_channels_backward",
    "pointwise_activation_forward", "pointwise_activation_backward", "prelu_forward",
    "prelu_backward",
]
