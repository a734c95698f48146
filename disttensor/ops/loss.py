"""Losses on DistArrays: mean squared error and cross-entropy with channel softmax
(segmentation), forward and backward.

The loss is a Python float, the same on every rank: local sums are added over the ranks holding
different parts of the array (one all-reduce; replicas count once).  The backward returns the
gradient with respect to the prediction, distributed like it, scaled by ``dloss`` (the
gradient flowing into the loss, 1 for a final loss).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..array import DistArray
from ..backend import array_module
from ..comm import allreduce, collective
from .local import kernels_for
from ._spatial import check_layout, param_comm

__all__ = ["mse_forward", "mse_backward", "MSESaved", "cross_entropy_forward",
           "cross_entropy_backward", "CrossEntropySaved"]


def _aligned(target: DistArray, like_dist, grid, what: str) -> DistArray:
    """``target`` distributed like the prediction (``like_dist`` on ``grid``; the target may
    live on another grid over the same ranks)."""
    if target.distribution == like_dist and target.grid is grid:
        return target
    if target.shape != like_dist.shape:
        raise ValueError(f"{what}: target shape {target.shape} != prediction shape "
                         f"{like_dist.shape}")
    return target.redistribute(grid=grid, distribution=like_dist)


@dataclass
class MSESaved:
    x: DistArray
    t: DistArray
    count: int


def mse_forward(x: DistArray, target: DistArray):
    """``mean((x - target)**2)`` over all elements (collective).  Returns ``(loss, saved)``."""
    t = _aligned(target, x.distribution, x.grid, "mse")
    diff = x.local - t.local.astype(x.dtype, copy=False)
    xp = array_module(diff)
    part = xp.asarray([(diff.astype(xp.float64) ** 2).sum()], dtype=xp.float64)
    total = allreduce(param_comm(x), part, "sum")
    n = x.size
    return float(total[0]) / max(n, 1), MSESaved(x, t, n)


def mse_backward(saved: MSESaved, dloss: float = 1.0) -> DistArray:
    x = saved.x
    g = (x.local - saved.t.local.astype(x.dtype, copy=False)) * (2.0 * dloss / max(saved.count, 1))
    return DistArray(g.astype(x.dtype, copy=False), x.distribution, x.grid)


@dataclass
class CrossEntropySaved:
    logits: DistArray
    probs: object        # local softmax
    labels: object       # local labels (int)
    count: int


def cross_entropy_forward(logits: DistArray, labels: DistArray):
    """Mean over all ``N * prod(S)`` voxels of ``-log softmax(logits, axis=1)[label]`` for
    ``logits`` ``(N, C, *S)`` and integer ``labels`` ``(N, *S)`` in ``[0, C)`` (collective;
    out-of-range labels raise on every rank).  Returns ``(loss, saved)``."""
    check_layout(logits, "cross_entropy", min_spatial=0)
    lab = _aligned(labels, logits.distribution.drop_axes([1]), logits.grid, "cross_entropy")
    k = kernels_for(logits.local)
    xp = logits.xp
    c = logits.shape[1]
    lab_local = lab.local.astype(xp.int64, copy=False)
    comm = param_comm(logits)
    with collective(logits.grid.cart):  # a kernel failure on one rank raises on all
        logp = k.log_softmax_channels(logits.local)
    bad = int(((lab_local < 0) | (lab_local >= c)).sum()) if lab_local.size else 0
    picked = xp.take_along_axis(logp, xp.clip(lab_local, 0, c - 1)[:, None], axis=1)
    part = xp.asarray([-(picked.astype(xp.float64)).sum(), float(bad)], dtype=xp.float64)
    total = allreduce(comm, part, "sum")
    if float(total[1]) > 0:
        raise ValueError(f"cross_entropy: {int(total[1])} labels outside [0, {c})")
    n = lab.size
    probs = xp.exp(logp)
    return float(total[0]) / max(n, 1), CrossEntropySaved(logits, probs, lab_local, n)


def cross_entropy_backward(saved: CrossEntropySaved, dloss: float = 1.0) -> DistArray:
    """``(softmax(logits) - onehot(labels)) * dloss / count``."""
    lg = saved.logits
    xp = array_module(saved.probs)
    g = saved.probs.copy()
    if g.size:
        classes = xp.arange(g.shape[1]).reshape((1, -1) + (1,) * (g.ndim - 2))
        g -= (saved.labels[:, None] == classes).astype(g.dtype)
    g *= dloss / max(saved.count, 1)  # a Python float keeps g.dtype (NumPy and CuPy)
    return DistArray(g, lg.distribution, lg.grid)
