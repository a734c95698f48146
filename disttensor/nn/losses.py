"""Losses in PyTorch's names and semantics, differentiable: ``cross_entropy``, ``nll_loss``,
``mse_loss``, ``l1_loss``, ``smooth_l1_loss``, ``huber_loss``,
``binary_cross_entropy_with_logits``, ``binary_cross_entropy``, ``one_hot`` (as
``torch.nn.functional``), the soft Dice loss ``dice_loss`` and ``dice_ce_loss`` (MONAI's
``DiceLoss`` / ``DiceCELoss``; nnU-Net trains with Dice + cross-entropy), and their module
classes ``CrossEntropyLoss``, ``NLLLoss``, ``MSELoss``, ``L1Loss``, ``SmoothL1Loss``,
``HuberLoss``, ``BCEWithLogitsLoss``, ``BCELoss``, ``DiceLoss``, ``DiceCELoss``.

Inputs are :class:`~disttensor.autograd.Tensor` s (or DistArrays) holding ``(N, C, *S)``
DistArrays; each function runs its op of :mod:`disttensor.ops` (``losses_classification``,
``losses_pointwise``, ``losses_dice``) and records the op's explicit backward.  ``reduction``
``'mean'``/``'sum'`` give a scalar tensor (a Python float, the same on every rank);
``'none'`` the per-voxel tensor (a DistArray; Dice: a replicated ``(N, C)`` array).
Everything is collective over the input's grid.  Targets get no gradient except for the losses
of ``input - target`` (MSE, L1, smooth L1, Huber), as PyTorch's.  Where this differs from
PyTorch: float labels of the label shape raise ``TypeError`` (PyTorch: ``RuntimeError``,
"expected scalar type Long"), labels may have any integer dtype, ``weight`` any float dtype;
out-of-range labels / BCE inputs raise ``ValueError`` on every rank (PyTorch: an assertion
or ``RuntimeError``); the regression losses do not broadcast the target.
"""
from __future__ import annotations

import numpy as np

from ..autograd.tensor import make_result, unwrap
from ..ops.losses_classification import class_loss_backward, class_loss_forward
from ..ops.losses_dice import dice_backward, dice_forward
from ..ops.losses_dice import one_hot as _one_hot
from ..ops.losses_dice_ce import dice_ce_backward, dice_ce_forward
from ..ops.losses_pointwise import pointwise_loss_backward, pointwise_loss_forward
from .module import Module

# re-exported by nn.functional (FUNCTIONS), nn.layers and nn (MODULES)
FUNCTIONS = ["cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss",
             "huber_loss", "binary_cross_entropy_with_logits", "binary_cross_entropy",
             "dice_loss", "dice_ce_loss", "one_hot"]
MODULES = ["CrossEntropyLoss", "NLLLoss", "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss",
           "BCEWithLogitsLoss", "BCELoss", "DiceLoss", "DiceCELoss"]
__all__ = FUNCTIONS + MODULES

def _class_loss(input, target, weight, ignore_index, reduction, label_smoothing, log_input,
                name):
    loss, saved = class_loss_forward(unwrap(input), unwrap(target), unwrap(weight),
                                     ignore_index, reduction, label_smoothing, log_input)
    return make_result(loss, (input, target), lambda g: (class_loss_backward(saved, g), None),
                       name)


def cross_entropy(input, target, weight=None, size_average=None, ignore_index: int = -100,
                  reduce=None, reduction: str = "mean", label_smoothing: float = 0.0):
    """``torch.nn.functional.cross_entropy`` over the channel axis of ``(N, C, *S)`` logits:
    integer class labels ``(N, *S)`` or class probabilities of the input's shape, ``weight``,
    ``ignore_index``, ``label_smoothing``, ``reduction`` with PyTorch's semantics (see
    :mod:`disttensor.ops.losses_classification`).  ``size_average``/``reduce`` (deprecated in
    PyTorch) must stay None."""
    _no_legacy(size_average, reduce)
    return _class_loss(input, target, weight, ignore_index, reduction, label_smoothing, False,
                       "cross_entropy")


