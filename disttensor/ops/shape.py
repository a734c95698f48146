"""Channel concatenation, flatten and dense (fully connected) layers, forward and backward.

* :func:`concat_channels`: U-Net skip connections.  The operands are brought to the first
  one's distribution of the non-channel axes (redistributing where they differ) and
  concatenated locally; the backward slices the gradient and sends each piece back to its
  operand's distribution.
* :func:`flatten_forward`: ``(N, C, *S) -> (N, C*prod(S))`` with the sample axis split as in
  the input and every other axis whole: the spatial blocks are gathered over the spatial grid
  axes, whose ranks then hold replicas (NumPy blocks: one ``MPI_Allgatherv`` over the ranks
  holding the same samples, after the call's agreement; the plan of who holds what is cached
  per layout).  The backward is the redistribution back (the global array is unchanged by a
  redistribution, so its gradient is too), which moves no data: each rank's gradient block is
  a slice of the replica it holds.
* :func:`dense_forward`: ``y = x @ w.T + b`` on ``(N, F)`` blocks with the features whole;
  ``dw``/``db`` are summed over the ranks holding different samples (replicas count once).

Every entry point agrees on its arguments (the arrays' metadata, the weight's shape) before any
message, the local ones (dense, flatten without a redistribution, flatten's backward) too: they
set the output's global metadata, which a rank-dependent argument would make inconsistent.
Those move no data,
so their agreement is deferred to the next agreement over the grid
(:func:`~disttensor.core.entry.deferrable`): no all-reduce of their own.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ..core import buffer_pool as _pool
from ..core.array import DistArray
from ..core.entry import agreed, collective_entry, deferrable
from ..core.backend import array_module
from ..core.comm import allreduce_owned
from ..core.distribution import Distribution, coords_to_rank, rank_to_coords
from ..core.watchdog import waiting
from ._spatial import array_key, check_gradient_layout, param_comm, with_channels

__all__ = ["concat_channels", "concat_channels_backward", "flatten_forward",
           "flatten_backward", "FlattenSaved", "dense_forward", "dense_backward", "DenseSaved"]


@collective_entry
def concat_channels(xs) -> tuple[DistArray, list[Distribution]]:
    """Concatenate ``(N, C_i, *S)`` arrays along the channel axis (collective: the ranks agree
    on the operands' metadata; operands distributed differently, possibly on other grids over
    the same ranks, are redistributed).  Returns ``(y, layouts)``; ``layouts`` (the operands'
    distributions and grids) is what :func:`concat_channels_backward` needs.  An empty list
    raises without a message (there is no communicator to agree over)."""
    xs = list(xs)
    if not xs:
        raise ValueError("concat_channels needs at least one array")
    first = xs[0]
    with agreed(first.grid.cart, "concat_channels", xs=tuple(xs)):
        if first.ndim < 2 or first.split[1] is not None:
            raise ValueError(f"concat_channels needs (N, C, ...) arrays with an unsplit channel "
                             f"axis, got split {first.split}")
        for x in xs[1:]:
            if x.ndim != first.ndim or \
                    x.shape[:1] + x.shape[2:] != first.shape[:1] + first.shape[2:]:
                raise ValueError(f"concat_channels: shapes {first.shape} and {x.shape} differ "
                                 "outside the channel axis")
    layouts = [(x.distribution, x.grid) for x in xs]
    parts = []
    for x in xs:
        want = with_channels(first.distribution, x.shape[1])
        parts.append(x.local if x.distribution == want and x.grid is first.grid
                     else x.redistribute(grid=first.grid, distribution=want).local)
    xp = first.xp
    y = xp.concatenate(parts, axis=1)
    ctot = sum(x.shape[1] for x in xs)
    return DistArray(y, with_channels(first.distribution, ctot), first.grid), layouts


@collective_entry
def concat_channels_backward(layouts, dy: DistArray) -> list[DistArray]:
    """Split ``dy`` along the channels into gradients distributed like the operands
    (``layouts``: what :func:`concat_channels` returned with its output).  Collective."""
    layouts = list(layouts)
    with agreed(dy.grid.cart, "concat_channels_backward", dy=dy,
                layouts=tuple((d, g) for d, g in layouts)):
        if layouts:
            ctot = sum(d.shape[1] for d, _ in layouts)
            check_gradient_layout(dy, with_channels(layouts[0][0], ctot),
                                  "channel concatenation")
    out = []
    c0 = 0
    for d, grid in layouts:
        c = d.shape[1]
        piece = dy.local[:, c0:c0 + c]
        g = DistArray(array_module(piece).ascontiguousarray(piece),
                      with_channels(dy.distribution, c), dy.grid)
        same = g.distribution == d and grid is dy.grid
        out.append(g if same else g.redistribute(grid=grid, distribution=d))
        c0 += c
    return out


@dataclass
class FlattenSaved:
    x_dist: Distribution
    gathered: Distribution
    out_dist: Distribution | None = None


def _same_blocks(a: Distribution, b: Distribution) -> bool:
    """Whether every rank's block is the same under ``a`` and ``b`` (equal, or differing only
    in axes split over grid axes of extent 1): then going from one to the other moves no
    data."""
    return a == b or (a.shape == b.shape and a.grid_dims == b.grid_dims
                      and a.split[0] == b.split[0] and a.offsets == b.offsets)


@functools.lru_cache(maxsize=256)
def _flatten_dists(d: Distribution) -> tuple[Distribution, Distribution, bool]:
    """``(gathered, flat, local)``: the input's layout with every axis but the sample axis
    whole, the flattened output's, and whether going to ``gathered`` moves no data (a pure
    function of the input's layout, cached: a step flattens the same layout every time)."""
    ndim = len(d.shape)
    gathered = Distribution(d.shape, d.grid_dims, (d.split[0],) + (None,) * (ndim - 1),
                            [d.sizes(0) if d.split[0] is not None else None]
                            + [None] * (ndim - 1))
    feat = 1
    for n in d.shape[1:]:
        feat *= n
    fd = Distribution((d.shape[0], feat), d.grid_dims, (d.split[0], None),
                      [gathered.sizes(0) if d.split[0] is not None else None, None])
    return gathered, fd, _same_blocks(d, gathered)


