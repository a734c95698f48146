"""Losses on DistArrays: mean squared error and cross-entropy with channel softmax
(segmentation), forward and backward.

The loss is a Python float, the same on every rank: local sums are added over the ranks holding
different parts of the array (one all-reduce; replicas count once).  The backward returns the
gradient with respect to the prediction, distributed like it, scaled by ``dloss`` (the
gradient flowing into the loss, 1 for a final loss).  ``reduction='sum'`` gives the sum instead
of the mean.

Forward and backward agree on their arguments before any message (the prediction's and the
target's metadata, ``reduction``, ``dloss``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.array import DistArray
from ..core.entry import agreed, collective_entry, deferrable
from ..core.backend import array_module
from ..core.comm import allreduce, collective
from .local import kernels_for
from ._spatial import check_layout, meaning, param_comm

__all__ = ["mse_forward", "mse_backward", "MSESaved", "cross_entropy_forward",
           "cross_entropy_backward", "CrossEntropySaved", "REDUCTIONS"]

REDUCTIONS = ("mean", "sum")


def _check_reduction(reduction) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _reduced(total: float, n: int, reduction: str) -> float:
    """The loss from the global sum over ``n`` terms: the mean is NaN for ``n == 0`` (as
    NumPy's and PyTorch's means of nothing), the sum 0."""
    if reduction == "sum":
        return total
    return total / n if n else float("nan")


def _aligned(target: DistArray, like_dist, grid, what: str) -> DistArray:
    """``target`` distributed like the prediction (``like_dist`` on ``grid``; the target may
    live on another grid over the same ranks)."""
    if target.distribution == like_dist and target.grid is grid:
        return target
    return target.redistribute(grid=grid, distribution=like_dist)


def _check_target(target, shape, what: str, name: str) -> None:
    if not isinstance(target, DistArray):
        raise TypeError(f"{what}: the {name} must be a DistArray, got {type(target).__name__}")
    if target.shape != tuple(shape):
        raise ValueError(f"{what}: {name} shape {target.shape} != prediction shape "
                         f"{tuple(shape)}")


@dataclass
class MSESaved:
    x: DistArray
    t: DistArray
    count: int
    scale: float         # d loss / d sum of squares: 1/count ('mean') or 1 ('sum')


@collective_entry
def mse_forward(x: DistArray, target: DistArray, reduction: str = "mean"):
    """``mean((x - target)**2)`` over all elements; ``reduction='sum'``: the sum.  The mean of
    an empty array is NaN (as NumPy's).  Collective: the ranks agree on both arrays' metadata
    and ``reduction``, then one all-reduce of the local sums.  Returns ``(loss, saved)``."""
    with agreed(x.grid.cart, "mse_forward", x=x, target=target, reduction=reduction):
        _check_reduction(reduction)
        _check_target(target, x.shape, "mse", "target")
    t = _aligned(target, x.distribution, x.grid, "mse")
    diff = x.local - t.local.astype(x.dtype, copy=False)
    xp = array_module(diff)
    part = xp.asarray([(diff.astype(xp.float64) ** 2).sum()], dtype=xp.float64)
    total = allreduce(param_comm(x), part, "sum")
    n = x.size
    scale = 1.0 if reduction == "sum" else 1.0 / max(n, 1)
    return _reduced(float(total[0]), n, reduction), MSESaved(x, t, n, scale)


@collective_entry
def mse_backward(saved: MSESaved, dloss: float = 1.0) -> DistArray:
    """Gradient with respect to the prediction, scaled by ``dloss`` (collective only to agree
    on ``dloss``: a value that differed between ranks would scale the blocks differently; no
    data moves, so the agreement is deferred to the next one over the grid)."""
    x = saved.x
    with deferrable(x.grid.cart, "mse_backward", x=x, dloss=meaning(float, dloss)):
        dloss = float(dloss)  # the arithmetic inside too: a failure on one rank agrees at once
        g = (x.local - saved.t.local.astype(x.dtype, copy=False)) * (2.0 * dloss * saved.scale)
        g = g.astype(x.dtype, copy=False)
    return DistArray(g, x.distribution, x.grid)


@dataclass
class CrossEntropySaved:
    logits: DistArray
    probs: object        # local softmax
    labels: object       # local labels (int)
    count: int
    scale: float         # d loss / d sum over voxels: 1/count ('mean') or 1 ('sum')


@collective_entry
def cross_entropy_forward(logits: DistArray, labels: DistArray, reduction: str = "mean"):
    """Mean over all ``N * prod(S)`` voxels of ``-log softmax(logits, axis=1)[label]`` for
    ``logits`` ``(N, C, *S)`` and integer ``labels`` ``(N, *S)`` in ``[0, C)``
    (``reduction='sum'``: the sum; the mean over no voxels is NaN, as PyTorch's).  Collective
    (the ranks agree on both arrays' metadata and ``reduction``; out-of-range labels raise on
    every rank).  Returns ``(loss, saved)``."""
    with agreed(logits.grid.cart, "cross_entropy_forward", logits=logits, labels=labels,
                reduction=reduction):
        _check_reduction(reduction)
        check_layout(logits, "cross_entropy", min_spatial=0)
        _check_target(labels, logits.shape[:1] + logits.shape[2:], "cross_entropy", "labels")
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
    scale = 1.0 if reduction == "sum" else 1.0 / max(n, 1)
    return (_reduced(float(total[0]), n, reduction),
            CrossEntropySaved(logits, probs, lab_local, n, scale))


@collective_entry
def cross_entropy_backward(saved: CrossEntropySaved, dloss: float = 1.0) -> DistArray:
    """``(softmax(logits) - onehot(labels)) * dloss / count`` (``* dloss`` for ``'sum'``;
    collective only to agree on ``dloss``, deferred to the next agreement: no data moves)."""
    lg = saved.logits
    with deferrable(lg.grid.cart, "cross_entropy_backward", logits=lg,
                    dloss=meaning(float, dloss)):
        dloss = float(dloss)
    xp = array_module(saved.probs)
    g = saved.probs.copy()
    if g.size:
        classes = xp.arange(g.shape[1]).reshape((1, -1) + (1,) * (g.ndim - 2))
        g -= (saved.labels[:, None] == classes).astype(g.dtype)
    g *= dloss * saved.scale  # a Python float keeps g.dtype (NumPy and CuPy)
    return DistArray(g, lg.distribution, lg.grid)