def nll_loss(input, target, weight=None, size_average=None, ignore_index: int = -100,
             reduce=None, reduction: str = "mean"):
    """``torch.nn.functional.nll_loss``: ``-w[y] * input[y]`` of log-probabilities ``input``
    ``(N, C, *S)`` and integer labels ``(N, *S)``; PyTorch's weighted mean."""
    _no_legacy(size_average, reduce)
    return _class_loss(input, target, weight, ignore_index, reduction, 0.0, True, "nll_loss")


def _no_legacy(size_average, reduce) -> None:
    if size_average is not None or reduce is not None:
        raise ValueError("size_average and reduce are deprecated in PyTorch and not "
                         "supported here; use reduction=")


def _pointwise(name, input, target, reduction, param=1.0, weight=None, pos_weight=None):
    loss, saved = pointwise_loss_forward(name, unwrap(input), unwrap(target), reduction, param,
                                         unwrap(weight), unwrap(pos_weight))
    need_t = getattr(target, "requires_grad", False)
    return make_result(loss, (input, target),
                       lambda g: pointwise_loss_backward(saved, g, need_target=need_t), name)


def mse_loss(input, target, size_average=None, reduce=None, reduction: str = "mean"):
    """``torch.nn.functional.mse_loss``: ``(input - target)^2``."""
    _no_legacy(size_average, reduce)
    return _pointwise("mse", input, target, reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction: str = "mean"):
    """``torch.nn.functional.l1_loss``: ``|input - target|`` (gradient ``sign``, 0 at 0)."""
    _no_legacy(size_average, reduce)
    return _pointwise("l1", input, target, reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction: str = "mean",
                   beta: float = 1.0):
    """``torch.nn.functional.smooth_l1_loss``: ``0.5 d^2 / beta`` where ``|d| < beta``, else
    ``|d| - 0.5 beta`` (``beta = 0``: L1)."""
    _no_legacy(size_average, reduce)
    return _pointwise("smooth_l1", input, target, reduction, beta)


def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0):
    """``torch.nn.functional.huber_loss``: ``0.5 d^2`` where ``|d| < delta``, else
    ``delta (|d| - 0.5 delta)``."""
    return _pointwise("huber", input, target, reduction, delta)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None,
                                     reduce=None, reduction: str = "mean", pos_weight=None):
    """``torch.nn.functional.binary_cross_entropy_with_logits`` in its stable form;
    ``weight`` and ``pos_weight`` broadcast to the input's shape by PyTorch's rules (a
    per-class ``pos_weight`` of an ``(N, C, *S)`` input: shape ``(C, 1, ..., 1)``)."""
    _no_legacy(size_average, reduce)
    return _pointwise("bce_with_logits", input, target, reduction, 1.0, weight, pos_weight)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction: str = "mean"):
    """``torch.nn.functional.binary_cross_entropy`` of probabilities ``input`` in [0, 1]
    (logs clamped at -100, as PyTorch)."""
    _no_legacy(size_average, reduce)
    return _pointwise("bce", input, target, reduction, 1.0, weight)


def dice_loss(input, target, include_background: bool = True, sigmoid: bool = False,
              softmax: bool = False, squared_pred: bool = False, jaccard: bool = False,
              reduction: str = "mean", smooth_nr: float = 1e-5, smooth_dr: float = 1e-5,
              batch: bool = False, weight=None):
    """The soft Dice loss of logits ``input`` ``(N, C, *S)`` (MONAI's ``DiceLoss``; see
    :mod:`disttensor.ops.losses_dice`): ``softmax`` or ``sigmoid`` of the logits, or neither
    (MONAI's default: ``input`` are probabilities); integer labels are one-hot encoded."""
    if sigmoid and softmax:
        raise ValueError("dice_loss: sigmoid=True and softmax=True are not compatible")
    act = "sigmoid" if sigmoid else ("softmax" if softmax else None)
    loss, saved = dice_forward(unwrap(input), unwrap(target), act, include_background,
                               squared_pred, jaccard, reduction, smooth_nr, smooth_dr, batch,
                               unwrap(weight))
    return make_result(loss, (input, target), lambda g: (dice_backward(saved, g), None),
                       "dice_loss")


