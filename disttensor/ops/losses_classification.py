"""Cross-entropy and negative log-likelihood over the channel axis of ``(N, C, *S)`` DistArrays,
with PyTorch's semantics (``torch.nn.functional.cross_entropy`` / ``nll_loss``), forward and
backward side by side.

Targets: integer class labels ``(N, *S)`` (any integer dtype; a float array of that shape
raises ``TypeError``, where PyTorch raises its dtype error), or, for cross-entropy, class
probabilities of the input's shape (a float dtype).  Options as PyTorch's:

* ``weight`` (``C`` numbers, replicated): per-class weights; the label loss of a voxel is
  ``w[y] * -logp[y]`` and ``'mean'`` divides by the sum of ``w[y]`` over the voxels that are
  not ignored (PyTorch's weighted mean); with probabilities ``-sum_c w[c] t[c] logp[c]`` and
  ``'mean'`` divides by ``N * prod(S)``;
* ``ignore_index``: labels equal to it contribute nothing (0 in ``'none'``), nor to the
  denominator; any other label outside ``[0, C)`` raises ``ValueError`` on every rank;
* ``label_smoothing`` ``eps`` in [0, 1]: labels: ``(1 - eps) * nll + eps / C * sum_c w[c] *
  -logp[c]`` per voxel (the smoothing term masked on ignored voxels, and, for ``'mean'``,
  divided by the same weight sum, as PyTorch); probabilities: ``t' = (1 - eps) t + eps / C``;
* ``reduction``: ``'none'`` (a per-voxel ``(N, *S)`` DistArray laid out like the input without
  its channel axis, in the input's dtype), ``'sum'`` or ``'mean'`` (a Python float, the same on
  every rank; the mean over nothing is NaN).

Collective: the ranks agree on the arrays' metadata and every option, then each rank runs one
fused local kernel over its block (log-sum-exp, picked term and smoothing term in one pass;
backward recomputes the log-sum-exp instead of keeping the softmax) and one all-reduce adds
``[loss sum, weight sum, labels out of range]``.  The backward needs no message (the
denominator is kept); it agrees on the incoming gradient (a number, or the per-voxel DistArray
for ``'none'``).  Per-rank kernels: ``ops/local/cpu/losses.py`` (Numba) and
``ops/local/gpu/losses.py`` (RawKernels of ``kernels/losses.cu``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.array import DistArray
from ..core.comm import allreduce
from ..core.entry import agreed, collective_entry
from ._losses import (aligned, check_class_labels, check_distarray, check_reduction,
                      class_weight, incoming, is_integer_dtype, per_voxel, reduced)
from ._spatial import array_key, check_layout, meaning, param_comm
from .local import kernels_for

__all__ = ["ClassLossSaved", "class_loss_forward", "class_loss_backward", "check_class_args",
           "class_local", "class_finish"]


@dataclass
class ClassLossSaved:
    x: DistArray
    target: object          # this rank's labels (int) or probabilities, aligned to x
    probabilities: bool
    weight: object          # float64 (C,) on the block's device
    ignore_index: int
    label_smoothing: float
    log_input: bool         # nll_loss: x holds log-probabilities
    reduction: str
    scale: float            # d loss / d (sum of the per-voxel terms) for 'mean' and 'sum'


def _float_option(v, what, name, lo, hi):
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: {name} must be a number, got {type(v).__name__}") from None
    if not lo <= f <= hi:
        raise ValueError(f"{what}: {name} must be between {lo} and {hi}, got {f}")
    return f


def check_class_args(x, target, weight, ignore_index, reduction, label_smoothing, log_input,
                     what: str):
    """The checks of :func:`class_loss_forward` (replicated metadata; inside the caller's
    agreed block): ``(eps, ignore, weight as float64 (C,), probabilities?)``."""
    check_distarray(x, what, "input")
    check_distarray(target, what, "target")
    check_reduction(reduction, what)
    if x.ndim < 2:
        raise ValueError(f"{what}: the input must have layout (N, C, *spatial), got shape "
                         f"{x.shape}")
    check_layout(x, what, min_spatial=0)
    eps = _float_option(label_smoothing, what, "label_smoothing", 0.0, 1.0)
    if not isinstance(ignore_index, (int,)) and not hasattr(ignore_index, "__index__"):
        raise TypeError(f"{what}: ignore_index must be an int, got "
                        f"{type(ignore_index).__name__}")
    w = class_weight(weight, x.shape[1], what)
    probabilities = target.shape == x.shape and not log_input
    if probabilities:
        if is_integer_dtype(target.dtype) or target.dtype.kind != "f":
            raise TypeError(f"{what}: a target of the input's shape holds class "
                            f"probabilities and must be of a float dtype, got {target.dtype}")
    else:
        label_shape = x.shape[:1] + x.shape[2:]
        if target.shape != label_shape:
            raise ValueError(f"{what}: target shape {target.shape} fits neither class labels "
                             f"{label_shape} nor class probabilities {x.shape} of the input "
                             f"{x.shape}")
        check_class_labels(target, what)
    return eps, int(ignore_index), w, probabilities


def class_local(x, target, w, ignore, eps, log_input, probabilities):
    """This rank's part (after the agreement; collective only where the target must be
    redistributed): ``(per-voxel loss, target block, weight on the device, float64 [loss sum,
    weight sum, labels out of range])``."""
    k = kernels_for(x.local)
    xp = x.xp
    c = x.shape[1]
    wd = xp.asarray(w)
    if probabilities:
        t = aligned(target, x).local
        loss = k.prob_ce_forward(x.local, t, wd, eps)
        part = xp.stack([loss.sum(), xp.zeros((), xp.float64), xp.zeros((), xp.float64)])
    else:
        t = aligned(target, x, drop=(1,)).local.astype(xp.int64, copy=False)
        bad = ((t < 0) | (t >= c)) & (t != ignore)
        loss, dens = k.class_ce_forward(x.local, t, wd, ignore, eps, bool(log_input))
        part = xp.stack([loss.sum(), dens.sum(), bad.sum().astype(xp.float64)])
    return loss, t, wd, xp.asarray(part, dtype=xp.float64)


def class_finish(total, x, loss, t, wd, ignore, eps, log_input, probabilities, reduction,
                 what):
    """``(loss, saved)`` from the all-reduced ``total`` (3 floats, the same on every rank)."""
    c = x.shape[1]
    if total[2] > 0:
        raise ValueError(f"{what}: {int(total[2])} target labels outside [0, {c}) that are "
                         f"not ignore_index ({ignore})")
    if probabilities:
        den = float(x.shape[0] * _prod(x.shape[2:])) if x.size else 0.0
    else:
        den = total[1]
    scale = 1.0 if reduction != "mean" else (1.0 / den if den else 0.0)
    saved = ClassLossSaved(x, t, probabilities, wd, ignore, eps, bool(log_input), reduction,
                           scale)
    if reduction == "none":
        return per_voxel(loss, x, drop=(1,)), saved
    return reduced(total[0], den, reduction), saved


@collective_entry
def class_loss_forward(x: DistArray, target: DistArray, weight=None, ignore_index: int = -100,
                       reduction: str = "mean", label_smoothing: float = 0.0,
                       log_input: bool = False):
    """Cross-entropy of logits ``x`` (``log_input=True``: NLL of log-probabilities ``x``)
    against ``target``; see the module docstring.  Returns ``(loss, saved)``: a float, or
    the per-voxel DistArray for ``reduction='none'``."""
    what = "nll_loss" if log_input else "cross_entropy"
    with agreed(x.grid.cart, f"{what}_forward", x=x, target=target, weight=array_key(weight),
                ignore_index=meaning(int, ignore_index), reduction=reduction,
                label_smoothing=meaning(float, label_smoothing), log_input=bool(log_input)):
        eps, ignore, w, probabilities = check_class_args(
            x, target, weight, ignore_index, reduction, label_smoothing, log_input, what)
    loss, t, wd, part = class_local(x, target, w, ignore, eps, log_input, probabilities)
    total = allreduce(param_comm(x), part, "sum")
    total = [float(v) for v in (total.get() if hasattr(total, "get") else total)]
    return class_finish(total, x, loss, t, wd, ignore, eps, log_input, probabilities,
                        reduction, what)


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@collective_entry
def class_loss_backward(saved: ClassLossSaved, grad=1.0) -> DistArray:
    """Gradient with respect to the input, distributed like it: ``grad`` is the gradient
    flowing into the loss (a number; the per-voxel DistArray for ``reduction='none'``).
    Labels: ``g * ((1-eps) w[y] + eps W / C) softmax(x) - g * ((1-eps) w[y] [c == y] +
    eps w[c] / C)`` (``W = sum w``; 0 on ignored voxels), NLL ``-g w[y] [c == y]``;
    probabilities: ``g * (softmax(x) sum_k w[k] t'[k] - w[c] t'[c])``; ``g`` = ``grad``
    times ``saved.scale`` (``1 / denominator`` for ``'mean'``)."""
    x = saved.x
    key = grad if saved.reduction == "none" else meaning(float, grad)
    with agreed(x.grid.cart, "class_loss_backward", x=x, grad=key):
        gvox, gscale = incoming(grad, x, saved.reduction, drop=(1,))
    k = kernels_for(x.local)
    gscale *= saved.scale
    if saved.probabilities:
        dx = k.prob_ce_backward(x.local, saved.target, saved.weight, saved.label_smoothing,
                                gvox, gscale)
    else:
        dx = k.class_ce_backward(x.local, saved.target, saved.weight, saved.ignore_index,
                                 saved.label_smoothing, saved.log_input, gvox, gscale)
    return DistArray(dx, x.distribution, x.grid)
