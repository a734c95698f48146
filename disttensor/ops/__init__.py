"""Distributed CNN ops on DistArrays, each with explicit forward and backward functions.

Layout ``N, C, *spatial`` (1 to 3 spatial axes).  The channel axis must not be split; the
sample axis and any subset of the spatial axes may be.  A rank computes the output block it
owns from its input block plus a halo whose width follows from the window index math in
:mod:`disttensor.ops.window`; backward passes send halo gradients back to their owners with the
reverse (adjoint) halo exchange.  Per-rank kernels live in :mod:`disttensor.ops.local`.

Modules: :mod:`.convolution` (conv, transposed conv), :mod:`.pooling`, :mod:`.upsampling`,
:mod:`.norm` (batch norm), :mod:`.activations` (activations, softmax, dropout), :mod:`.shape`
(channel concat, flatten, dense), :mod:`.loss`, :mod:`.window` (pure index math); their
public functions are re-exported here (``from disttensor import ops; ops.conv_forward(...)``).
"""

from .activations import (ACTIVATIONS, activation, activation_backward, activation_forward,
                          dropout_backward, dropout_forward, elu, leaky_relu, log_softmax,
                          relu, sigmoid, softmax, softmax_backward, softmax_forward, tanh)
from .convolution import (conv, conv_backward, conv_forward, conv_transpose,
                          conv_transpose_backward, conv_transpose_forward)
from .loss import cross_entropy_backward, cross_entropy_forward, mse_backward, mse_forward
from .norm import batch_norm, batch_norm_backward, batch_norm_forward
from .pooling import avg_pool, max_pool, pool, pool_backward, pool_forward
from .shape import (concat_channels, concat_channels_backward, dense_backward, dense_forward,
                    flatten_backward, flatten_forward)
from .upsampling import upsample, upsample_backward, upsample_forward
from .window import AxisWindow

__all__ = [
    "ACTIVATIONS", "AxisWindow", "activation", "activation_backward", "activation_forward",
    "avg_pool", "batch_norm", "batch_norm_backward", "batch_norm_forward", "concat_channels",
    "concat_channels_backward", "conv", "conv_backward", "conv_forward", "conv_transpose",
    "conv_transpose_backward", "conv_transpose_forward", "cross_entropy_backward",
    "cross_entropy_forward", "dense_backward", "dense_forward", "dropout_backward",
    "dropout_forward", "elu", "flatten_backward", "flatten_forward", "leaky_relu",
    "log_softmax", "max_pool", "mse_backward", "mse_forward", "pool", "pool_backward",
    "pool_forward", "relu", "sigmoid", "softmax", "softmax_backward", "softmax_forward", "tanh",
    "upsample", "upsample_backward", "upsample_forward",
]

from .activations_more import (PointwiseActivationSaved, PReLUSaved,  # noqa: E402
                               pointwise_activation_backward, pointwise_activation_forward,
                               prelu_backward, prelu_forward)

__all__ += ["PointwiseActivationSaved", "PReLUSaved", "pointwise_activation_backward",
            "pointwise_activation_forward", "prelu_backward", "prelu_forward"]

from .adaptive_pool import (adaptive_pool, adaptive_pool_backward,  # noqa: E402
                            adaptive_pool_forward)
from .channel_dropout import channel_dropout_backward, channel_dropout_forward  # noqa: E402
from .pad import pad, pad_backward, pad_forward  # noqa: E402
from .resample import interpolate, interpolate_backward, interpolate_forward  # noqa: E402

__all__ += ["adaptive_pool", "adaptive_pool_backward", "adaptive_pool_forward",
            "channel_dropout_backward", "channel_dropout_forward", "pad", "pad_backward",
            "pad_forward", "interpolate", "interpolate_backward", "interpolate_forward"]

# (the modules' plain group_norm/layer_norm stay there: the names are the modules' own)
from .group_norm import GroupNormSaved, group_norm_backward, group_norm_forward  # noqa: E402
from .layer_norm import LayerNormSaved, layer_norm_backward, layer_norm_forward  # noqa: E402

__all__ += ["GroupNormSaved", "group_norm_backward", "group_norm_forward", "LayerNormSaved",
            "layer_norm_backward", "layer_norm_forward"]
