"""What a training run is made of, built from the command line's arguments: the model
(CosmoFlow or the 3D U-Net), the optimizer and the per-step learning-rate schedule.

Nothing here communicates; the model's parameters are initialized from the run's seed, the
same on every rank.
"""
from __future__ import annotations

import math

from .. import nn
from ..nn.models import CosmoFlow, UNet3D
from .arguments import parse_ints

__all__ = ["build_model", "build_optimizer", "build_schedule"]


def build_model(args, input_shape, rng) -> nn.Module:
    """The model of ``args`` for samples of ``input_shape`` ``(C, D, H, W)``."""
    kw = dict(dtype=args.dtype, device=args.device, rng=rng)
    if args.model == "cosmoflow":
        widths = parse_ints(args.widths) if args.widths else (32, 64, 128, 256, 512)
        return CosmoFlow(input_size=input_shape[1:], in_channels=input_shape[0],
                         widths=widths, dense=parse_ints(args.dense), outputs=args.outputs,
                         dropout=args.dropout, seed=args.seed, **kw)
    if args.unet_widths:
        levels = [parse_ints(t) for t in args.unet_widths.split(":")]
        encoder, bottom = levels[:-1], levels[-1]
    else:
        encoder, bottom = ((32, 64), (64, 128), (128, 256)), (256, 512)
    return UNet3D(in_channels=input_shape[0], classes=args.classes, encoder=encoder,
                  bottom=bottom, bn_stats=args.bn_stats, input_size=input_shape[1:], **kw)


def build_optimizer(args, params):
    """``--optimizer`` (SGD with momentum, Adam or AdamW) over ``params``."""
    if args.optimizer == "sgd":
        return nn.optim.SGD(params, lr=args.lr, momentum=args.momentum,
                            weight_decay=args.weight_decay)
    cls = nn.optim.Adam if args.optimizer == "adam" else nn.optim.AdamW
    return cls(params, lr=args.lr, weight_decay=args.weight_decay)


def build_schedule(args, opt, steps_per_epoch: int):
    """A per-step schedule (epochs are converted to steps)."""
    warm = args.warmup_epochs * steps_per_epoch
    total = max(args.epochs * steps_per_epoch, 1)
    S = nn.lr_scheduler
    if args.schedule == "hybrid":
        return S.HybridCosineLinearLR(opt, total_steps=total, warmup_steps=min(warm, total - 1),
                                      cosine_weight=args.cosine_weight)
    if args.schedule == "cosmoflow":
        return S.CosmoFlowLR(opt, warmup_epochs=max(args.warmup_epochs, 1) * steps_per_epoch,
                             boundaries=(total // 2, 3 * total // 4))
    if args.schedule == "cosine":
        def f(step):
            if step < warm:
                return (step + 1) / warm
            return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(total - warm, 1)))
    elif args.schedule == "step":
        def f(step):
            if step < warm:
                return (step + 1) / warm
            return 0.1 ** (step // max(total // 3, 1))
    else:
        def f(step):
            return (step + 1) / warm if step < warm else 1.0
    return S.LambdaLR(opt, f)
