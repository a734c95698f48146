"""Rank-mismatch cases: the training layer (models, data parallelism, the training CLI)."""
import numpy as np

import disttensor as dt
from disttensor import nn, train
from disttensor.core.agreement import ArgumentMismatchError
from disttensor.autograd import Tensor
from disttensor.nn import functional as F
from disttensor.nn.models import CosmoFlow

from .registry import case


def _cosmoflow(seed):
    return CosmoFlow(input_size=8, in_channels=2, widths=(3, 4), dense=(5,), outputs=3,
                     dtype="float64", rng=np.random.default_rng(seed))


@case(ValueError, match="differs between ranks")
def ddp_replicas_differ(ctx):
    """A model built from a rank-dependent seed."""
    g = dt.ProcessGrid((ctx.size, 1, 1, 1))
    nn.DistributedDataParallel(_cosmoflow(ctx.per_rank(2, 1)), g)


@case(ArgumentMismatchError, match="bucket_bytes")
def ddp_bucket_bytes(ctx):
    g = dt.ProcessGrid((ctx.size, 1, 1, 1))
    nn.DistributedDataParallel(_cosmoflow(1), g, bucket_bytes=ctx.per_rank(1024, 4096))


@case(ArgumentMismatchError, match="argv")
def train_cli_learning_rate(ctx):
    """The training CLI with a rank-dependent option (before any file is touched)."""
    train.run(["cosmoflow", "--data", str(ctx.tmp / "none.h5"), "--lr",
               ctx.per_rank("2e-3", "1e-3")])


@case(ArgumentMismatchError, match="argv")
def train_cli_bad_option_on_one_rank(ctx):
    """An option argparse rejects, on one rank only: argparse would exit there and leave the
    others waiting; the ranks agree on the command line first."""
    train.run(["cosmoflow", "--data", str(ctx.tmp / "none.h5"),
               *ctx.per_rank(["--no-such-option"], [])])


@case(ArgumentMismatchError, match="padding")
def conv_layer_padding(ctx):
    """A layer configured per rank (rank-dependent padding)."""
    g = dt.ProcessGrid((1, ctx.size, 1, 1))
    conv = nn.Conv3d(2, 3, 3, padding=ctx.per_rank(0, 1), rng=np.random.default_rng(0))
    x = dt.zeros((2, 2, 4 * ctx.size, 4, 4), dtype="float32", grid=g, split=(0, None, 1, 2, 3))
    conv(Tensor(x))


@case(ArgumentMismatchError, match="different collective calls")
def backward_skipped_on_one_rank(ctx):
    """One rank skips ``loss.backward()`` and goes on to the next collective call."""
    g = dt.ProcessGrid((1, ctx.size, 1, 1))
    conv = nn.Conv3d(2, 3, 3, padding=1, rng=np.random.default_rng(0))
    x = dt.ones((2, 2, 4 * ctx.size, 4, 4), dtype="float32", grid=g, split=(0, None, 1, 2, 3))
    loss = F.mse_loss(conv(Tensor(x)), Tensor(dt.zeros((2, 3, 4 * ctx.size, 4, 4),
                                                       dtype="float32", grid=g,
                                                       split=(0, None, 1, 2, 3))))
    if ctx.rank != ctx.size - 1:
        loss.backward()
    x.max()
