"""Distributed layer normalization, forward and backward.

``x`` is any DistArray (any split, uneven and empty blocks); ``normalized_shape`` names its
trailing axes ``k = ndim - len(normalized_shape), ..., ndim - 1``, which are normalized
together for every index of the leading axes (PyTorch's ``layer_norm``: biased variance,
``eps`` inside the square root, an elementwise affine ``gamma``/``beta`` of shape
``normalized_shape``).  The normalized axes may be split: each rank takes the per-row mean and
sum of squared deviations of its block (float64), and the ranks of the grid axes splitting the
normalized axes (the statistics communicator; its ranks hold the same rows) merge them with one
small Allgather and Chan's rule in rank order (bit-identical on every rank), as
:mod:`.group_norm` does.  Nothing is exchanged when no normalized axis is split.

Backward: the per-row sums ``[sum gamma*dy, sum gamma*dy*xhat]`` are summed over the
statistics communicator with one small all-reduce.  When no leading axis is split
(``saved.param_sums_in_stats``) each rank's column sums are its block of the final
``dgamma``/``dbeta``: one Allgatherv in the parameters' dtype assembles them on every rank (a
normalized shape as large as a sample makes these gradients as large as the sample; an
all-reduce of zero-padded float64 arrays moved ~4x the bytes).  Otherwise the parameter
gradients are summed over the ranks holding different data (``reduce=True``) or left as
per-rank partial sums.  Errors
(``ValueError`` on every rank, PyTorch raises ``RuntimeError``): ``normalized_shape`` not
matching the input's trailing axes, parameters of another shape.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.array import DistArray
from ..core.comm import allreduce
from ..core.entry import agreed, canon, collective_entry
from .group_norm import _shape_list, norm_kernels, stats_axes
from .norm import _combine_moments
from ._spatial import array_key, check_gradient_layout, param_comm

__all__ = ["layer_norm_forward", "layer_norm_backward", "layer_norm", "LayerNormSaved",
           "normalized_tuple"]


@dataclass
class LayerNormSaved:
    x: DistArray
    first: int            # first normalized axis
    mean: object          # float64 (rows,) of this block
    invstd: object        # float64 (rows,)
    gamma: object         # normalized_shape array or None
    beta_dtype: object    # beta's dtype, None without beta
    count: float          # values per row in the whole array
    stats_axes: tuple     # grid axes splitting the normalized axes

    @property
    def param_sums_in_stats(self) -> bool:
        """Whether the statistics all-reduce of the backward sums ``dgamma``/``dbeta`` over
        every rank holding different data (no leading axis split)."""
        return (all(s is None for s in self.x.split[:self.first])
                and math.prod(self.x.grid.dims[a] for a in self.stats_axes) > 1)


def normalized_tuple(normalized_shape) -> tuple:
    """``normalized_shape`` (an int or a sequence of ints) as a tuple of ints (pure)."""
    if isinstance(normalized_shape, (int, np.integer)) and not isinstance(normalized_shape,
                                                                            bool):
        return (int(normalized_shape),)
    try:
        t = tuple(normalized_shape)
    except TypeError:
        raise TypeError(f"normalized_shape must be an int or a sequence of ints, got "
                        f"{normalized_shape!r}") from None
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in t):
        raise TypeError(f"normalized_shape must be an int or a sequence of ints, got "
                        f"{normalized_shape!r}")
    return tuple(int(v) for v in t)


def _check(x, ns, gamma, beta):
    if not ns:
        raise ValueError("Expected normalized_shape to be at least 1-dimensional, i.e., "
                         "containing at least one element, but got normalized_shape = []")
    if len(ns) > x.ndim or tuple(x.shape[x.ndim - len(ns):]) != ns:
        raise ValueError(f"Given normalized_shape={_shape_list(ns)}, expected input with "
                         f"shape [*, {', '.join(map(str, ns))}], but got input of "
                         f"size{_shape_list(x.shape)}")
    for name, v in (("weight", gamma), ("bias", beta)):
        if v is not None and tuple(v.shape) != ns:
            raise ValueError(f"Expected {name} to be of same shape as normalized_shape, but "
                             f"got {name} of shape {_shape_list(v.shape)} and "
                             f"normalized_shape = {_shape_list(ns)}")


def _local_params(xp, v, slices, size, fill):
    """This block's part of the parameter ``v``, flattened (float32 stays float32: the
    kernels read it as is and compute in float64; ``fill`` for ``None``)."""
    if v is None:
        return xp.full(size, fill, dtype=xp.float64)
    part = v[slices]
    if part.dtype != xp.float32:
        part = part.astype(xp.float64)
    return xp.ascontiguousarray(part.reshape(-1))


def _rows_cols(a, first):
    from ..core.backend import array_module
    a = array_module(a).ascontiguousarray(a)
    return a.reshape(math.prod(a.shape[:first]), math.prod(a.shape[first:]))


@collective_entry
def layer_norm_forward(x: DistArray, normalized_shape, gamma=None, beta=None,
                       eps: float = 1e-5):
    """Layer-normalize ``x`` over its trailing ``normalized_shape`` axes; ``gamma``/``beta``
    arrays of that shape on ``x``'s device, or ``None``.  Returns ``(y, saved)``, ``y``
    distributed like ``x`` (no halo), of ``x``'s dtype.  Collective (one Allgather over the
    statistics communicator when a normalized axis is split)."""
    xp = x.xp
    try:
        ns = normalized_tuple(normalized_shape)
    except TypeError:
        ns = canon(normalized_shape)
    with agreed(x.grid.cart, "layer_norm_forward", rank_local=True, x=x,
                normalized_shape=ns, gamma=array_key(gamma), beta=array_key(beta), eps=eps):
        ns = normalized_tuple(normalized_shape)
        _check(x, ns, gamma, beta)
        first = x.ndim - len(ns)
        k = norm_kernels(x.local)
        x2 = _rows_cols(x.local, first)
        mean_r, m2_r = k.row_moments(x2)
    axes = stats_axes(x.split, first)
    comm = x.grid.sub_comm(axes) if axes else None
    _, mean, m2 = _combine_moments(comm, x2.shape[1], xp.asarray(mean_r), xp.asarray(m2_r))
    count = float(math.prod(ns))
    invstd = 1.0 / xp.sqrt(m2 / max(count, 1.0) + eps)
    sl = x.local_slices[first:]
    y = k.ln_forward_apply(x2, mean, invstd, _local_params(xp, gamma, sl, x2.shape[1], 1.0),
                           _local_params(xp, beta, sl, x2.shape[1], 0.0))
    saved = LayerNormSaved(x, first, mean, invstd, gamma,
                           None if beta is None else beta.dtype, count, axes)
    return DistArray(y.reshape(x.local.shape), x.distribution, x.grid), saved


def _param_dtype(saved):
    """One dtype for both parameter gradients (float64 where gamma's and beta's differ)."""
    dts = {np.dtype(d) for d in (None if saved.gamma is None else saved.gamma.dtype,
                                 saved.beta_dtype) if d is not None}
    return dts.pop() if len(dts) == 1 else np.dtype(np.float64)


def _gather_blocks(x, first, comm, cols, dtype):
    """``(2, *normalized_shape)``: every rank's ``cols`` (its block of the normalized axes, two
    rows) in ``dtype``, gathered over ``comm`` (the ranks that differ only along the grid
    axes splitting the normalized axes, row-major over them) with one Allgatherv and placed
    at each rank's block: the full parameter gradients on every rank, from a fraction of the
    bytes an all-reduce of zero-padded arrays moves.  Collective over ``comm``; NumPy only."""
    d = x.distribution
    axes = sorted(set(g for g in x.split[first:] if g is not None))
    dims = [x.grid.dims[a] for a in axes]
    mine = list(x.grid.coords)
    shapes, slices = [], []
    for i in range(comm.size):
        coords = list(mine)
        for a, c in zip(axes, np.unravel_index(i, dims)):
            coords[a] = int(c)
        slices.append(d.block_slices(tuple(coords))[first:])
        shapes.append(d.block_shape(tuple(coords))[first:])
    counts = [2 * int(np.prod(sh)) for sh in shapes]
    send = np.ascontiguousarray(cols, dtype=dtype).reshape(-1)
    recv = np.empty(sum(counts), dtype=dtype)
    comm.Allgatherv(send, [recv, counts])
    full = np.empty((2,) + tuple(x.shape[first:]), dtype=dtype)
    off = 0
    for n, sh, sl in zip(counts, shapes, slices):
        full[(slice(None),) + sl] = recv[off:off + n].reshape((2,) + tuple(sh))
        off += n
    return full


@collective_entry
def layer_norm_backward(saved: LayerNormSaved, dy: DistArray, reduce: bool = True):
    """Gradients ``(dx, dgamma, dbeta)``: ``dgamma`` ``None`` without ``gamma``, ``dbeta``
    ``None`` without ``beta``; parameter gradients of ``normalized_shape`` in ``gamma``'s
    dtype, summed over the ranks holding different data when ``reduce`` or
    ``saved.param_sums_in_stats``, else this rank's partial sums (zero outside its block).
    Collective."""
    x = saved.x
    xp = x.xp
    first = saved.first
    k = norm_kernels(dy.local)
    sl = x.local_slices[first:]
    # the column sums straight in the parameters' dtype where they are final here or are
    # gathered as they are; float64 where an all-reduce will add them up
    final = not saved.stats_axes and not (reduce and param_comm(x).size > 1)
    gather = saved.param_sums_in_stats and xp is np
    cols_dtype = _param_dtype(saved) if (final or gather) else np.float64
    with agreed(dy.grid.cart, "layer_norm_backward", rank_local=True, dy=dy,
                reduce=bool(reduce)):
        check_gradient_layout(dy, x.distribution, "layer-norm")
        dy2, x2 = _rows_cols(dy.local, first), _rows_cols(x.local, first)
        g_loc = _local_params(xp, saved.gamma, sl, x2.shape[1], 1.0)
        s_a, s_b, cols = k.ln_backward_sums(dy2, x2, saved.mean, saved.invstd, g_loc,
                                            cols_dtype)
    ns = tuple(x.shape[first:])
    rows = x2.shape[0]
    has_params = saved.gamma is not None or saved.beta_dtype is not None
    sums = xp.concatenate([xp.asarray(s_a, dtype=xp.float64),
                           xp.asarray(s_b, dtype=xp.float64)])
    comm = x.grid.sub_comm(saved.stats_axes) if saved.stats_axes else None
    if comm is not None and comm.size > 1:
        sums = allreduce(comm, sums, "sum")
    gathered = None
    if has_params and saved.param_sums_in_stats and xp is np:
        # every column sum is complete on the rank holding the column: gather the blocks
        gathered = _gather_blocks(x, first, comm, xp.asarray(cols), _param_dtype(saved))
    elif has_params:
        if not saved.stats_axes:       # this block holds all of normalized_shape
            params = xp.asarray(cols).reshape(-1)
        else:                          # its part of it, zeros elsewhere
            params = xp.zeros((2,) + ns)
            params[(slice(None),) + sl] = xp.asarray(cols).reshape(
                (2,) + x.local.shape[first:])
            params = params.reshape(-1)
        if reduce or saved.param_sums_in_stats:
            params = allreduce(param_comm(x), params, "sum")
    m = max(saved.count, 1.0)
    dx = k.ln_backward_apply(dy2, x2, saved.mean, saved.invstd, g_loc, sums[:rows] / m,
                             sums[rows:] / m)
    dx = DistArray(dx.reshape(x.local.shape), x.distribution, x.grid)
    if not has_params:
        return dx, None, None
    params = gathered if gathered is not None else params.reshape((2,) + ns)
    dgamma = None if saved.gamma is None else params[0].astype(saved.gamma.dtype, copy=False)
    dbeta = None if saved.beta_dtype is None else params[1].astype(saved.beta_dtype, copy=False)
    return dx, dgamma, dbeta


def layer_norm(x: DistArray, normalized_shape, gamma=None, beta=None,
               eps: float = 1e-5) -> DistArray:
    """:func:`layer_norm_forward` without the saved state."""
    return layer_norm_forward(x, normalized_shape, gamma, beta, eps)[0]
