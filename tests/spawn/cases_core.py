"""Rank-mismatch cases: creation, redistribution, halos, reductions (see ``registry.py``)."""
import numpy as np

import disttensor as dt
from disttensor.core.agreement import ArgumentMismatchError

from .registry import case


@case(ArgumentMismatchError, match="split")
def redistribute_split(ctx):
    x = dt.zeros((6, 8), split=(0, None))
    x.redistribute(split=ctx.per_rank((None, 0), (0, None)))


@case(ArgumentMismatchError, match="halo")
def halo_exchange_boundary(ctx):
    x = dt.zeros((6 * ctx.size, 4), halo=1)
    x.exchange_halo(ctx.per_rank("periodic", "zero"))


# -- creation ---------------------------------------------------------------------------------
@case(ArgumentMismatchError, match="'shape'")
def creation_shape(ctx):
    """A global shape computed per rank (say from a rank-local file)."""
    dt.zeros(ctx.per_rank((4 * ctx.size + 1, 3), (4 * ctx.size, 3)))


@case(ArgumentMismatchError, match="'dtype'")
def creation_dtype(ctx):
    dt.ones(4 * ctx.size, dtype=ctx.per_rank("float32", "float64"))


@case(ArgumentMismatchError, match="'split'")
def creation_split(ctx):
    x = dt.zeros((4 * ctx.size, 4 * ctx.size), split=ctx.per_rank(1, 0))
    x.sum(axis=0)  # would wait on the wrong sub-communicator


@case(ArgumentMismatchError, match="'sizes'")
def creation_sizes(ctx):
    """Uneven ownership sizes on one rank only: the blocks would not tile the array."""
    n = 2 * ctx.size
    x = dt.zeros(n, sizes=[ctx.per_rank((n,) + (0,) * (ctx.size - 1), (2,) * ctx.size)])
    x.to_numpy()


@case(ArgumentMismatchError, match="'shape'")
def creation_invalid_on_one_rank(ctx):
    """A negative extent on one rank: that rank's validation error alone would leave the
    others waiting; every rank reports the mismatch instead."""
    dt.zeros(ctx.per_rank(-1, 4))


@case(ArgumentMismatchError, match="'root'")
def from_global_root(ctx):
    dt.from_global(np.arange(8.0), root=ctx.per_rank(1, 0))


@case(ArgumentMismatchError, match="'split'")
def from_local_split(ctx):
    dt.from_local(np.zeros((2, 2)), split=ctx.per_rank((None, 0), (0, None)))


# -- data movement --------------------------------------------------------------------------------
@case(ArgumentMismatchError, match="'sizes'")
def redistribute_sizes(ctx):
    n = 3 * ctx.size
    x = dt.arange(n, dtype="float64")
    x.redistribute(sizes=[ctx.per_rank((n,) + (0,) * (ctx.size - 1), None)])


@case(ArgumentMismatchError, match="'grid'")
def redistribute_grid(ctx):
    g = dt.ProcessGrid((ctx.size, 1))
    x = dt.zeros((2 * ctx.size, 4), grid=g)
    x.redistribute(grid=ctx.per_rank(dt.get_default_grid(), g), split=(None, 0))


@case(ArgumentMismatchError, match="'halo'")
def halo_widths(ctx):
    x = dt.zeros((4 * ctx.size, 4))
    x.with_halo(ctx.per_rank(2, 1)).exchange_halo()


@case(ArgumentMismatchError, match="'root'")
def gather_root(ctx):
    dt.arange(4 * ctx.size).gather(root=ctx.per_rank(1, 0))


# -- indexing -------------------------------------------------------------------------------------
@case(ArgumentMismatchError, match="'key'")
def getitem_index(ctx):
    """An integer index computed per rank: the element row would come from different owners."""
    x = dt.zeros((4 * ctx.size, 3))
    x[ctx.per_rank(4 * ctx.size - 1, 0)]


@case(ArgumentMismatchError, match="'key'")
def setitem_index(ctx):
    x = dt.zeros((4 * ctx.size, 3))
    y = dt.ones((4 * ctx.size, 3)).redistribute(split=(None, 0))
    x[ctx.per_rank(slice(1, None), slice(0, -1))] = y[1:]


# -- reductions and ufuncs ------------------------------------------------------------------------
@case(ArgumentMismatchError, match="'axis'")
def reduction_axis(ctx):
    g = dt.ProcessGrid((ctx.size, 1))
    x = dt.ones((2 * ctx.size, 3), grid=g)
    x.sum(axis=ctx.per_rank(1, 0))


@case(ArgumentMismatchError, match="different collective calls")
def skipped_collective_call(ctx):
    """Rank-dependent branch: one rank takes ``max`` where the others take ``sum``."""
    x = dt.arange(4 * ctx.size, dtype="float64")
    x.max() if ctx.rank == ctx.size - 1 else x.sum()


@case(ArgumentMismatchError, match="'x2'")
def ufunc_operand_distribution(ctx):
    """One rank's operand has another layout: it alone would start a redistribution (and
    agrees first); the others' aligned call moves no data and is deferred, so they raise at
    their next communicating call (here a sum), where the calls meet."""
    a = dt.ones((2 * ctx.size, 4))
    by_rows, by_cols = a.copy(), a.redistribute(split=(None, 0))
    c = a + ctx.per_rank(by_cols, by_rows)
    c.sum()


# -- shape manipulation and random ----------------------------------------------------------------
@case(ArgumentMismatchError, match="'shape'")
def reshape_shape(ctx):
    x = dt.zeros((2 * ctx.size, 6))
    x.reshape(ctx.per_rank((6, 2 * ctx.size), (4 * ctx.size, 3)))


@case(ArgumentMismatchError, match="'axes'")
def transpose_axes(ctx):
    x = dt.zeros((2 * ctx.size, 3, 4))
    x.transpose(ctx.per_rank((1, 0, 2), (0, 2, 1)))


@case(ArgumentMismatchError, match="'axis'")
def concatenate_axis(ctx):
    x = dt.zeros((2 * ctx.size, 2 * ctx.size))
    dt.concatenate([x, x], axis=ctx.per_rank(1, 0))


@case(ArgumentMismatchError, match="'seed'")
def random_seed(ctx):
    """A generator seeded per rank: replicas would silently hold different values."""
    dt.random.default_rng(ctx.per_rank(1234, 42)).normal(shape=(4 * ctx.size,))
