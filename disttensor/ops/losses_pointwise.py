"""Elementwise losses on DistArrays with PyTorch's semantics, forward and backward side by side:
``mse`` (``F.mse_loss``), ``l1`` (``F.l1_loss``), ``smooth_l1`` (``F.smooth_l1_loss``, ``param``
= ``beta``, 1.0; ``beta == 0`` is L1), ``huber`` (``F.huber_loss``, ``param`` = ``delta``,
1.0), ``bce_with_logits`` (``F.binary_cross_entropy_with_logits``: ``(1 - t) x + (1 + (pw - 1)
t) * softplus(-x)``, softplus taken as ``log1p(exp(-|x|)) + max(-x, 0)``, stable for any
``x``) and ``bce`` (``F.binary_cross_entropy`` on probabilities: logs clamped at -100, the
gradient ``(x - t) / max(x (1 - x), 1e-12)``; inputs outside [0, 1] raise ``ValueError``).

``x`` and ``target`` are DistArrays of one shape (any layout: the target is redistributed
like ``x`` when it is laid out otherwise; PyTorch would broadcast other shapes, with a
warning, here they raise).  ``weight`` (BCE) and ``pos_weight`` (BCE with logits) are
replicated arrays broadcastable to the input's shape by NumPy's (= PyTorch's) rules, so a
per-class ``pos_weight`` of an ``(N, C, *S)`` input has shape ``(C, 1, ..., 1)`` there as
well; ``weight`` may also be a DistArray of the input's shape.  ``reduction``: ``'none'`` (a
DistArray like ``x`` in its dtype), ``'sum'`` or ``'mean'`` (a Python float on every rank; the
mean over no element is NaN).

Collective: the ranks agree on the arrays' metadata and the options; one fused local kernel
per rank (``ops/local/cpu/losses.py``, ``ops/local/gpu/losses.py``) and one all-reduce of
``[loss sum, inputs out of range]`` over the ranks holding different parts of ``x``.  Where
there are none (``x`` whole on every rank, as a model's output after a spatial ``flatten`` on
a grid that does not split the samples) and the target and a DistArray ``weight`` are laid
out like ``x``, the forward moves no data: its agreement is deferred to the next agreement
over the grid (:func:`~disttensor.core.entry.deferrable`), and its kernel and range check
raise on every rank if they raise on one (:func:`~disttensor.core.entry.failure_deferred`).
The backward gives the gradient in ``x`` (and, for the losses of ``x - target``, minus it for
the target) and sends no message.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.array import DistArray
from ..core.comm import allreduce
from ..core.entry import agreed, collective_entry, deferrable, failure_deferred
from ._losses import aligned, check_distarray, check_reduction, incoming, reduced
from ._spatial import array_key, meaning, param_comm
from .local import kernels_for

__all__ = ["POINTWISE_LOSSES", "PointwiseLossSaved", "pointwise_loss_forward",
           "pointwise_loss_backward"]

POINTWISE_LOSSES = ("mse", "l1", "smooth_l1", "huber", "bce_with_logits", "bce")
_DIFFERENCE_LOSSES = ("mse", "l1", "smooth_l1", "huber")


@dataclass
class PointwiseLossSaved:
    name: str
    x: DistArray
    target: object        # this rank's target block, aligned to x
    param: float
    weight: object        # this rank's block of the expanded weight, or None
    pos_weight: object    # this rank's block of the expanded pos_weight, or None
    reduction: str
    scale: float          # 1 / count for 'mean', else 1


def _check_broadcast(a, x: DistArray, name: str, what: str) -> None:
    if a is None:
        return
    shape = tuple(getattr(a, "shape", np.shape(a)))
    if isinstance(a, DistArray) and shape != x.shape:
        raise ValueError(f"{what}: a DistArray {name} must have the input's shape {x.shape}, "
                         f"got {shape}")
    try:
        if np.broadcast_shapes(shape, x.shape) == x.shape:
            return
    except ValueError:
        pass
    raise ValueError(f"{what}: {name} of shape {shape} does not broadcast to the input shape "
                     f"{x.shape}")


def _block_of(a, x: DistArray):
    """This rank's block of ``a`` broadcast to ``x``'s shape, float64 (None stays None;
    collective for a DistArray laid out otherwise than ``x``)."""
    if a is None:
        return None
    xp = x.xp
    if isinstance(a, DistArray):
        return aligned(a, x).local.astype(xp.float64)
    host = np.asarray(a.get() if hasattr(a, "get") else a, dtype=np.float64)
    full = np.broadcast_to(host, x.shape)
    return xp.asarray(np.ascontiguousarray(full[x.local_slices]))


def _check_param(name: str, param, what: str) -> float:
    if name not in ("smooth_l1", "huber"):
        return 1.0
    p = float(param)
    label = "beta" if name == "smooth_l1" else "delta"
    if p < 0 or (name == "huber" and p == 0):
        raise ValueError(f"{what}: {label} must be {'>' if name == 'huber' else '>='} 0, "
                         f"got {p}")
    return p


def _moves_no_data(x, target, weight) -> bool:
    """Whether the forward sends nothing (decided per rank from the layouts): every rank holds
    all of ``x`` it sums (no split grid axis of extent > 1) and no operand is redistributed."""
    if not (isinstance(x, DistArray) and isinstance(target, DistArray)):
        return False
    dims = x.grid.dims
    if any(g is not None and dims[g] > 1 for g in x.split):
        return False
    aligned_ = [target] + ([weight] if isinstance(weight, DistArray) else [])
    return all(a.distribution == x.distribution and a.grid is x.grid for a in aligned_)


def _loss_total(name: str, x: DistArray, target: DistArray, p: float, weight, pos_weight,
                comm, what: str):
    """``(loss per element, target block, weight block, pos_weight block, sum)``: the kernel on
    this rank's block and ``[loss sum, inputs out of range]`` summed over ``comm`` (``None``:
    this rank's block is all of it, no message)."""
    w, pw = _block_of(weight, x), _block_of(pos_weight, x)
    k = kernels_for(x.local)
    xp = x.xp
    t = aligned(target, x).local
    loss = k.pointwise_loss_forward(name, x.local, t, p, w, pw)
    bad = ((x.local < 0) | (x.local > 1)).sum() if name == "bce" else xp.zeros(())
    part = xp.stack([loss.sum(), xp.asarray(bad, dtype=xp.float64)])
    total = part if comm is None else allreduce(comm, part, "sum")
    total = [float(v) for v in (total.get() if hasattr(total, "get") else total)]
    if total[1] > 0:
        raise ValueError(f"{what}: all elements of the input should be between 0 and 1 "
                         f"({int(total[1])} are not)")
    return loss, t, w, pw, total[0]


