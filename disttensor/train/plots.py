"""``OUT/curves.png``: the loss and metric curves of a run, drawn by rank 0 at its end.

Left: the training loss per step and the validation loss per epoch (at the step where the
epoch ended), log scale.  Right: the validation metric per epoch (CosmoFlow: MAE with the
mean-target predictor's MAE, and ``--target-mae`` as a line; U-Net: Dice and accuracy).
matplotlib is optional (``pip install 'disttensor[plots]'``): without it :func:`plot_curves`
returns a one-line notice instead.  The figure is drawn without pyplot (no global state, no
display needed) and written to a temporary file renamed over the target.  Not collective.
"""
from __future__ import annotations

import os

__all__ = ["CURVES", "plot_curves"]

CURVES = "curves.png"


def plot_curves(path, losses, rows, segmentation: bool, target_mae=None) -> str:
    """Draw ``losses`` (per step) and ``rows`` (metrics.csv rows as dicts) to the PNG
    ``path``; returns the line to print (where it went, or why it was skipped)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return (f"{os.path.basename(path)} skipped: matplotlib is not installed "
                "(pip install 'disttensor[plots]')")
    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax, bx = fig.subplots(1, 2)
    ax.plot(range(1, len(losses) + 1), losses, lw=0.8, label="training loss (step)")
    if rows:
        steps = [r["step"] for r in rows]
        ax.plot(steps, [r["val_loss"] for r in rows], "o-", label="validation loss (epoch)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    if losses and min(losses) > 0:
        ax.set_yscale("log")
    ax.legend()
    epochs = [r["epoch"] for r in rows]
    if segmentation:
        bx.plot(epochs, [r["val_dice"] for r in rows], "o-", label="validation Dice")
        bx.plot(epochs, [r["val_accuracy"] for r in rows], "s-", label="validation accuracy")
        bx.set_ylabel("Dice / accuracy")
    else:
        bx.plot(epochs, [r["val_mae"] for r in rows], "o-", label="validation MAE")
        bx.plot(epochs, [r["baseline_mae"] for r in rows], "x--",
                label="mean-target predictor")
        if target_mae is not None:
            bx.axhline(target_mae, color="k", lw=0.8, ls=":", label=f"target {target_mae}")
        bx.set_ylabel("MAE")
    bx.set_xlabel("epoch")
    bx.legend()
    fig.tight_layout()
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return f"curves: {path}"
