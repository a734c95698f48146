"""The command line of ``python -m disttensor.train``: its options and their validation.

:func:`parse_args` is the argparse parser (every flag, default and help text of the command);
:func:`check_args` rejects what can be rejected from the arguments alone (collective over
``comm``: the same error on every rank), before any data is read.  The small parsers turn
option strings into values (``--grid 2x2x1x1``, ``--partition 0:6,6:11``, ``--widths 8,16``).
"""
from __future__ import annotations

import argparse
import math
import sys

from ..core.comm import collective
from .presets import PRESETS, apply_preset_defaults, check_watch_args

__all__ = ["parse_args", "check_args", "parse_ints", "parse_grid", "parse_partition",
           "micro_batches"]


def parse_args(argv=None) -> argparse.Namespace:
    """The options of ``python -m disttensor.train`` (``argv``: default ``sys.argv[1:]``)."""
    p = argparse.ArgumentParser(prog="python -m disttensor.train",
                                description="Train CosmoFlow or a 3D U-Net on distributed, "
                                            "spatially partitioned samples.")
    p.add_argument("model", choices=("cosmoflow", "unet3d", "nnunet", "resnet3d"),
                   help="cosmoflow / resnet3d regress the targets (unitPar); unet3d / nnunet "
                   "segment (labels)")
    p.add_argument("--data", required=True, help="training samples (directory or file)")
    p.add_argument("--val", default=None, help="validation samples (default: the last "
                   "--val-fraction of the training files)")
    p.add_argument("--val-fraction", type=float, default=0.125)
    p.add_argument("--out", default="runs/train", help="metrics.csv and checkpoint.h5 go here")
    p.add_argument("--grid", default=None, help="SxDxHxW ranks, e.g. 2x2x1x1 (default: the "
                   "grid with the fastest step predicted by nn.perfmodel.plan_grid)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--batch-size", type=int, default=8, help="global batch (samples)")
    p.add_argument("--optimizer", choices=("sgd", "adam", "adamw", "rmsprop", "adagrad", "nadam",
                                           "radam"), default="adam")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--schedule", choices=("constant", "cosine", "step", "cosmoflow", "hybrid",
                                          "onecycle", "poly"),
                   default="constant", help="learning-rate schedule per step; hybrid: "
                   "GroPipe's mix of cosine and linear decay (--cosine-weight); onecycle: "
                   "OneCycleLR peaking at --lr (warm-up: --warmup-epochs, else 30%%); poly: "
                   "nnU-Net's (1 - step/total)**0.9")
    p.add_argument("--cosine-weight", type=float, default=0.5,
                   help="weight of the cosine part of --schedule hybrid (1: cosine, 0: linear)")
    p.add_argument("--warmup-epochs", type=int, default=0)
    p.add_argument("--clip-grad", type=float, default=None, help="clip by global norm")
    p.add_argument("--widths", default=None, help="CosmoFlow conv widths, e.g. 8,16,32")
    p.add_argument("--dense", default="128,64", help="CosmoFlow dense sizes")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--unet-widths", default=None,
                   help="U-Net encoder widths per level then bottom, e.g. 8,16:16,32:32,64")
    p.add_argument("--nnunet-features", default=None, help="nnU-Net stage widths, e.g. "
                   "8,16,32 (default 32,64,128,256,320)")
    p.add_argument("--no-deep-supervision", action="store_true",
                   help="nnunet: train on the full-resolution output only")
    p.add_argument("--resnet-block", choices=("basic", "bottleneck"), default="basic")
    p.add_argument("--resnet-layers", default="2,2,2,2", help="residual blocks per stage")
    p.add_argument("--resnet-widths", default="64,128,256,512", help="stage widths")
    p.add_argument("--bn-stats", choices=("global", "local"), default="global")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--amp", action="store_true", help="float16 activations with float32 "
                   "master weights and dynamic loss scaling (GPU only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--no-overlap", action="store_true",
                   help="all-reduce each layer's gradients as backward reaches it (blocking)")
    p.add_argument("--no-prefetch", action="store_true")
    p.add_argument("--stages", type=int, default=1, help="pipeline stages: the model is cut "
                   "by layers into this many stages, each on its own ranks (a --grid per "
                   "stage; the job runs on stages x grid ranks); CosmoFlow only")
    p.add_argument("--micro-batches", type=int, default=None, help="micro-batches per global "
                   "batch in the pipeline (default: --stages)")
    p.add_argument("--pipeline-schedule", choices=("gpipe", "1f1b"), default="1f1b")
    p.add_argument("--partition", default="params", help="pipeline stages: 'params' "
                   "(balanced parameter counts), 'auto' (measured layer times, dynamic "
                   "programming) or layer ranges like 0:6,6:11")
    p.add_argument("--update-in-backward", action="store_true", help="update each parameter "
                   "as soon as its gradient is final (after its all-reduce bucket), freeing the "
                   "gradient; not with --clip-grad or --amp")
    p.add_argument("--memory-budget", type=float, default=None, help="fraction (0, 1] of the "
                   "unconstrained saved-activation peak: a planner chooses per layer to keep, "
                   "offload or recompute activations to fit it (profiled on the first batch)")
    p.add_argument("--prune-to", type=float, default=None, help="prune to this sparsity "
                   "(fraction in [0, 1]) of --prune-layers' weights by L1 magnitude (nn.prune)")
    p.add_argument("--prune-schedule", choices=("gradual", "oneshot"), default="gradual",
                   help="gradual: Zhu & Gupta's cubic schedule; oneshot: all at --prune-start")
    p.add_argument("--prune-layers", choices=("dense", "conv", "all"), default="dense")
    p.add_argument("--prune-scope", choices=("global", "layer"), default="global",
                   help="rank the weights of all --prune-layers together, or each layer alone")
    p.add_argument("--prune-start", type=int, default=0, help="first pruning step")
    p.add_argument("--prune-end", type=int, default=None, help="last pruning step (default: "
                   "3/4 of the run's steps)")
    p.add_argument("--prune-frequency", type=int, default=10, help="steps between prunings")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.h5")
    p.add_argument("--no-checkpoint", action="store_true")
    p.add_argument("--quiet", action="store_true")
    # watching training and the MLPerf HPC recipe (train/watch.py, train/presets.py)
    p.add_argument("--tensorboard", default=None, metavar="DIR", help="TensorBoard event "
                   "files here (default OUT/tensorboard when tensorboardX is installed)")
    p.add_argument("--no-tensorboard", action="store_true", help="write no event files")
    p.add_argument("--no-plots", action="store_true", help="no OUT/curves.png at the end")
    p.add_argument("--preset", choices=tuple(PRESETS), default=None, help="mlperf-hpc: the "
                   "MLPerf HPC CosmoFlow reference recipe (model, SGD momentum 0.9, warm-up "
                   "and decay, linear batch scaling, target MAE 0.124); explicit options "
                   "override it")
    p.add_argument("--lr-scaling", choices=("none", "linear", "sqrt"), default="none",
                   help="scale --lr by the global batch over --base-batch-size (linear or "
                   "sqrt); the warm-up of --schedule cosmoflow starts from the unscaled --lr")
    p.add_argument("--base-batch-size", type=int, default=64,
                   help="the global batch --lr is meant for (with --lr-scaling)")
    p.add_argument("--decay-epochs", default=None, metavar="E:F,...", help="--schedule "
                   "cosmoflow per epoch as the MLPerf reference: the peak rate times F after "
                   "epoch E, e.g. 32:0.25,64:0.125 (default: per step, decays at 1/2 and 3/4)")
    p.add_argument("--target-mae", type=float, default=None, help="stop when the validation "
                   "MAE is <= this (time to train in the summary and metrics.csv)")
    p.add_argument("--mllog", action="store_true", help="MLPerf logging events to "
                   "OUT/mlperf.log (needs mlperf-logging; on with --preset mlperf-hpc where "
                   "installed)")
    # read-time data pipeline (disttensor.io.SampleDataset; docs/data.md)
    p.add_argument("--channels-last", action="store_true", help="samples stored D,H,W,C (the "
                   "raw CosmoFlow files' 'full', e.g. the synthetic --layout raw)")
    p.add_argument("--x-dtype", default=None, help="convert the samples at read time (e.g. "
                   "int16 counts to float32; default: --dtype when the stored samples are "
                   "integers and --log1p/--divide-by-mean ask for floats, else as stored)")
    p.add_argument("--log1p", action="store_true", help="log(1 + x) of every sample at read "
                   "time")
    p.add_argument("--divide-by-mean", action="store_true", help="divide every sample by its "
                   "mean at read time (MLPerf's alternative to --log1p)")
    p.add_argument("--crop", default=None, metavar="D,H,W", help="train on random crops of "
                   "this size (one int: a cube), read as hyperslabs; validation on centred "
                   "crops")
    p.add_argument("--augment", choices=("none", "flip", "permute", "all"), default="none",
                   help="random flips per spatial axis and/or axis permutations of the "
                   "training samples (all: both, as MLPerf HPC CosmoFlow)")
    p.add_argument("--x-shift", type=float, default=None, help="subtract this from every "
                   "sample value after --log1p/--divide-by-mean (e.g. centre log counts)")
    p.add_argument("--x-scale", type=float, default=None, help="then divide by this")
    p.add_argument("--profile", action="store_true", help="profile --profile-steps steady "
                   "steps after --profile-warmup steps: OUT/profile/summary.txt (time per op, "
                   "pass and category) and Chrome traces OUT/profile/trace-rank*.json")
    p.add_argument("--profile-steps", type=int, default=5, help="steps to profile (5)")
    p.add_argument("--profile-warmup", type=int, default=2, help="steps before profiling (2)")
    apply_preset_defaults(p, sys.argv[1:] if argv is None else argv)
    return p.parse_args(argv)