@collective_entry
def pointwise_loss_forward(name: str, x: DistArray, target: DistArray, reduction: str = "mean",
                           param: float = 1.0, weight=None, pos_weight=None):
    """The loss ``name`` (:data:`POINTWISE_LOSSES`) of ``x`` against ``target``; see the module
    docstring.  Returns ``(loss, saved)``."""
    what = f"{name}_loss" if name in POINTWISE_LOSSES else "loss"
    dist_w = weight if isinstance(weight, DistArray) else None
    local = _moves_no_data(x, target, weight)
    gate = deferrable if local else agreed  # (deferred when no data moves)
    with gate(x.grid.cart, f"{what}_forward", name=name, x=x, target=target,
                reduction=reduction, param=meaning(float, param),
                weight=dist_w if dist_w is not None else array_key(weight),
                pos_weight=array_key(pos_weight)):
        if name not in POINTWISE_LOSSES:
            raise ValueError(f"unknown elementwise loss {name!r}; known: {POINTWISE_LOSSES}")
        check_distarray(x, what, "input")
        check_distarray(target, what, "target")
        check_reduction(reduction, what)
        if target.shape != x.shape:
            raise ValueError(f"{what}: target shape {target.shape} must equal the input shape "
                             f"{x.shape} (no broadcasting here)")
        if x.dtype.kind != "f":
            raise TypeError(f"{what}: the input must have a float dtype, got {x.dtype}")
        if target.dtype.kind not in "fiu":
            raise TypeError(f"{what}: the target must be real numbers, got {target.dtype}")
        if name.startswith("bce") and target.dtype.kind != "f":
            raise TypeError(f"{what}: the target must have a float dtype, got {target.dtype}")
        p = _check_param(name, param, what)
        if pos_weight is not None and name != "bce_with_logits":
            raise ValueError(f"{what}: pos_weight is an option of bce_with_logits only")
        if weight is not None and not name.startswith("bce"):
            raise ValueError(f"{what}: weight is an option of the BCE losses only")
        _check_broadcast(weight, x, "weight", what)
        _check_broadcast(pos_weight, x, "pos_weight", what)
    if local:  # (a failure on one rank raises its error on every rank, at the next agreement)
        with failure_deferred(x.grid.cart, f"{what}_forward"):
            loss, t, w, pw, total = _loss_total(name, x, target, p, weight, pos_weight, None,
                                                what)
    else:
        loss, t, w, pw, total = _loss_total(name, x, target, p, weight, pos_weight,
                                            param_comm(x), what)
    scale = 1.0 / x.size if reduction == "mean" and x.size else 1.0
    saved = PointwiseLossSaved(name, x, t, p, w, pw, reduction, scale)
    if reduction == "none":
        return DistArray(loss.astype(x.dtype), x.distribution, x.grid), saved
    return reduced(total, x.size, reduction), saved


@collective_entry
def pointwise_loss_backward(saved: PointwiseLossSaved, grad=1.0, need_target: bool = False):
    """``(dx, dtarget)``: the gradient in ``x`` (distributed like it) for the incoming gradient
    ``grad`` (a number; the DistArray of ``x``'s shape for ``'none'``), and, with
    ``need_target`` for the losses of ``x - target``, ``-dx`` (else None)."""
    x = saved.x
    key = grad if saved.reduction == "none" else meaning(float, grad)
    gate = agreed if saved.reduction == "none" else deferrable  # (a number: no data moves)
    with gate(x.grid.cart, f"{saved.name}_loss_backward", x=x, grad=key):
        gvox, gscale = incoming(grad, x, saved.reduction)
    k = kernels_for(x.local)
    dx = k.pointwise_loss_backward(saved.name, x.local, saved.target, saved.param,
                                   saved.weight, saved.pos_weight, gvox, gscale * saved.scale)
    dxa = DistArray(dx, x.distribution, x.grid)
    if need_target and saved.name in _DIFFERENCE_LOSSES:
        return dxa, DistArray(-dx, x.distribution, x.grid)
    return dxa, None