def dice_ce_loss(input, target, include_background: bool = True, sigmoid: bool = False,
                 softmax: bool = False, squared_pred: bool = False, jaccard: bool = False,
                 reduction: str = "mean", smooth_nr: float = 1e-5, smooth_dr: float = 1e-5,
                 batch: bool = False, weight=None, lambda_dice: float = 1.0,
                 lambda_ce: float = 1.0, label_smoothing: float = 0.0, ce_weight=None,
                 ignore_index: int = -100):
    """MONAI's ``DiceCELoss``: ``lambda_dice * dice_loss + lambda_ce * cross_entropy`` (the
    cross-entropy with ``ce_weight``, ``ignore_index`` and ``label_smoothing`` and the same
    ``reduction``, ``'mean'`` or ``'sum'``), one op with one all-reduce
    (:mod:`disttensor.ops.losses_dice_ce`).  Integer ``(N, 1, *S)`` labels are accepted as
    ``(N, *S)``.  nnU-Net's ``DC_and_CE_loss`` is ``include_background=False, smooth_nr =
    smooth_dr = 1`` (+1: it adds ``-dice``)."""
    if sigmoid and softmax:
        raise ValueError("dice_ce_loss: sigmoid=True and softmax=True are not compatible")
    act = "sigmoid" if sigmoid else ("softmax" if softmax else None)
    loss, saved = dice_ce_forward(unwrap(input), unwrap(target), act, include_background,
                                  squared_pred, jaccard, reduction, smooth_nr, smooth_dr,
                                  batch, unwrap(weight), lambda_dice, lambda_ce,
                                  label_smoothing, unwrap(ce_weight), ignore_index)
    return make_result(loss, (input, target), lambda g: (dice_ce_backward(saved, g), None),
                       "dice_ce_loss")


def one_hot(tensor, num_classes: int = -1):
    """``torch.nn.functional.one_hot``: int64, the class axis last; ``num_classes=-1`` takes
    the global maximum + 1 (see :func:`disttensor.ops.losses_dice.one_hot`, which says when a
    channel-first layout helps segmentation).  A Tensor in, a Tensor (no gradient) out."""
    from ..autograd.tensor import Tensor
    out = _one_hot(unwrap(tensor), num_classes)
    return Tensor(out) if isinstance(tensor, Tensor) else out


# -- modules -----------------------------------------------------------------------------------
class _Loss(Module):
    def __init__(self, reduction: str = "mean", **kw):
        super().__init__()
        self.reduction = reduction
        self._kw = kw

    def extra_repr(self) -> str:
        return ", ".join([f"reduction={self.reduction!r}"] +
                         [f"{k}={v!r}" for k, v in self._kw.items()])