@collective_entry
def flatten_forward(x: DistArray):
    """``(N, ...) -> (N, prod(...))``; the sample axis keeps its split, all others are whole
    (collective: the ranks agree on ``x``'s metadata; when the input is split beyond the
    sample axis, its blocks are then gathered over those grid axes (one ``MPI_Allgatherv`` of
    NumPy blocks, a redistribution of CuPy ones); otherwise no data moves and the agreement is
    deferred).  Returns ``(y, saved)``."""
    d = x.distribution
    gathered, fd, local = _flatten_dists(d) if x.ndim >= 2 else (d, None, True)
    gate = deferrable if local else agreed  # (deferred when no data moves)
    with gate(x.grid.cart, "flatten_forward", x=x):
        if x.ndim < 2:
            raise ValueError(f"flatten needs at least 2 axes, got shape {x.shape}")
    if local:
        loc = x.local
    elif type(x.local) is np.ndarray:
        loc = _gather_blocks(x, gathered)
    else:
        loc = x.redistribute(distribution=gathered).local
    flat = loc.reshape(loc.shape[0], fd.shape[1])
    return DistArray(flat, fd, x.grid), FlattenSaved(d, gathered, fd)


@dataclass(frozen=True)
class _GatherPlan:
    """How one rank gathers its block of ``gathered`` from the blocks of ``x_dist``: the grid
    axes the other axes are split over (their sub-communicator holds the ranks with this
    rank's samples, one block each, in its rank order), each member's element count and
    offset in the received buffer, and where its block goes in the gathered block."""
    axes: tuple
    counts: tuple   # in bytes (the blocks move as MPI_BYTE: any dtype)
    displs: tuple   # in bytes
    total: int      # elements
    pieces: tuple   # (index into the gathered block, block shape, start, stop) per member
    shape: tuple    # this rank's block of ``gathered``


