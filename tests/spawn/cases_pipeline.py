"""Rank-mismatch cases: pipeline parallelism (:class:`disttensor.nn.Pipeline`)."""
import numpy as np

import disttensor as dt
from disttensor.core.agreement import ArgumentMismatchError
from disttensor.nn import Pipeline
from disttensor.nn import functional as F
from disttensor.nn.models import CosmoFlow

from .registry import case


def _cosmoflow(seed=1):
    return CosmoFlow(input_size=8, in_channels=2, widths=(3, 4), dense=(5,), outputs=3,
                     dtype="float64", rng=np.random.default_rng(seed))


@case(ArgumentMismatchError, match="schedule")
def pipeline_schedule(ctx):
    """A schedule that differs between the ranks of one pipeline (the stages would run their
    sends and receives in different orders and wait for each other forever)."""
    g = dt.ProcessGrid((1, ctx.size, 1, 1, 1))
    Pipeline(_cosmoflow(), g, chunks=2, schedule=ctx.per_rank("1f1b", "gpipe"))


@case(ValueError, match="differs between ranks")
def pipeline_replicas_differ(ctx):
    """Stages built from different seeds."""
    g = dt.ProcessGrid((1, ctx.size, 1, 1, 1))
    Pipeline(_cosmoflow(ctx.per_rank(2, 1)), g)


@case(ValueError, match="divisible by")
def pipeline_batch_on_stage_zero(ctx):
    """A batch the micro-batches do not divide, known only to stage 0 (the other stages get
    no input): every stage raises, none waits for an activation."""
    g = dt.ProcessGrid((1, ctx.size, 1, 1, 1))
    pipe = Pipeline(_cosmoflow(), g, chunks=4)
    x = y = None
    if pipe.stage == 0:
        x = dt.from_global(np.zeros((6, 2, 8, 8, 8)), grid=pipe.stage_grid,
                           split=(0, None, 1, 2, 3))
    if pipe.stage == pipe.stages - 1:
        y = dt.from_global(np.zeros((6, 3)), grid=pipe.stage_grid, split=(0, None))
    pipe.train_step(x, y, F.mse_loss)
