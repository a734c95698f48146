"""Rank-mismatch cases: creation, redistribution, halos, reductions (see ``registry.py``)."""
import numpy as np

import disttensor as dt
from disttensor.agreement import ArgumentMismatchError

from .registry import case


@case(ArgumentMismatchError, match="split")
def redistribute_split(ctx):
    x = dt.zeros((6, 8), split=(0, None))
    x.redistribute(split=ctx.per_rank((None, 0), (0, None)))


@case(ArgumentMismatchError, match="halo")
def halo_exchange_boundary(ctx):
    x = dt.zeros((6 * ctx.size, 4), halo=1)
    x.exchange_halo(ctx.per_rank("periodic", "zero"))