@functools.lru_cache(maxsize=256)
def _gather_plan(x_dist: Distribution, gathered: Distribution, rank: int,
                 itemsize: int) -> _GatherPlan:
    """The :class:`_GatherPlan` of ``rank`` for elements of ``itemsize`` bytes (pure,
    cached: a step flattens one layout)."""
    dims = x_dist.grid_dims
    axes = tuple(sorted({g for g in x_dist.split[1:] if g is not None}))
    mine = rank_to_coords(rank, dims)
    g = gathered.rank_box(rank)
    counts, displs, pieces, at = [], [], [], 0
    for sub in np.ndindex(*[dims[a] for a in axes]):
        coords = list(mine)
        for a, c in zip(axes, sub):
            coords[a] = c
        b = x_dist.rank_box(coords_to_rank(coords, dims))
        n = int(np.prod(b.shape, dtype=np.int64))
        index = tuple(slice(a0 - g0, a1 - g0) for a0, a1, g0 in zip(b.start, b.stop, g.start))
        counts.append(n * itemsize)
        displs.append(at * itemsize)
        pieces.append((index, tuple(b.shape), at, at + n))
        at += n
    return _GatherPlan(axes, tuple(counts), tuple(displs), at, tuple(pieces), tuple(g.shape))


def _gather_blocks(x: DistArray, gathered: Distribution) -> np.ndarray:
    """This rank's block of ``gathered`` (every axis but the sample axis whole) from the
    NumPy blocks of ``x``: one ``MPI_Allgatherv`` of the blocks over the ranks holding the
    same samples, then each block copied into place.  Collective over the grid; called after
    the agreement of :func:`flatten_forward`."""
    grid = x.grid
    src = x.local
    dtype = src.dtype
    plan = _gather_plan(x.distribution, gathered, grid.cart.rank, dtype.itemsize)
    comm = grid.sub_comm(plan.axes)
    if not src.flags.c_contiguous:
        src = np.ascontiguousarray(src)
    out = _pool.empty(plan.shape, dtype)   # (recycled when steady, as the buffer below)
    if comm.size == 1:
        np.copyto(out[plan.pieces[0][0]], src)
        return out
    recv = _pool.empty((plan.total,), dtype)
    with waiting(comm, "MPI_Allgatherv (flatten)"):
        comm.Allgatherv([src, MPI.BYTE], [recv, plan.counts, plan.displs, MPI.BYTE])
    for index, shape, start, stop in plan.pieces:
        np.copyto(out[index], recv[start:stop].reshape(shape))
    return out


@functools.lru_cache(maxsize=256)
def _block_in_gathered(gathered: Distribution, x_dist: Distribution, rank: int) -> tuple:
    """Index of ``rank``'s block of ``x_dist`` in its block of ``gathered`` (which holds it:
    the same sample range, every other axis whole), what the redistribution from ``gathered``
    back to ``x_dist`` keeps on each rank without a message."""
    g, b = gathered.rank_box(rank), x_dist.rank_box(rank)  # (gathered: _flatten_dists)
    return tuple(slice(a0 - g0, a1 - g0) for a0, a1, g0 in zip(b.start, b.stop, g.start))


@collective_entry
def flatten_backward(saved: FlattenSaved, dy: DistArray) -> DistArray:
    """Gradient with respect to the flatten input (collective: the ranks agree on ``dy``'s
    metadata).  No data moves, even where the forward gathered: every rank holds the whole
    gradient of its samples and keeps the slice of its input block (the redistribution back,
    whose plan sends nothing), so the agreement is deferred."""
    with deferrable(dy.grid.cart, "flatten_backward", dy=dy, x=saved.x_dist):
        if saved.out_dist is not None:
            check_gradient_layout(dy, saved.out_dist, "flatten")
    g = saved.gathered
    loc = dy.local.reshape((dy.local.shape[0],) + g.shape[1:])
    if _same_blocks(g, saved.x_dist):
        return DistArray(loc, saved.x_dist, dy.grid)
    part = loc[_block_in_gathered(g, saved.x_dist, dy.grid.cart.rank)]
    if type(part) is np.ndarray:   # (a contiguous copy, recycled when steady)
        out = _pool.empty(part.shape, part.dtype)
        np.copyto(out, part)
        return DistArray(out, saved.x_dist, dy.grid)
    return DistArray(array_module(part).ascontiguousarray(part), saved.x_dist, dy.grid)


