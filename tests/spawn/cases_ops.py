"""Rank-mismatch cases: the distributed CNN ops (see ``registry.py``).

Each op gets an argument that differs on the last rank (``ctx.per_rank(bad, good)``), the way a
rank-dependent branch or configuration would pass it.  Without argument agreement several of
these hang or fail on one rank only (a pooling kernel differing by rank ended in "Message
truncated" on one rank while the others waited; a rank-dependent convolution padding returned
silently with inconsistent global metadata); with it every rank raises
:class:`ArgumentMismatchError` naming the argument before any data moves.
"""
import numpy as np

import disttensor as dt
from disttensor import ops
from disttensor.core import agreement
from disttensor.core.agreement import ArgumentMismatchError

from .registry import case


def _x(ctx, c=4, n=2):
    """An (N, C, W) array, W split over all ranks (8 per rank)."""
    return dt.random.default_rng(0).normal(shape=(n, c, 8 * ctx.size), split=(None, None, 0))


def _w(cout=4, cin=4, k=3, seed=1):
    return np.random.default_rng(seed).standard_normal((cout, cin, k))


# -- convolution ----------------------------------------------------------------------------------
@case(ArgumentMismatchError, match="'padding'")
def conv_padding(ctx):
    """Was: returned on every rank with inconsistent global output shapes."""
    ops.conv_forward(_x(ctx), _w(), padding=ctx.per_rank(1, 0))


@case(ArgumentMismatchError, match="'stride'")
def conv_stride(ctx):
    y, _ = ops.conv_forward(_x(ctx), _w(), padding=1, stride=ctx.per_rank(2, 1))
    y.to_numpy()


@case(ArgumentMismatchError, match="'dilation'")
def conv_dilation(ctx):
    ops.conv_forward(_x(ctx), _w(), padding="same", dilation=ctx.per_rank(2, 1))


@case(ArgumentMismatchError, match="'groups'")
def conv_groups(ctx):
    """The weight fits groups=2 everywhere; one rank asks for 4 groups."""
    ops.conv_forward(_x(ctx), _w(cin=2), groups=ctx.per_rank(4, 2))


@case(ArgumentMismatchError, match="'w'")
def conv_weight_shape(ctx):
    """A kernel of another size on one rank (a model built from a rank-dependent config)."""
    ops.conv_forward(_x(ctx), _w(k=ctx.per_rank(5, 3)), padding="same")


@case(ArgumentMismatchError, match="'output_padding'")
def conv_transpose_output_padding(ctx):
    ops.conv_transpose_forward(_x(ctx), _w(), stride=2, output_padding=ctx.per_rank(1, 0))


@case(ArgumentMismatchError, match="'dy'")
def conv_backward_dy_distribution(ctx):
    """The output gradient distributed differently on one rank (replicated there, split on
    the others): the reverse halo exchange would pair the wrong pieces."""
    x = _x(ctx)
    y, saved = ops.conv_forward(x, _w(), padding=1)
    with agreement.disabled():  # creation sends no message: a rank-local layout
        dy = dt.ones(y.shape, split=ctx.per_rank((None, None, None), (None, None, 0)))
    ops.conv_backward(saved, dy)


@case(ArgumentMismatchError, match="'need_dw'")
def conv_backward_flags(ctx):
    x = _x(ctx)
    y, saved = ops.conv_forward(x, _w(), np.zeros(4), padding=1)
    ops.conv_backward(saved, y, need_dw=ctx.per_rank(False, True))


# -- pooling, upsampling --------------------------------------------------------------------------
@case(ArgumentMismatchError, match="'kernel'")
def pool_kernel(ctx):
    """Was: "Message truncated" on one rank while the others hung in the halo exchange."""
    y, _ = ops.pool_forward(_x(ctx), "max", ctx.per_rank(3, 2))  # (2: deferred, no halo)
    y.sum()


@case(ArgumentMismatchError, match="'mode'")
def pool_mode(ctx):
    y, saved = ops.pool_forward(_x(ctx), ctx.per_rank("avg", "max"), 3, 1, 1)
    ops.pool_backward(saved, y)


@case(ArgumentMismatchError, match="'scale'")
def upsample_scale(ctx):
    """Nearest upsampling sends no message: without agreement each rank would return a block
    of a different global array."""
    y, _ = ops.upsample_forward(_x(ctx), ctx.per_rank(3, 2))
    y.sum()


# -- batch norm, activations, dropout -------------------------------------------------------------
@case(ArgumentMismatchError, match="'eps'")
def batch_norm_eps(ctx):
    ops.batch_norm_forward(_x(ctx), np.ones(4), np.zeros(4), eps=ctx.per_rank(1e-3, 1e-5))


@case(ArgumentMismatchError, match="'momentum'")
def batch_norm_momentum(ctx):
    ops.batch_norm_forward(_x(ctx), np.ones(4), np.zeros(4), np.zeros(4), np.ones(4),
                           momentum=ctx.per_rank(0.01, 0.1))


@case(ArgumentMismatchError, match="'training'")
def batch_norm_training_flag(ctx):
    """One rank in inference mode: it would skip the statistics Allgather the others wait in."""
    ops.batch_norm_forward(_x(ctx), np.ones(4), np.zeros(4), np.zeros(4), np.ones(4),
                           training=ctx.per_rank(False, True))


@case(ArgumentMismatchError, match="'alpha'")
def leaky_relu_slope(ctx):
    """Moves no data: agreed with the next call that communicates (the sum), which raises."""
    y = ops.leaky_relu(_x(ctx), ctx.per_rank(0.2, 0.01))
    y.sum()


@case(ArgumentMismatchError, match="'name'")
def activation_differs(ctx):
    """relu on one rank, leaky_relu on the others: both defer their agreement, which the next
    collective call makes and finds the activation's name differing."""
    x = _x(ctx)
    x = ops.relu(x) if ctx.rank == ctx.size - 1 else ops.leaky_relu(x, 0.1)
    ops.pool_forward(x, "max", 3, 1, 1)  # (a halo: agreed at once)


@case(ArgumentMismatchError, match="'seed'")
def dropout_seed(ctx):
    ops.dropout_forward(_x(ctx), 0.5, ctx.per_rank(2, 1))


# -- shape ops, losses ----------------------------------------------------------------------------
@case(ArgumentMismatchError, match="'w'")
def dense_weight_shape(ctx):
    x = dt.ones((2 * ctx.size, 6), split=(0, None))
    y, _ = ops.dense_forward(x, np.ones((ctx.per_rank(4, 3), 6)))  # (deferred: no data moves)
    y.sum()


@case(ArgumentMismatchError, match="'xs'")
def concat_operands(ctx):
    x = _x(ctx)
    ops.concat_channels(ctx.per_rank([x, x, x], [x, x]))


@case(ArgumentMismatchError, match="'reduction'")
def loss_reduction(ctx):
    x = _x(ctx)
    ops.mse_forward(x, x, ctx.per_rank("sum", "mean"))


@case(ArgumentMismatchError, match="'labels'")
def cross_entropy_labels_layout(ctx):
    x = _x(ctx)
    with agreement.disabled():
        labels = dt.zeros((2, 8 * ctx.size), dtype="int64",
                          split=ctx.per_rank((None, None), (None, 0)))
    ops.cross_entropy_forward(x, labels)
