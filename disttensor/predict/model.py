"""The trained network, rebuilt from a training run's checkpoint.

A checkpoint of ``python -m disttensor.train`` (:mod:`disttensor.train.checkpoints`) holds the
parameters and buffers under ``model/`` and the run's configuration as JSON: the model name,
the sample shape ``(C, D, H, W)``, every parameter's name and shape, the dtype.  The number of
targets / classes is the length of the last parameter (the output layer's bias); the widths
and other model options come from the command line (the training run's flags) and
:func:`disttensor.train.build_model` builds the network from them.  Before any weight is
loaded the model name and the parameter list are compared with the checkpoint's: another
model or another configuration (widths, levels, classes) raises a ``ValueError`` naming both,
on every rank.

:func:`load_trained` and :func:`model_config` are what :mod:`disttensor.predict` uses;
:func:`save_model_checkpoint` writes a checkpoint of a bare model in the training layout
(tests, models trained by a custom loop).  All three are collective over the grid's ranks.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from .. import nn
from ..core.comm import collective
from ..io import load_checkpoint, save_checkpoint
from ..nn.parallel import check_replicas
from ..train.builders import SEGMENTATION_MODELS, build_model
from .arguments import training_args

__all__ = ["Trained", "load_trained", "model_config", "save_model_checkpoint", "downsampling"]


@dataclass
class Trained:
    """A network in eval mode and what the checkpoint says about its training samples."""
    model: nn.Module
    name: str
    sample_shape: tuple      # (C, D, H, W) of the training samples (the sliding window)
    outputs: int             # targets (regression) or classes (segmentation)
    dtype: str


def model_config(name: str, sample_shape, model, dtype: str, **extra) -> str:
    """The configuration JSON of a training checkpoint (the keys
    :func:`disttensor.train.loop.train_epochs` records)."""
    return json.dumps({"model": name, "sample_shape": list(sample_shape),
                       "parameters": [[n, list(p.shape)] for n, p in model.named_parameters()],
                       "dtype": dtype, **extra})


def save_model_checkpoint(path, name: str, model, sample_shape, dtype: str, grid) -> None:
    """Write ``model``'s state with its configuration as a training checkpoint that
    :func:`load_trained` reads (collective over ``grid``; atomic)."""
    state = model.state_dict()
    host = {f"model/{k}": (v.get() if hasattr(v, "get") else v) for k, v in state.items()}
    save_checkpoint(path, host=host, grid=grid, scalars={
        "config": model_config(name, sample_shape, model, dtype, optimizer="none")})


def _first_difference(want, have) -> str:
    for i in range(max(len(want), len(have))):
        a = want[i] if i < len(want) else None
        b = have[i] if i < len(have) else None
        if a != b:
            fmt = (lambda e: "nothing" if e is None else f"{e[0]} of shape {tuple(e[1])}")
            return f"parameter {i}: the checkpoint has {fmt(a)}, this model {fmt(b)}"
    return "none"


def load_trained(args, model_argv, grid) -> Trained:
    """The network of ``args.model`` with the model options ``model_argv`` and the weights of
    ``args.checkpoint``, in eval mode, on ``args.device`` (collective over ``grid``).  The
    segmentation networks accept any spatial size divisible by their downsampling factor."""
    comm = grid.cart
    _, host, scalars = load_checkpoint(args.checkpoint, grid=grid)
    with collective(comm):
        ck = args.checkpoint
        if "config" not in scalars:
            raise ValueError(f"--checkpoint {ck!r} holds no training configuration: it was "
                             "not written by python -m disttensor.train")
        cfg = json.loads(scalars["config"])
        if cfg.get("stages", 1) != 1:
            raise ValueError(f"--checkpoint {ck!r} is a pipeline run's ({cfg['stages']} "
                             "stages); its full model is stored, but predict rebuilds "
                             "single-stage models only")
        if cfg["model"] != args.model:
            raise ValueError(f"--checkpoint {ck!r} was written by a {cfg['model']!r} model, "
                             f"but predict was asked for {args.model!r}")
        want = [[n, list(s)] for n, s in cfg["parameters"]]
        sample_shape = tuple(int(v) for v in cfg["sample_shape"])
        outputs = int(want[-1][1][0])  # the output layer's bias: targets or classes
        targs = training_args(args, model_argv, cfg["dtype"])
        if args.model in SEGMENTATION_MODELS:
            targs.classes = outputs
        else:
            targs.outputs = outputs
        model = build_model(targs, sample_shape, nn.init.manual_seed(targs.seed))
        have = [[n, list(p.shape)] for n, p in model.named_parameters()]
        if have != want:
            flags = " ".join(model_argv) or "the default model options"
            raise ValueError(
                f"--checkpoint {ck!r} was written by a {cfg['model']} of another "
                f"configuration than this {args.model} ({flags}): "
                f"{len(want)} vs {len(have)} parameters; first difference: "
                f"{_first_difference(want, have)}.  Pass the training run's model options "
                f"(--widths, --unet-widths, --nnunet-features, --resnet-*, --dense).")
        model.load_state_dict({k[len("model/"):]: v for k, v in host.items()
                               if k.startswith("model/")})
        if args.model in SEGMENTATION_MODELS:
            model.input_size = None  # fully convolutional: any divisible size
    check_replicas(model, comm, f"model loaded from {os.fspath(args.checkpoint)!r}")
    model.eval()
    return Trained(model, args.model, sample_shape, outputs, cfg["dtype"])


def downsampling(model) -> int:
    """The total downsampling factor of a segmentation network (every spatial extent of its
    input must be a multiple of it)."""
    levels = model.levels if isinstance(model, nn.models.UNet3D) else model.levels - 1
    return 2 ** levels
