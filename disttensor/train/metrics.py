"""What a training run reports: validation metrics, ``OUT/metrics.csv``, and the lines on
rank 0's output.

* :func:`validate` (collective): the validation loss and, for CosmoFlow, the mean absolute
  error against the trivial predictor (the mean training target: ``baseline_mae``,
  ``baseline_mse``); for the U-Net, the mean Dice over the foreground classes and the voxel
  accuracy against predicting the majority class (confusion counts summed over the
  distributed batch).
* :func:`append_csv`: one row per epoch appended to ``OUT/metrics.csv`` (rank 0), the header
  with the first row.
* :class:`Progress` (:mod:`~disttensor.train.progress`): rank 0's progress output (a tqdm
  bar on a terminal, only the final lines otherwise); :func:`epoch_line` and
  :func:`final_line` word the results.
"""
from __future__ import annotations

import csv
import os

import numpy as np

from ..autograd import Tensor, no_grad
from ..core.comm import allreduce
from ..ops._losses import aligned
from ..ops._spatial import param_comm
from .progress import Progress  # re-exported: it lived here first

__all__ = ["METRICS", "Progress", "validate", "segmentation_counts", "dice_accuracy",
           "epoch_line", "final_line", "append_csv"]

METRICS = "metrics.csv"


def validate(model, ds, loss_fn, segmentation, dtype, tmean, args) -> dict:
    """Validation metrics (collective).  ``model`` may be a :class:`~disttensor.nn.Pipeline`:
    its output exists on the last stage only, whose metrics are the result (the other stages
    return theirs unfilled; the caller broadcasts the last stage's)."""
    model.eval()
    total, n = 0.0, 0
    abs_err = base_abs = base_sq = 0.0
    counts = None
    with no_grad():
        for x, y in ds.epoch(0):
            xt = Tensor(x if x.dtype == dtype else x.astype(dtype))
            pred = model(xt)
            b = x.shape[0]
            if pred is None:  # an earlier pipeline stage
                continue
            total += loss_fn(pred, Tensor(y)).item() * b
            n += b
            if segmentation:
                c = segmentation_counts(pred.data, y, args.classes)
                counts = c if counts is None else counts + c
            else:
                p, t = pred.data, y.astype(pred.dtype)
                abs_err += float(np.abs(p - t).mean()) * b
                tm = np.asarray(tmean, dtype=np.float64)
                base_abs += float(np.abs(t - tm).mean()) * b
                base_sq += float(((t - tm) ** 2).mean()) * b
    model.train()
    out = {"val_loss": total / max(n, 1)}
    if segmentation:
        dice, acc = dice_accuracy(counts)
        majority = counts[2].max() / max(counts[2].sum(), 1)
        out.update({"val_dice": dice, "val_accuracy": acc, "baseline_dice": 0.0,
                    "baseline_accuracy": float(majority)})
    else:
        out.update({"val_mae": abs_err / max(n, 1), "baseline_mae": base_abs / max(n, 1),
                    "baseline_mse": base_sq / max(n, 1)})
    return out


def segmentation_counts(logits, labels, classes: int) -> np.ndarray:
    """Per class: [true positives, predicted, actual] summed over the distributed batch (the
    labels are first laid out like the logits without their class axis: a network's output
    may be split otherwise than its input, e.g. after strided convolutions)."""
    labels = aligned(labels, logits, drop=(1,))
    pred = logits.local.argmax(axis=1)
    lab = labels.local.astype(np.int64, copy=False)
    xp = logits.xp
    out = xp.zeros((3, classes), dtype=xp.float64)
    for c in range(classes):
        p, t = pred == c, lab == c
        out[0, c] = (p & t).sum()
        out[1, c] = p.sum()
        out[2, c] = t.sum()
    res = allreduce(param_comm(logits), out, "sum")
    return res.get() if hasattr(res, "get") else res


def dice_accuracy(counts) -> tuple[float, float]:
    """Mean Dice over the foreground classes (1..C-1) and voxel accuracy."""
    tp, pred, act = counts
    fg = range(1, counts.shape[1])
    dice = [2 * tp[c] / (pred[c] + act[c]) if pred[c] + act[c] else 1.0 for c in fg]
    return float(np.mean(dice)) if dice else 1.0, float(tp.sum() / max(act.sum(), 1))


def epoch_line(m, args, segmentation) -> str:
    """The line of an epoch's metrics ``m`` (a row of metrics.csv)."""
    head = f"epoch {m['epoch']}/{args.epochs} train loss {m['train_loss']:.5f} " \
           f"val loss {m['val_loss']:.5f}"
    if segmentation:
        return head + f" val Dice {m['val_dice']:.3f} accuracy {m['val_accuracy']:.3f} " \
                      f"({m['samples_per_s']:.1f} samples/s)"
    return head + f" val MAE {m['val_mae']:.4f} ({m['samples_per_s']:.1f} samples/s)"


def final_line(m, segmentation) -> str:
    """The last line of a run: the validation error against the trivial predictor's."""
    if segmentation:
        return (f"final: validation Dice {m['val_dice']:.3f} (predicting the majority class: "
                f"{m['baseline_dice']:.3f}), accuracy {m['val_accuracy']:.3f} (majority "
                f"class: {m['baseline_accuracy']:.3f})")
    ratio = m["baseline_mae"] / max(m["val_mae"], 1e-12)
    return (f"final: validation MAE {m['val_mae']:.4f} vs {m['baseline_mae']:.4f} for the "
            f"mean-target predictor ({ratio:.1f}x lower)")


def append_csv(path, row: dict) -> None:
    """Append ``row`` to the CSV file ``path`` (with a header line when the file is new)."""
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)
