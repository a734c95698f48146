"""Dice + cross-entropy in one op (MONAI's ``DiceCELoss``, what nnU-Net trains with):
``lambda_dice * dice + lambda_ce * cross_entropy`` of logits ``x`` ``(N, C, *S)`` against
integer labels (``(N, *S)`` or ``(N, 1, *S)``) or a float target of ``x``'s shape (class
probabilities for the cross-entropy), forward and backward side by side.

The Dice term has the options of :func:`disttensor.ops.losses_dice.dice_forward` (``weight``:
its per-class weights); the cross-entropy those of
:func:`disttensor.ops.losses_classification.class_loss_forward` (``ce_weight``,
``ignore_index``, ``label_smoothing``; labels equal to ``ignore_index`` are out of range for
the Dice term, which has no ignore index in MONAI either).  ``reduction``: ``'mean'`` or
``'sum'`` (both terms).  Collective: ONE agreement and ONE all-reduce carry both terms' sums
(the two separate ops would make two of each); each rank runs the Dice-sums and the
cross-entropy kernels over its block.  The backward adds the two terms' gradients and sends
no message.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.array import DistArray
from ..core.comm import allreduce
from ..core.entry import agreed, collective_entry
from ._losses import class_weight
from ._spatial import array_key, meaning, param_comm
from .losses_classification import (ClassLossSaved, _float_option, check_class_args,
                                    class_finish, class_local, class_loss_backward)
from .losses_dice import (DiceSaved, check_dice_args, dice_backward, dice_finish, dice_keys,
                          dice_local)

__all__ = ["DiceCESaved", "dice_ce_forward", "dice_ce_backward"]


@dataclass
class DiceCESaved:
    dice: DiceSaved
    ce: ClassLossSaved
    lambda_dice: float
    lambda_ce: float


@collective_entry
def dice_ce_forward(x: DistArray, target: DistArray, activation="softmax",
                    include_background: bool = True, squared_pred: bool = False,
                    jaccard: bool = False, reduction: str = "mean", smooth_nr: float = 1e-5,
                    smooth_dr: float = 1e-5, batch: bool = False, weight=None,
                    lambda_dice: float = 1.0, lambda_ce: float = 1.0,
                    label_smoothing: float = 0.0, ce_weight=None, ignore_index: int = -100):
    """``(loss, saved)``: the float ``lambda_dice * dice + lambda_ce * ce`` (see the module
    docstring)."""
    what = "dice_ce_loss"
    with agreed(x.grid.cart, "dice_ce_forward", x=x, target=target,
                **dice_keys(activation, include_background, squared_pred, jaccard, reduction,
                            smooth_nr, smooth_dr, batch, weight),
                lambda_dice=meaning(float, lambda_dice), lambda_ce=meaning(float, lambda_ce),
                label_smoothing=meaning(float, label_smoothing), ce_weight=array_key(ce_weight),
                ignore_index=meaning(int, ignore_index)):
        if reduction not in ("mean", "sum"):
            raise ValueError(f"{what}: reduction must be 'mean' or 'sum', got {reduction!r}")
        labels, keep, w = check_dice_args(x, target, activation, include_background,
                                          reduction, weight, what)
        if labels:   # (the Dice checks accepted the label shapes and dtype)
            eps = _float_option(label_smoothing, what, "label_smoothing", 0.0, 1.0)
            wce = class_weight(ce_weight, x.shape[1], what)
            ignore = int(ignore_index)
        else:
            eps, ignore, wce, _ = check_class_args(x, target, ce_weight, ignore_index,
                                                   reduction, label_smoothing, False, what)
        lam_d, lam_c = float(lambda_dice), float(lambda_ce)
    t, buf = dice_local(x, target, labels, activation, squared_pred)
    dist = x.distribution.drop_axes([1]) if labels else x.distribution
    loss_c, t_c, wd, part = class_local(x, DistArray(t, dist, x.grid), wce, ignore, eps, False,
                                        not labels)
    xp = x.xp
    total = allreduce(param_comm(x), xp.concatenate([buf, part]), "sum")
    total = np.asarray(total.get() if hasattr(total, "get") else total)
    dice, dsaved = dice_finish(total[:-3], x, t, activation, squared_pred, jaccard, reduction,
                               smooth_nr, smooth_dr, batch, keep, w, what)
    ce, csaved = class_finish([float(v) for v in total[-3:]], x, loss_c, t_c, wd, ignore, eps,
                              False, not labels, reduction, what)
    return lam_d * dice + lam_c * ce, DiceCESaved(dsaved, csaved, lam_d, lam_c)


@collective_entry
def dice_ce_backward(saved: DiceCESaved, grad=1.0) -> DistArray:
    """Gradient in the input (distributed like it) for the incoming gradient ``grad`` (a
    number): ``lambda_dice`` times the Dice term's plus ``lambda_ce`` times the
    cross-entropy's (collective only to agree on ``grad``)."""
    x = saved.dice.x
    with agreed(x.grid.cart, "dice_ce_backward", x=x, grad=meaning(float, grad)):
        g = float(grad)
    dd = dice_backward(saved.dice, g * saved.lambda_dice)   # nested: no agreement of their own
    dc = class_loss_backward(saved.ce, g * saved.lambda_ce)
    return DistArray(dd.local + dc.local, x.distribution, x.grid)
