"""Distributed group and instance normalization, forward and backward.

``x`` is ``(N, C, *S)`` (0 to 3 spatial axes, channel axis not split) on any grid: the sample
axis and any spatial axes may be split, with uneven and empty blocks.  Group norm with ``G``
groups normalizes each sample's group of ``C/G`` consecutive channels over all its spatial
positions (PyTorch's ``group_norm``: biased variance, ``eps`` inside the square root); instance
norm is group norm with ``G = C`` and PyTorch's own rules for running statistics
(``instance_norm``: the batch's mean over samples of the per-instance means and unbiased
variances updates ``running_mean``/``running_var``; with ``use_input_stats=False`` it
normalizes with them).  The affine ``gamma``/``beta`` are per channel.

Statistics: each rank takes its block's per-(sample, group) mean and sum of squared deviations
in float64 (:func:`disttensor.ops.local.cpu.normalization.row_moments` and its GPU twin); the
ranks that hold different spatial parts of the same samples (the grid axes splitting the
spatial axes: the *statistics communicator*) exchange them with one small Allgather and merge
them by Chan's rule in rank order (:func:`disttensor.ops.norm._combine_moments`: bit-identical
on every rank).  Nothing is exchanged when no spatial axis is split.

Backward: the per-(sample, group) sums ``[sum gamma*dy, sum gamma*dy*(x - mean)]`` are summed
over the statistics communicator with one all-reduce, which also carries ``dgamma``/``dbeta``
when the sample axis is not split (then that communicator already spans every rank holding
different data: ``saved.param_sums_in_stats``); otherwise the parameter gradients are summed
over :func:`param_comm` (one more all-reduce) or, with ``reduce=False``, left as per-rank
partial sums for a bucketed all-reduce.

Both entry points agree on their arguments before any message, with the local kernels (the
moments, the backward sums) inside the agreeing block.  Errors (``ValueError`` on every rank;
PyTorch raises ``RuntimeError`` for the shape ones): channels not divisible by the groups,
parameters or running statistics of the wrong size, and too few values per group (PyTorch's
rules: group norm refuses ``N * C/G * prod(S) == 1``, instance norm with batch statistics
``prod(S) == 1``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.array import DistArray
from ..core.comm import allreduce
from ..core.entry import agreed, collective_entry
from .local import kernels_for
from .norm import _combine_moments, _gather_rows
from ._spatial import array_key, check_gradient_layout, check_layout, param_comm

__all__ = ["group_norm_forward", "group_norm_backward", "group_norm", "GroupNormSaved",
           "stats_axes", "norm_kernels"]


def norm_kernels(arr):
    """The module of normalization kernels for ``arr``'s device: :mod:`.local.cpu.normalization`
    for NumPy blocks, :mod:`.local.gpu.normalization` for CuPy ones (same functions)."""
    from ..core.backend import array_module
    if array_module(arr) is np:
        from .local.cpu import normalization
    else:
        from .local.gpu import normalization
    return normalization


@dataclass
class GroupNormSaved:
    x: DistArray
    groups: int
    mean: object          # float64 (n_local, G) on the block's device
    invstd: object        # float64 (n_local, G)
    gamma: object         # (C,) or None (no affine)
    count: float          # values per (sample, group) in the whole array
    batch_stats: bool     # normalized with the input's statistics (not running ones)
    stats_axes: tuple     # grid axes splitting the normalized (spatial) axes

    @property
    def param_sums_in_stats(self) -> bool:
        """Whether the backward's statistics all-reduce also sums ``dgamma``/``dbeta`` over
        every rank holding different data (so they come back reduced whatever ``reduce``)."""
        return (self.batch_stats and self.x.split[0] is None
                and math.prod(self.x.grid.dims[a] for a in self.stats_axes) > 1)


def stats_axes(split, first: int) -> tuple[int, ...]:
    """The grid axes that split tensor axes ``first, first+1, ...`` of an array split as
    ``split`` (the axes a normalization's statistics are reduced over), in tensor-axis
    order.  Pure."""
    return tuple(g for g in split[first:] if g is not None)


def _shape_list(shape) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def _check_arguments(x, groups, gamma, beta, running_mean, running_var, use_input_stats,
                     kind):
    """The metadata checks (replicated: the same decision on every rank)."""
    if x.ndim < 2:
        raise ValueError(f"Expected at least 2 dimensions for input tensor but received "
                         f"{x.ndim}")
    check_layout(x, f"{kind}_norm", min_spatial=0)
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ValueError(f"num_groups must be a positive int, got {groups!r}")
    n, c = x.shape[0], x.shape[1]
    spatial = math.prod(x.shape[2:])
    if use_input_stats:
        if kind == "group" and (n * c // groups) * spatial == 1:
            size = _shape_list([n * c // groups, groups] + list(x.shape[2:]))
            raise ValueError(f"Expected more than 1 value per channel when training, got "
                             f"input size {size}")
        if kind == "instance" and spatial == 1:
            raise ValueError(f"Expected more than 1 spatial element when training, got input "
                             f"size {_shape_list(x.shape)}")
    if c % groups:
        raise ValueError(f"Expected number of channels in input to be divisible by num_groups, "
                         f"but got input of shape {_shape_list(x.shape)} and "
                         f"num_groups={groups}")
    for name, v in (("weight", gamma), ("bias", beta)):
        if v is not None and tuple(v.shape) != (c,):
            raise ValueError(f"Expected {name} to be a vector of size equal to the number of "
                             f"channels in input, but got {name} of shape "
                             f"{_shape_list(v.shape)} and input of shape {_shape_list(x.shape)}")
    for name, v in (("running_mean", running_mean), ("running_var", running_var)):
        if v is not None:
            if groups != c:
                raise ValueError(f"{name} needs one group per channel (instance norm), got "
                                 f"{groups} groups of {c} channels")
            if tuple(v.shape) != (c,):
                raise ValueError(f"{name} should contain {c} elements not "
                                 f"{math.prod(v.shape)}")
    if not use_input_stats and (running_mean is None or running_var is None):
        raise ValueError("Expected running_mean and running_var to be defined when "
                         "use_input_stats is false")


def _rows(a, rows: int):
    """``a`` (a local block) as a C-contiguous ``(rows, -1)`` view."""
    from ..core.backend import array_module
    a = array_module(a).ascontiguousarray(a)
    return a.reshape(rows, a.size // rows if rows else 0)


def _update_running(x, mean, m2, count, running_mean, running_var, momentum):
    """Instance norm's running statistics: the mean over the whole batch of the per-instance
    means and unbiased variances (summed over the sample grid axis in rank order: one small
    Allgather when the sample axis is split)."""
    xp = x.xp
    c = x.shape[1]
    unbiased = m2 / (count - 1) if count > 1 else xp.full_like(m2, np.nan)
    mine = xp.concatenate([mean.sum(axis=0), unbiased.sum(axis=0)])
    if x.split[0] is not None and x.grid.dims[x.split[0]] > 1:
        mine = _gather_rows(x.grid.sub_comm((x.split[0],)), mine).sum(axis=0)
    n = x.shape[0]
    if n == 0:
        return
    for buf, v in ((running_mean, mine[:c]), (running_var, mine[c:])):
        if buf is not None:
            buf *= 1 - momentum
            buf += (momentum * (v / n)).astype(buf.dtype)


@collective_entry
def group_norm_forward(x: DistArray, num_groups: int, gamma=None, beta=None,
                       eps: float = 1e-5, running_mean=None, running_var=None,
                       use_input_stats: bool = True, momentum: float = 0.1,
                       kind: str = "group"):
    """Group-normalize ``x`` ``(N, C, *S)`` in ``num_groups`` groups; ``gamma``/``beta``:
    ``(C,)`` arrays on ``x``'s device or ``None`` (no affine).  ``running_mean``/``running_var``
    (``(C,)``, ``num_groups == C`` only) are updated in place when ``use_input_stats`` (as
    instance norm does) and normalize when not.  ``kind`` (``'group'`` or ``'instance'``)
    picks PyTorch's rule on too few values and the names in messages.  Returns ``(y, saved)``,
    ``y`` distributed like ``x`` (no halo), of ``x``'s dtype.  Collective: one Allgather over
    the statistics communicator when a spatial axis is split (and one over the sample axis
    for running statistics when it is split)."""
    use_input_stats = bool(use_input_stats)
    xp = x.xp
    with agreed(x.grid.cart, f"{kind}_norm_forward", rank_local=use_input_stats, x=x,
                num_groups=num_groups, gamma=array_key(gamma), beta=array_key(beta),
                running_mean=array_key(running_mean), running_var=array_key(running_var),
                use_input_stats=use_input_stats, momentum=momentum, eps=eps, kind=kind):
        if kind not in ("group", "instance"):
            raise ValueError(f"kind must be 'group' or 'instance', got {kind!r}")
        _check_arguments(x, num_groups, gamma, beta, running_mean, running_var,
                         use_input_stats, kind)
        k = kernels_for(x.local)
        n_loc, c = x.local.shape[:2]
        g = int(num_groups)
        if use_input_stats:
            mean_r, m2_r = norm_kernels(x.local).row_moments(_rows(x.local, n_loc * g))
    axes = stats_axes(x.split, 2)
    count = float((c // g) * math.prod(x.shape[2:]))
    if use_input_stats:
        n_r = (c // g) * math.prod(x.local.shape[2:])
        comm = x.grid.sub_comm(axes) if axes else None
        _, mean, m2 = _combine_moments(comm, n_r, xp.asarray(mean_r), xp.asarray(m2_r))
        mean, m2 = mean.reshape(n_loc, g), m2.reshape(n_loc, g)
        if running_mean is not None or running_var is not None:
            _update_running(x, mean, m2, count, running_mean, running_var, momentum)
        var = m2 / max(count, 1.0)
    else:
        mean = xp.broadcast_to(xp.asarray(running_mean, dtype=xp.float64), (n_loc, c))
        var = xp.broadcast_to(xp.asarray(running_var, dtype=xp.float64), (n_loc, c))
    invstd = 1.0 / xp.sqrt(var + eps)
    per_channel = c // g
    mean_c = xp.repeat(mean, per_channel, axis=1)
    invstd_c = xp.repeat(invstd, per_channel, axis=1)
    scale = invstd_c if gamma is None else xp.asarray(gamma, dtype=xp.float64) * invstd_c
    shift = -mean_c * scale
    if beta is not None:
        shift = shift + xp.asarray(beta, dtype=xp.float64)
    xl = xp.ascontiguousarray(x.local)
    y = k.bn_forward_apply(xl.reshape(1, n_loc * c, math.prod(xl.shape[2:])),
                           scale.reshape(-1), shift.reshape(-1)).reshape(xl.shape)
    saved = GroupNormSaved(x, g, xp.ascontiguousarray(mean), xp.ascontiguousarray(invstd),
                           gamma, count, use_input_stats, axes)
    return DistArray(y, x.distribution, x.grid), saved


@collective_entry
def group_norm_backward(saved: GroupNormSaved, dy: DistArray, reduce: bool = True):
    """Gradients ``(dx, dgamma, dbeta)`` (``dgamma``/``dbeta`` ``None`` without affine, else
    in ``gamma``'s dtype).  ``dx`` is distributed like ``x``.  The parameter gradients are
    summed over the ranks holding different data when ``reduce`` or
    ``saved.param_sums_in_stats``, else they are this rank's partial sums.  Collective."""
    x = saved.x
    xp = x.xp
    n_loc, c = x.local.shape[:2]
    g = saved.groups
    per_channel = c // g
    with agreed(dy.grid.cart, "group_norm_backward", rank_local=True, dy=dy,
                batch_stats=saved.batch_stats, reduce=bool(reduce)):
        check_gradient_layout(dy, x.distribution, "group-norm")
        mean_c = xp.repeat(saved.mean, per_channel, axis=1)
        dy2, x2 = _rows(dy.local, n_loc * c), _rows(x.local, n_loc * c)
        s_dy, s_dyx = norm_kernels(dy.local).rows_backward_sums(dy2, x2, mean_c.reshape(-1))
    s_dy = xp.asarray(s_dy, dtype=xp.float64).reshape(n_loc, c)
    s_dyx = xp.asarray(s_dyx, dtype=xp.float64).reshape(n_loc, c)   # sum dy * (x - mean)
    invstd_c = xp.repeat(saved.invstd, per_channel, axis=1)
    g64 = (xp.ones(c) if saved.gamma is None
           else xp.asarray(saved.gamma, dtype=xp.float64))
    params = xp.concatenate([(invstd_c * s_dyx).sum(axis=0), s_dy.sum(axis=0)])
    params_done = False
    if saved.batch_stats:
        a_sum = (g64 * s_dy).reshape(n_loc, g, per_channel).sum(axis=2).reshape(-1)
        b_sum = (g64 * s_dyx).reshape(n_loc, g, per_channel).sum(axis=2).reshape(-1)
        if saved.stats_axes:
            comm = x.grid.sub_comm(saved.stats_axes)
            if saved.param_sums_in_stats:
                both = allreduce(comm, xp.concatenate([a_sum, b_sum, params]), "sum")
                a_sum, b_sum, params = both[:a_sum.size], both[a_sum.size:2 * a_sum.size], \
                    both[2 * a_sum.size:]
                params_done = True
            elif comm.size > 1:
                both = allreduce(comm, xp.concatenate([a_sum, b_sum]), "sum")
                a_sum, b_sum = both[:a_sum.size], both[a_sum.size:]
        m = max(saved.count, 1.0)
        inv = saved.invstd.reshape(-1)
        b_coef = xp.repeat((-(inv ** 3) * b_sum / m).reshape(n_loc, g), per_channel, axis=1)
        d_coef = xp.repeat((-inv * a_sum / m).reshape(n_loc, g), per_channel, axis=1)
    else:
        b_coef = d_coef = xp.zeros((n_loc, c))
    if reduce and not params_done:
        params = allreduce(param_comm(x), params, "sum")
    a_coef = g64 * invstd_c
    dx = norm_kernels(dy.local).rows_backward_apply(
        dy2, x2, a_coef.reshape(-1), mean_c.reshape(-1), b_coef.reshape(-1), d_coef.reshape(-1))
    dx = DistArray(dx.reshape(x.local.shape), x.distribution, x.grid)
    if saved.gamma is None:
        return dx, None, None
    dtype = saved.gamma.dtype
    return dx, params[:c].astype(dtype), params[c:].astype(dtype)


def group_norm(x: DistArray, num_groups: int, gamma=None, beta=None,
               eps: float = 1e-5) -> DistArray:
    """:func:`group_norm_forward` without the saved state."""
    return group_norm_forward(x, num_groups, gamma, beta, eps)[0]