class CrossEntropyLoss(_Loss):
    def __init__(self, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean", label_smoothing: float = 0.0):
        _no_legacy(size_average, reduce)
        super().__init__(reduction, ignore_index=ignore_index, label_smoothing=label_smoothing)
        self.register_buffer("weight", weight)

    def forward(self, input, target):
        return cross_entropy(input, target, self.weight, None, self._kw["ignore_index"], None,
                             self.reduction, self._kw["label_smoothing"])


class NLLLoss(_Loss):
    def __init__(self, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean"):
        _no_legacy(size_average, reduce)
        super().__init__(reduction, ignore_index=ignore_index)
        self.register_buffer("weight", weight)

    def forward(self, input, target):
        return nll_loss(input, target, self.weight, None, self._kw["ignore_index"], None,
                        self.reduction)


class MSELoss(_Loss):
    def __init__(self, size_average=None, reduce=None, reduction: str = "mean"):
        _no_legacy(size_average, reduce)
        super().__init__(reduction)

    def forward(self, input, target):
        return mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    def __init__(self, size_average=None, reduce=None, reduction: str = "mean"):
        _no_legacy(size_average, reduce)
        super().__init__(reduction)

    def forward(self, input, target):
        return l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    def __init__(self, size_average=None, reduce=None, reduction: str = "mean",
                 beta: float = 1.0):
        _no_legacy(size_average, reduce)
        super().__init__(reduction, beta=beta)

    def forward(self, input, target):
        return smooth_l1_loss(input, target, reduction=self.reduction, beta=self._kw["beta"])


class HuberLoss(_Loss):
    def __init__(self, reduction: str = "mean", delta: float = 1.0):
        super().__init__(reduction, delta=delta)

    def forward(self, input, target):
        return huber_loss(input, target, self.reduction, self._kw["delta"])


class BCEWithLogitsLoss(_Loss):
    def __init__(self, weight=None, size_average=None, reduce=None, reduction: str = "mean",
                 pos_weight=None):
        _no_legacy(size_average, reduce)
        super().__init__(reduction)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input, target):
        return binary_cross_entropy_with_logits(input, target, self.weight, None, None,
                                                self.reduction, self.pos_weight)


class BCELoss(_Loss):
    def __init__(self, weight=None, size_average=None, reduce=None, reduction: str = "mean"):
        _no_legacy(size_average, reduce)
        super().__init__(reduction)
        self.register_buffer("weight", weight)

    def forward(self, input, target):
        return binary_cross_entropy(input, target, self.weight, None, None, self.reduction)


_DICE_DEFAULTS = dict(include_background=True, sigmoid=False, softmax=False,
                      squared_pred=False, jaccard=False, smooth_nr=1e-5, smooth_dr=1e-5,
                      batch=False)


class DiceLoss(_Loss):
    """MONAI's ``DiceLoss`` (its argument names and defaults: no activation unless
    ``softmax=True`` or ``sigmoid=True``; ``to_onehot_y`` is accepted and integer targets are
    always one-hot encoded; ``other_act`` is not supported)."""

    def __init__(self, include_background: bool = True, to_onehot_y: bool = False,
                 sigmoid: bool = False, softmax: bool = False, squared_pred: bool = False,
                 jaccard: bool = False, reduction: str = "mean", smooth_nr: float = 1e-5,
                 smooth_dr: float = 1e-5, batch: bool = False, weight=None):
        if sigmoid and softmax:
            raise ValueError("DiceLoss: sigmoid=True and softmax=True are not compatible")
        super().__init__(reduction, include_background=include_background, sigmoid=sigmoid,
                         softmax=softmax, squared_pred=squared_pred, jaccard=jaccard,
                         smooth_nr=smooth_nr, smooth_dr=smooth_dr, batch=batch)
        self.to_onehot_y = to_onehot_y
        self.register_buffer("class_weight", None if weight is None else np.asarray(weight))

    def forward(self, input, target):
        return dice_loss(input, target, reduction=self.reduction, weight=self.class_weight,
                         **self._kw)


class DiceCELoss(_Loss):
    """MONAI's ``DiceCELoss`` (``lambda_dice * Dice + lambda_ce * CE``; reduction ``'mean'``
    or ``'sum'``).  ``weight`` is the cross-entropy's class weight only (recent MONAI applies
    it to the Dice term too); ``ignore_index`` applies to the cross-entropy only."""

    def __init__(self, include_background: bool = True, to_onehot_y: bool = False,
                 sigmoid: bool = False, softmax: bool = False, squared_pred: bool = False,
                 jaccard: bool = False, reduction: str = "mean", smooth_nr: float = 1e-5,
                 smooth_dr: float = 1e-5, batch: bool = False, weight=None,
                 lambda_dice: float = 1.0, lambda_ce: float = 1.0,
                 label_smoothing: float = 0.0, ignore_index: int = -100):
        if reduction not in ("mean", "sum"):
            raise ValueError(f"DiceCELoss: reduction must be 'mean' or 'sum', got "
                             f"{reduction!r}")
        if sigmoid and softmax:
            raise ValueError("DiceCELoss: sigmoid=True and softmax=True are not compatible")
        super().__init__(reduction, include_background=include_background, sigmoid=sigmoid,
                         softmax=softmax, squared_pred=squared_pred, jaccard=jaccard,
                         smooth_nr=smooth_nr, smooth_dr=smooth_dr, batch=batch,
                         lambda_dice=lambda_dice, lambda_ce=lambda_ce,
                         label_smoothing=label_smoothing, ignore_index=ignore_index)
        self.to_onehot_y = to_onehot_y
        self.register_buffer("weight", None if weight is None else np.asarray(weight))

    def forward(self, input, target):
        return dice_ce_loss(input, target, reduction=self.reduction, ce_weight=self.weight,
                            **self._kw)