@dataclass
class DenseSaved:
    x: DistArray
    w: object
    has_bias: bool


@functools.lru_cache(maxsize=256)
def _dense_out_dist(d: Distribution, fout: int) -> Distribution:
    return Distribution((d.shape[0], fout), d.grid_dims, d.split, [d.split_sizes[0], None])


def _product(a, b):
    """``a @ b`` of two 2-d arrays; NumPy operands of one dtype write into an array of the
    shared recycler (:func:`disttensor.core.buffer_pool.empty`: no allocation in a steady
    step, the same BLAS call and bits)."""
    if type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == b.dtype:
        return np.matmul(a, b, out=_pool.empty((a.shape[0], b.shape[1]), a.dtype))
    return a @ b


def _column_sums(a):
    """``a.sum(axis=0)``; into a recycled array for NumPy (same reduction, same bits)."""
    if type(a) is np.ndarray:
        return np.sum(a, axis=0, out=_pool.empty(a.shape[1:], a.dtype))
    return a.sum(axis=0)


@collective_entry
def dense_forward(x: DistArray, w, b=None):
    """``y = x @ w.T + b`` for ``x`` ``(N, F)`` with the feature axis whole, ``w``
    ``(Fout, F)``, ``b`` ``(Fout,)``.  No data moves; collective only to agree on the
    arguments (the weight's shape sets the output's), deferred to the next agreement over
    the grid (:func:`~disttensor.core.entry.deferrable`).  Returns ``(y, saved)``."""
    with deferrable(x.grid.cart, "dense_forward", x=x, w=array_key(w), b=array_key(b)):
        if x.ndim != 2 or x.split[1] is not None:
            raise ValueError(f"dense needs (N, F) input with the feature axis not split, got "
                             f"shape {x.shape} split {x.split}; flatten first")
        if w.ndim != 2 or w.shape[1] != x.shape[1]:
            raise ValueError(f"dense: weight {tuple(w.shape)} does not fit {x.shape[1]} "
                             "features")
        if b is not None and tuple(b.shape) != (w.shape[0],):
            raise ValueError(f"dense: bias must have shape ({w.shape[0]},), got "
                             f"{tuple(b.shape)}")
    y = _product(x.local, w.T.astype(x.dtype, copy=False))
    if b is not None:
        if type(y) is np.ndarray:
            y += b.astype(x.dtype, copy=False)   # (y is this call's own: same bits as y + b)
        else:
            y = y + b.astype(x.dtype, copy=False)
    yd = _dense_out_dist(x.distribution, w.shape[0])
    return DistArray(y, yd, x.grid), DenseSaved(x, w, b is not None)


@collective_entry
def dense_backward(saved: DenseSaved, dy: DistArray, need_dx: bool = True, reduce: bool = True):
    """``(dx, dw, db)``; ``dw``/``db`` summed over the ranks holding different samples unless
    ``reduce=False``.  Collective (the ranks agree on ``dy``'s metadata and the flags; with
    ``reduce=False`` no data moves and the agreement is deferred)."""
    x = saved.x
    gate = agreed if reduce else deferrable  # (without the sums no data moves)
    with gate(dy.grid.cart, "dense_backward", dy=dy, need_dx=bool(need_dx),
              reduce=bool(reduce)):
        check_gradient_layout(dy, _dense_out_dist(x.distribution, saved.w.shape[0]), "dense")
    dx = DistArray(_product(dy.local, saved.w.astype(dy.dtype, copy=False)), x.distribution,
                   x.grid) if need_dx else None
    comm = param_comm(x)
    dw = _product(dy.local.T, x.local)
    db = _column_sums(dy.local) if saved.has_bias else None
    if reduce:
        dw = allreduce_owned(comm, dw, "sum")   # (dw and db are this call's own)
        if db is not None:
            db = allreduce_owned(comm, db, "sum")
    return dx, dw, db
