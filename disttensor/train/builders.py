"""What a training run is made of, built from the command line's arguments: the model
(CosmoFlow, the 3D U-Net, the nnU-Net-style U-Net or the 3D ResNet), its loss, the optimizer and
the per-step learning-rate schedule.

Nothing here communicates; the model's parameters are initialized from the run's seed, the
same on every rank.
"""
from __future__ import annotations

import math

from .. import nn
from ..nn.models import CosmoFlow, NNUNet3D, ResNet3D, UNet3D
from .arguments import parse_ints
from .presets import EpochCosmoFlowLR, lr_scale, parse_decay, peak_lr

__all__ = ["SEGMENTATION_MODELS", "build_model", "build_loss", "build_optimizer",
           "build_schedule"]

SEGMENTATION_MODELS = ("unet3d", "nnunet")  # trained on labels; the others on targets


def build_model(args, input_shape, rng) -> nn.Module:
    """The model of ``args`` for samples of ``input_shape`` ``(C, D, H, W)``."""
    kw = dict(dtype=args.dtype, device=args.device, rng=rng)
    if args.model == "cosmoflow":
        widths = parse_ints(args.widths) if args.widths else (32, 64, 128, 256, 512)
        return CosmoFlow(input_size=input_shape[1:], in_channels=input_shape[0],
                         widths=widths, dense=parse_ints(args.dense), outputs=args.outputs,
                         dropout=args.dropout, seed=args.seed, **kw)
    if args.model == "resnet3d":
        return ResNet3D(block=args.resnet_block, layers=parse_ints(args.resnet_layers),
                        widths=parse_ints(args.resnet_widths), in_channels=input_shape[0],
                        outputs=args.outputs, bn_stats=args.bn_stats,
                        input_size=input_shape[1:], **kw)
    if args.model == "nnunet":
        features = parse_ints(args.nnunet_features) if args.nnunet_features else \
            (32, 64, 128, 256, 320)
        return NNUNet3D(in_channels=input_shape[0], classes=args.classes, features=features,
                        deep_supervision=not args.no_deep_supervision,
                        input_size=input_shape[1:], **kw)
    if args.unet_widths:
        levels = [parse_ints(t) for t in args.unet_widths.split(":")]
        encoder, bottom = levels[:-1], levels[-1]
    else:
        encoder, bottom = ((32, 64), (64, 128), (128, 256)), (256, 512)
    return UNet3D(in_channels=input_shape[0], classes=args.classes, encoder=encoder,
                  bottom=bottom, bn_stats=args.bn_stats, input_size=input_shape[1:], **kw)


def build_loss(args):
    """The training loss of ``args.model``: the mean squared error for the regression models,
    cross-entropy for the U-Net, Dice + cross-entropy over the deep-supervision outputs for
    the nnU-Net (nnU-Net's loss)."""
    if args.model == "nnunet":
        return nn.models.DeepSupervisionLoss()
    return nn.functional.cross_entropy if args.model in SEGMENTATION_MODELS else \
        nn.functional.mse_loss


_OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSprop", "adagrad": "Adagrad",
               "nadam": "NAdam", "radam": "RAdam"}


def build_optimizer(args, params):
    """``--optimizer`` (SGD with momentum, or Adam, AdamW, RMSprop, Adagrad, NAdam, RAdam with
    PyTorch's defaults) over ``params``, at ``--lr`` scaled by ``--lr-scaling``."""
    lr = peak_lr(args)  # --lr scaled by the global batch (--lr-scaling)
    if args.optimizer == "sgd":
        return nn.optim.SGD(params, lr=lr, momentum=args.momentum,
                            weight_decay=args.weight_decay)
    cls = getattr(nn.optim, _OPTIMIZERS[args.optimizer])
    return cls(params, lr=lr, weight_decay=args.weight_decay)


def build_schedule(args, opt, steps_per_epoch: int):
    """A per-step schedule (epochs are converted to steps; ``cosmoflow`` with
    ``--decay-epochs``: the MLPerf reference's per-epoch rule, stepped per step)."""
    warm = args.warmup_epochs * steps_per_epoch
    total = max(args.epochs * steps_per_epoch, 1)
    S = nn.lr_scheduler
    if args.schedule == "hybrid":
        return S.HybridCosineLinearLR(opt, total_steps=total, warmup_steps=min(warm, total - 1),
                                      cosine_weight=args.cosine_weight)
    if args.schedule == "cosmoflow" and args.decay_epochs:
        # the MLPerf reference's per-epoch rule: warm-up from the unscaled --lr to the peak
        bounds, factors = parse_decay(args.decay_epochs)
        return EpochCosmoFlowLR(opt, steps_per_epoch, warmup_epochs=args.warmup_epochs,
                                warmup_factor=lr_scale(args), boundaries=bounds,
                                factors=factors)
    if args.schedule == "cosmoflow":
        return S.CosmoFlowLR(opt, warmup_epochs=max(args.warmup_epochs, 1) * steps_per_epoch,
                             warmup_factor=lr_scale(args),
                             boundaries=(total // 2, 3 * total // 4))
    if args.schedule == "onecycle":
        pct = min(warm / total, 1.0) if warm else 0.3
        return S.OneCycleLR(opt, max_lr=args.lr, total_steps=total, pct_start=float(pct),
                            cycle_momentum=args.optimizer in ("sgd", "adam", "adamw", "nadam",
                                                              "radam"))
    if args.schedule == "poly":
        return S.PolynomialLR(opt, total_iters=total, power=0.9)
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
