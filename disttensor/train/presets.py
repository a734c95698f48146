"""Recipes for ``python -m disttensor.train --preset NAME`` and the learning-rate scaling and
per-epoch decay they use.

A preset changes the parser's *defaults* (:func:`apply_preset_defaults`, called by
:func:`~disttensor.train.arguments.parse_args` before parsing), so any option given on the
command line overrides it, whatever the order of the options.

``mlperf-hpc`` is the MLPerf HPC CosmoFlow reference (``configs/cosmo.yaml`` and
``models/cosmoflow.py`` of the MLCommons HPC reference implementation): five convolution stages
of 32, 64, 128, 256, 512 channels with LeakyReLU and 2x max pooling, dense layers 128 and 64
with dropout 0.5, a 1.2 * tanh output (disttensor's :class:`~disttensor.nn.models.CosmoFlow`;
its convolutions are 3^3 where the reference's are 2^3), the mean squared error, SGD with
momentum 0.9 and no weight decay, base learning rate 0.001 for a global batch of 64 scaled
linearly to the run's global batch, 4 warm-up epochs from the base to the scaled rate, the
rate times 0.25 after epoch 32 and times 0.125 after epoch 64 (the reference's per-epoch
schedule, epochs counted from 0, strict ``boundary < epoch``), 128 epochs, and a stop at a
validation MAE of 0.124 (MLPerf's target), with MLPerf logging events where
``mlperf-logging`` is installed.  The data options are left alone: the reference's
``apply_log`` (``log(1 + x)`` of raw particle counts) is the data's business, not the
recipe's (normalized float samples may hold values below -1).

Nothing here communicates; :func:`check_watch_args` runs inside
:func:`~disttensor.train.arguments.check_args`'s collective block.
"""
from __future__ import annotations

import argparse
import math

from ..nn.lr_scheduler import CosmoFlowLR

__all__ = ["PRESETS", "apply_preset_defaults", "check_watch_args", "lr_scale", "peak_lr",
           "parse_decay", "EpochCosmoFlowLR", "MLPERF_TARGET_MAE"]

MLPERF_TARGET_MAE = 0.124

PRESETS = {
    "mlperf-hpc": dict(
        widths="32,64,128,256,512", dense="128,64", dropout=0.5,
        optimizer="sgd", momentum=0.9, weight_decay=0.0,
        lr=0.001, lr_scaling="linear", base_batch_size=64,
        schedule="cosmoflow", warmup_epochs=4, decay_epochs="32:0.25,64:0.125",
        epochs=128, target_mae=MLPERF_TARGET_MAE, mllog="auto",
    ),
}


def apply_preset_defaults(parser: argparse.ArgumentParser, argv) -> None:
    """Make the values of the ``--preset`` named in ``argv`` (if any) ``parser``'s defaults;
    an unknown name is left to the parser's own error."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--preset", default=None)
    known, _ = pre.parse_known_args([str(a) for a in argv])
    values = PRESETS.get(known.preset)
    if values:
        # only the options this command has (the data options may be absent)
        dests = {a.dest for a in parser._actions}
        parser.set_defaults(**{k: v for k, v in values.items() if k in dests})


def lr_scale(args) -> float:
    """The factor ``--lr-scaling`` applies to ``--lr``: 1, ``batch / base`` (linear) or its
    square root."""
    mode = getattr(args, "lr_scaling", "none")
    if mode == "none":
        return 1.0
    ratio = args.batch_size / args.base_batch_size
    return ratio if mode == "linear" else math.sqrt(ratio)


def peak_lr(args) -> float:
    """The optimizer's rate: ``--lr`` times :func:`lr_scale` (the reference's peak rate)."""
    return args.lr * lr_scale(args)


def parse_decay(text: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """``'32:0.25,64:0.125'`` -> ``((32, 64), (0.25, 0.125))``."""
    epochs, factors = [], []
    try:
        for part in text.split(","):
            if part.strip():
                e, f = part.split(":")
                epochs.append(int(e))
                factors.append(float(f))
    except ValueError:
        raise ValueError(f"--decay-epochs {text!r}: expected EPOCH:FACTOR pairs like "
                         "32:0.25,64:0.125") from None
    if not epochs or min(epochs) < 0 or len(set(epochs)) != len(epochs) or \
            min(factors) <= 0:
        raise ValueError(f"--decay-epochs {text!r}: distinct epochs >= 0 with positive "
                         "factors expected")
    return tuple(epochs), tuple(factors)


class EpochCosmoFlowLR(CosmoFlowLR):
    """:class:`~disttensor.nn.lr_scheduler.CosmoFlowLR` (the reference's per-epoch rule)
    stepped once per optimizer step: the rate of step ``s`` is the rule's rate at epoch
    ``s // steps_per_epoch``.  The optimizer's ``lr`` is the peak rate."""

    def __init__(self, optimizer, steps_per_epoch: int, **kw):
        self.steps_per_epoch = max(int(steps_per_epoch), 1)
        super().__init__(optimizer, **kw)

    def _lr(self, i, base_lr, epoch):
        return super()._lr(i, base_lr, epoch // self.steps_per_epoch)


def check_watch_args(args) -> None:
    """Reject bad watching/preset options (called inside ``check_args``' collective block)."""
    from .builders import SEGMENTATION_MODELS
    if args.preset is not None and args.model != "cosmoflow":
        raise ValueError(f"--preset {args.preset} is the CosmoFlow recipe; the model is "
                         f"{args.model}")
    if args.target_mae is not None:
        if args.model in SEGMENTATION_MODELS:
            raise ValueError(f"--target-mae needs a regression model (cosmoflow, resnet3d); "
                             f"{args.model} segments")
        if not args.target_mae > 0:
            raise ValueError(f"--target-mae must be positive, got {args.target_mae}")
    if args.base_batch_size < 1:
        raise ValueError(f"--base-batch-size must be >= 1, got {args.base_batch_size}")
    if args.decay_epochs is not None:
        parse_decay(args.decay_epochs)
        if args.schedule != "cosmoflow":
            raise ValueError(f"--decay-epochs is for --schedule cosmoflow, not "
                             f"{args.schedule}")
    if args.tensorboard is not None and args.no_tensorboard:
        raise ValueError("--tensorboard DIR and --no-tensorboard contradict each other")
    if args.tensorboard is not None:
        try:
            import tensorboardX  # noqa: F401
        except ImportError:
            raise ValueError("--tensorboard needs the tensorboardX package (pip install "
                             "'disttensor[tensorboard]')") from None
    if args.mllog is True:
        try:
            from mlperf_logging import mllog  # noqa: F401
        except ImportError:
            raise ValueError("--mllog needs the mlperf-logging package (pip install "
                             "'disttensor[mlperf]')") from None