def parse_ints(text: str) -> tuple[int, ...]:
    """``'8,16,32'`` -> ``(8, 16, 32)`` (empty items skipped)."""
    return tuple(int(t) for t in text.split(",") if t.strip())


def parse_partition(text: str):
    """``--partition``: 'params', 'auto' or ``a:b,b:c,...`` layer ranges."""
    if text in ("params", "auto"):
        return text
    try:
        return [tuple(int(v) for v in part.split(":")) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--partition {text!r}: expected 'params', 'auto' or layer ranges "
                         "like 0:6,6:11") from None


def parse_grid(text: str) -> tuple[int, ...]:
    """``--grid``: ``'SxDxHxW'`` -> four positive ints ``(sample, depth, height, width)``."""
    try:
        dims = tuple(int(t) for t in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--grid {text!r}: expected four integers like 2x2x1x1") from None
    if len(dims) != 4 or min(dims) < 1:
        raise ValueError(f"--grid {text!r}: expected four positive integers SxDxHxW")
    return dims


def micro_batches(args) -> int:
    """Micro-batches per global batch in the pipeline (``--micro-batches``, default
    ``--stages``)."""
    return args.micro_batches if args.micro_batches is not None else args.stages


def check_args(args, comm):
    """Validate what can be validated from the arguments alone (already agreed across the
    ranks by :func:`disttensor.train.run`); collective over ``comm``."""
    with collective(comm):
        if args.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
        if args.amp and args.device != "cuda":
            raise ValueError("--amp (float16 activations) needs --device cuda: the CPU "
                             "kernels compute in float32 or float64")
        if args.epochs < 1:
            raise ValueError(f"--epochs must be >= 1, got {args.epochs}")
        if args.stages < 1:
            raise ValueError(f"--stages must be >= 1, got {args.stages}")
        if comm.size % args.stages:
            raise ValueError(f"--stages {args.stages} does not divide the {comm.size} ranks")
        if args.micro_batches is not None and args.micro_batches < 1:
            raise ValueError(f"--micro-batches must be >= 1, got {args.micro_batches}")
        if args.stages > 1:
            if args.model != "cosmoflow":
                raise ValueError("--stages > 1 cuts a sequential model into stages; the U-Net's "
                                 "skip connections make it one layer: use cosmoflow")
            for flag, on in (("--clip-grad", args.clip_grad), ("--amp", args.amp),
                             ("--memory-budget", args.memory_budget)):
                if on:
                    raise ValueError(f"{flag} is not supported with --stages > 1 (it needs "
                                     "every stage's gradients or activations at once)")
            parse_partition(args.partition)
        if args.memory_budget is not None and not 0 < args.memory_budget <= 1:
            raise ValueError(f"--memory-budget is a fraction in (0, 1], got "
                             f"{args.memory_budget}")
        if args.update_in_backward and (args.clip_grad or args.amp):
            raise ValueError(f"--update-in-backward updates each parameter before the others' "
                             f"gradients exist, so it cannot run with "
                             f"{'--clip-grad' if args.clip_grad else '--amp'} (which needs "
                             "every gradient first)")
        if args.profile_steps < 1 or args.profile_warmup < 0:
            raise ValueError(f"--profile-steps must be >= 1 and --profile-warmup >= 0, got "
                             f"{args.profile_steps} and {args.profile_warmup}")
        if args.prune_to is not None and not 0 <= args.prune_to <= 1:
            raise ValueError(f"--prune-to is a sparsity in [0, 1], got {args.prune_to}")
        check_watch_args(args)
        per_stage = comm.size // args.stages
        if args.grid is not None:
            dims = parse_grid(args.grid)
            if math.prod(dims) != per_stage:
                raise ValueError(f"--grid {args.grid} has {math.prod(dims)} ranks but the job "
                                 f"runs on {per_stage}" + (f" per stage ({comm.size} ranks / "
                                 f"{args.stages} stages)" if args.stages > 1 else ""))
            if args.batch_size % dims[0]:
                raise ValueError(f"the global batch {args.batch_size} is not divisible by the "
                                 f"{dims[0]} ranks of the grid's sample axis")
            chunks = micro_batches(args)
            if args.stages > 1 and args.batch_size % (dims[0] * chunks):
                raise ValueError(f"the global batch {args.batch_size} does not split into "
                                 f"{chunks} micro-batches on each of the {dims[0]} ranks of "
                                 "the sample axis")
