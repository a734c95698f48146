"""The soft Dice loss of segmentation (MONAI's ``DiceLoss``, nnU-Net's ``SoftDiceLoss``) on
``(N, C, *S)`` DistArrays, forward and backward side by side, and ``one_hot`` (PyTorch's
``F.one_hot``).

Dice, with MONAI's documented semantics: ``p`` = the activation of the logits ``x``
(``'softmax'`` over the channels, ``'sigmoid'``, or ``None``: ``x`` are probabilities already),
``t`` = the target: a float array of ``x``'s shape, or integer labels ``(N, *S)`` or ``(N, 1,
*S)``, one-hot encoded over the ``C`` classes (on the fly; labels outside ``[0, C)`` raise).
Per sample and class (``batch=True``: per class, the samples summed too):
``I = sum p t``, ``P = sum p`` and ``G = sum t`` (``squared_pred``: ``p^2``, ``t^2``),
``D = P + G`` (``jaccard``: ``2 (P + G - I)``), ``f = 1 - (2 I + smooth_nr) / (D + smooth_dr)``;
``include_background=False`` drops class 0 from ``f`` (ignored, with a warning, when ``C ==
1``, as MONAI); ``weight`` (a number or one per remaining class, >= 0) multiplies ``f`` per
class (unless one class remains); ``reduction``: ``'mean'`` / ``'sum'`` of ``f`` (a Python
float on every rank), ``'none'``: ``f`` itself, a replicated NumPy array ``(N, C')`` (``(C',)``
with ``batch``; MONAI keeps singleton spatial axes).  nnU-Net's ``SoftDiceLoss(batch_dice,
do_bg, smooth=1)`` is ``smooth_nr = smooth_dr = 1``, ``batch = batch_dice``,
``include_background = do_bg`` and its loss is this one minus 1 (it returns ``-dice``).

Collective: the ranks agree on the metadata and options; one fused pass over the local block
(activation and the three sums) and ONE all-reduce of the ``(N, C, 3)`` sums (each rank adds
its samples' rows; replicas do not count twice) plus the count of bad labels.  The backward
recomputes the activation in one fused pass, taking ``dL/dp = alpha t + beta dP/dp`` back
through it, and sends no message.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.array import DistArray
from ..core.comm import allreduce
from ..core.distribution import Distribution
from ..core.entry import agreed, collective_entry
from ..core.warn import warn
from ._losses import aligned, check_distarray, check_reduction, is_integer_dtype
from ._spatial import array_key, check_layout, meaning, param_comm
from .local import kernels_for

__all__ = ["DiceSaved", "dice_forward", "dice_backward", "dice_labels", "one_hot",
           "DICE_ACTIVATIONS", "dice_keys", "check_dice_args", "dice_local", "dice_finish"]

DICE_ACTIVATIONS = ("softmax", "sigmoid", None)


@dataclass
class DiceSaved:
    x: DistArray
    target: object          # this rank's labels (int64 (N, *S)) or float target block
    activation: str         # kernel activation name: 'softmax', 'sigmoid' or 'none'
    squared: bool
    coef: tuple             # per (sample, class) numbers: intersection, pred, ground sums...
    reduction: str
    sums: np.ndarray        # float64 (N or 1, C, 3) global sums
    keep: np.ndarray        # bool (C,): classes in f
    weight: np.ndarray      # float64 (C,) (0 where not kept)
    jaccard: bool
    smooth_nr: float
    smooth_dr: float
    batch: bool


def dice_labels(target: DistArray, x: DistArray) -> DistArray:
    """Integer ``(N, 1, *S)`` labels as ``(N, *S)`` (collective when the singleton axis is
    split: redistributed first); anything else unchanged.  Call after the agreement."""
    if not (is_integer_dtype(target.dtype) and target.ndim == x.ndim and target.shape[1] == 1):
        return target
    if target.split[1] is not None:
        split = list(target.split)
        split[1] = None
        target = target.redistribute(split=split)
    return DistArray(target.local.reshape(target.local.shape[:1] + target.local.shape[2:]),
                     target.distribution.drop_axes([1]), target.grid)


def _class_weight(weight, c: int, what: str) -> np.ndarray:
    if weight is None:
        return np.ones(c)
    w = np.asarray(weight.get() if hasattr(weight, "get") else weight, dtype=np.float64)
    if w.ndim == 0:
        w = np.full(c, float(w))
    if w.shape != (c,):
        raise ValueError(f"{what}: weight must be a number or {c} numbers (one per class "
                         f"{'after dropping the background' if c else ''}), got shape "
                         f"{w.shape}")
    if (w < 0).any():
        raise ValueError(f"{what}: the weight values should be no less than 0")
    return w


def _f_and_coefficients(sums, jaccard, snr, sdr):
    """``f`` and its partial derivatives in ``I`` and ``P`` per (sample or 1, class)."""
    inter, pred, ground = sums[..., 0], sums[..., 1], sums[..., 2]
    den = pred + ground
    if jaccard:
        den = 2.0 * (den - inter)
    num = 2.0 * inter + snr
    d = den + sdr
    f = 1.0 - num / d
    q = num / (d * d)
    df_dp = q * (2.0 if jaccard else 1.0)
    df_di = -2.0 / d - (2.0 * q if jaccard else 0.0)
    return f, df_di, df_dp


def dice_keys(activation, include_background, squared_pred, jaccard, reduction, smooth_nr,
              smooth_dr, batch, weight) -> dict:
    """The Dice options as the ranks agree on them."""
    return dict(activation=activation, include_background=bool(include_background),
                squared_pred=bool(squared_pred), jaccard=bool(jaccard), reduction=reduction,
                smooth_nr=meaning(float, smooth_nr), smooth_dr=meaning(float, smooth_dr),
                batch=bool(batch),
                weight=array_key(weight) if weight is None or hasattr(weight, "shape")
                else meaning(tuple, np.atleast_1d(weight).tolist()))


def check_dice_args(x, target, activation, include_background, reduction, weight, what):
    """The checks of :func:`dice_forward` (replicated metadata, inside the caller's agreed
    block): ``(integer labels?, kept classes (C,) bool, per-class weight (C,))``."""
    check_distarray(x, what, "input")
    check_distarray(target, what, "target")
    check_reduction(reduction, what)
    if x.ndim < 2:
        raise ValueError(f"{what}: the input must have layout (N, C, *spatial), got "
                         f"shape {x.shape}")
    check_layout(x, what, min_spatial=0)
    if activation not in DICE_ACTIVATIONS:
        raise ValueError(f"{what}: activation must be one of {DICE_ACTIVATIONS}, got "
                         f"{activation!r}")
    c = x.shape[1]
    labels = is_integer_dtype(target.dtype)
    label_shapes = (x.shape[:1] + x.shape[2:], x.shape[:1] + (1,) + x.shape[2:])
    if labels and target.shape not in label_shapes:
        raise ValueError(f"{what}: integer labels must have shape {label_shapes[0]} or "
                         f"{label_shapes[1]}, got {target.shape}")
    if not labels:
        if target.dtype.kind != "f":
            raise TypeError(f"{what}: the target must be integer labels or a float array, "
                            f"got {target.dtype}")
        if target.shape != x.shape:
            raise ValueError(f"{what}: a float target must have the input shape {x.shape}, "
                             f"got {target.shape}")
    keep = np.ones(c, dtype=bool)
    if not include_background:
        if c == 1:
            warn("single channel prediction, `include_background=False` ignored.",
                 UserWarning)
        else:
            keep[0] = False
    w = np.zeros(c)
    kept = int(keep.sum())
    w[keep] = _class_weight(weight, kept, what) if kept != 1 else 1.0
    return labels, keep, w


def dice_local(x, target, labels, activation, squared):
    """This rank's part (after the agreement; collective where the target is redistributed):
    ``(target block, float64 buffer of N*C*3 + 1: this rank's samples' sums in their global
    rows, then the count of labels out of range)``."""
    k = kernels_for(x.local)
    xp = x.xp
    c = x.shape[1]
    if labels:
        target = dice_labels(target, x)
        t = aligned(target, x, drop=(1,)).local.astype(xp.int64, copy=False)
        bad = ((t < 0) | (t >= c)).sum()
    else:
        t = aligned(target, x).local
        bad = xp.zeros(())
    local = k.dice_sums(x.local, t, activation or "none", bool(squared))
    buf = xp.zeros(x.shape[0] * c * 3 + 1)
    n0, nl = x.local_slices[0].start, x.local.shape[0]
    buf[n0 * c * 3:(n0 + nl) * c * 3] = xp.asarray(local, dtype=xp.float64).reshape(-1)
    buf[-1] = bad
    return t, buf


def dice_finish(total, x, t, activation, squared, jaccard, reduction, smooth_nr, smooth_dr,
                batch, keep, w, what):
    """``(loss, saved)`` from the all-reduced buffer ``total`` (host, the same everywhere)."""
    n, c = x.shape[:2]
    if total[-1] > 0:
        raise ValueError(f"{what}: {int(total[-1])} target labels outside [0, {c})")
    sums = np.asarray(total[:-1]).reshape(n, c, 3)
    if batch:
        sums = sums.sum(axis=0, keepdims=True)
    f, df_di, df_dp = _f_and_coefficients(sums, bool(jaccard), float(smooth_nr),
                                          float(smooth_dr))
    fw = (f * w)[:, keep]
    saved = DiceSaved(x, t, activation or "none", bool(squared), (df_di, df_dp), reduction,
                      sums, keep, w, bool(jaccard), float(smooth_nr), float(smooth_dr),
                      bool(batch))
    if reduction == "none":
        return (fw[0] if batch else fw), saved
    if reduction == "sum":
        return float(fw.sum()), saved
    return (float(fw.mean()) if fw.size else float("nan")), saved


@collective_entry
def dice_forward(x: DistArray, target: DistArray, activation="softmax",
                 include_background: bool = True, squared_pred: bool = False,
                 jaccard: bool = False, reduction: str = "mean", smooth_nr: float = 1e-5,
                 smooth_dr: float = 1e-5, batch: bool = False, weight=None):
    """The soft Dice loss of ``x`` against ``target`` (see the module docstring; integer
    ``(N, 1, *S)`` labels go through :func:`dice_labels` first).  Returns ``(loss, saved)``."""
    what = "dice_loss"
    with agreed(x.grid.cart, "dice_forward", x=x, target=target,
                **dice_keys(activation, include_background, squared_pred, jaccard, reduction,
                            smooth_nr, smooth_dr, batch, weight)):
        labels, keep, w = check_dice_args(x, target, activation, include_background,
                                          reduction, weight, what)
    t, buf = dice_local(x, target, labels, activation, squared_pred)
    total = allreduce(param_comm(x), buf, "sum")
    total = np.asarray(total.get() if hasattr(total, "get") else total)
    return dice_finish(total, x, t, activation, squared_pred, jaccard, reduction, smooth_nr,
                       smooth_dr, batch, keep, w, what)


@collective_entry
def dice_backward(saved: DiceSaved, grad=1.0) -> DistArray:
    """Gradient in the input (distributed like it) for the incoming gradient ``grad`` (a
    number; for ``'none'`` an array of the loss's shape, replicated)."""
    x = saved.x
    kept = saved.keep
    nf = (1 if saved.batch else x.shape[0]) * int(kept.sum())
    gkey = meaning(float, grad) if saved.reduction != "none" else \
        array_key(np.asarray(grad))
    with agreed(x.grid.cart, "dice_backward", x=x, grad=gkey):
        shape = (int(kept.sum()),) if saved.batch else (x.shape[0], int(kept.sum()))
        if saved.reduction == "none":
            g = np.asarray(grad.get() if hasattr(grad, "get") else grad, dtype=np.float64)
            if g.shape != shape:
                raise ValueError(f"dice_loss: the gradient of reduction='none' must have "
                                 f"shape {shape}, got {g.shape}")
    rows = saved.sums.shape[0]
    a = np.zeros((rows, x.shape[1]))
    if saved.reduction == "none":
        a[:, kept] = g.reshape(rows, -1)
    else:
        a[:, kept] = float(grad) / (nf if saved.reduction == "mean" and nf else 1)
    a *= saved.weight
    df_di, df_dp = saved.coef
    alpha, beta = a * df_di, a * df_dp
    n0 = x.local_slices[0].start
    nl = x.local.shape[0]
    if saved.batch:
        alpha, beta = np.repeat(alpha, nl, axis=0), np.repeat(beta, nl, axis=0)
    else:
        alpha, beta = alpha[n0:n0 + nl], beta[n0:n0 + nl]
    xp = x.xp
    k = kernels_for(x.local)
    dx = k.dice_backward(x.local, saved.target, xp.asarray(alpha), xp.asarray(beta),
                         saved.activation, saved.squared)
    return DistArray(dx, x.distribution, x.grid)


@collective_entry
def one_hot(labels: DistArray, num_classes: int = -1) -> DistArray:
    """PyTorch's ``F.one_hot``: int64 ``labels.shape + (K,)``, the class axis LAST (whole on
    every rank; the other axes laid out as ``labels``); ``num_classes=-1`` takes ``K = max + 1``
    over the whole array (one all-reduce).  Negative labels, labels ``>= num_classes`` and
    ``-1`` with an empty array raise ``ValueError`` on every rank, as PyTorch's messages say.

    Segmentation losses want the classes on axis 1 (``(N, C, *S)``, the logits' layout,
    channel axis unsplit): ``moveaxis(one_hot(labels), -1, 1)`` gives that; the Dice and
    cross-entropy ops here never build it (they one-hot encode on the fly in their kernels)."""
    with agreed(labels.grid.cart, "one_hot", labels=labels,
                num_classes=meaning(int, num_classes)):
        check_distarray(labels, "one_hot", "labels")
        if not is_integer_dtype(labels.dtype):
            raise TypeError(f"one_hot is only applicable to index tensor (an integer dtype), "
                            f"got {labels.dtype}")
        k = int(num_classes)
        if k < -1:
            raise ValueError(f"one_hot: num_classes must be -1 or >= 0, got {k}")
        if k == -1 and labels.size == 0:
            raise ValueError("Can not infer total number of classes from empty tensor.")
    xp = labels.xp
    loc = labels.local.astype(xp.int64, copy=False)
    big = np.iinfo(np.int64).max
    part = xp.asarray([loc.max() if loc.size else -big, -(loc.min()) if loc.size else -big],
                      dtype=xp.int64)
    top = allreduce(param_comm(labels), part, "max")
    hi, neg_lo = (int(v) for v in (top.get() if hasattr(top, "get") else top))
    if -neg_lo < 0:
        raise ValueError("Class values must be non-negative.")
    if k == -1:
        k = hi + 1
    elif hi >= k:
        raise ValueError("Class values must be smaller than num_classes.")
    out = (loc[..., None] == xp.arange(k, dtype=xp.int64)).astype(xp.int64)
    d = labels.distribution
    dist = Distribution(tuple(d.shape) + (k,), d.grid_dims, tuple(d.split) + (None,),
                        tuple(d.split_sizes) + (None,))
    return DistArray(out, dist, labels.grid)
