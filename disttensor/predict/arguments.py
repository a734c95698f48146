"""The command line of ``python -m disttensor.predict``: its own options, and the model
options it shares with ``python -m disttensor.train``.

:func:`parse_args` returns ``(args, model_argv)``: ``args`` holds the inference options
(checkpoint, data, outputs, mode, grid, device, batch size, dataset names); every other
option (``--widths``, ``--unet-widths``, ``--nnunet-features``, ``--resnet-*``, ``--dense``,
``--bn-stats``, ...) is a model option of the training command line and is handed to
:func:`disttensor.train.parse_args` by :func:`training_args` to build the same network
(:func:`disttensor.train.build_model`).  :func:`check_args` rejects what the arguments alone
show (collective: the same error on every rank).
"""
from __future__ import annotations

import argparse
import math
import os

from ..core.comm import collective
from ..train.arguments import parse_args as train_parse_args
from ..train.arguments import parse_grid
from ..train.builders import SEGMENTATION_MODELS

__all__ = ["parse_args", "check_args", "training_args", "output_kind", "MODELS"]

MODELS = ("cosmoflow", "unet3d", "nnunet", "resnet3d")
_KINDS = {".csv": "csv", ".h5": "hdf5", ".hdf5": "hdf5", ".hdf": "hdf5", ".zarr": "zarr"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m disttensor.predict",
        description="Apply a trained model to data: CosmoFlow / ResNet predict the targets of "
        "every sample; the U-Nets segment volumes of any size and write the label volume in "
        "parallel.  Model options (--widths, --unet-widths, --nnunet-features, --resnet-*, "
        "--dense, --bn-stats) are those of python -m disttensor.train and must be the "
        "training run's.")
    p.add_argument("model", choices=MODELS)
    p.add_argument("--checkpoint", required=True, help="the training run's checkpoint.h5")
    p.add_argument("--data", required=True, help="regression: samples (directory or file, as "
                   "for training); segmentation: one HDF5 file holding a (C, D, H, W) or "
                   "(D, H, W) volume")
    p.add_argument("--out", required=True, nargs="+", help="output file(s), by extension: "
                   ".csv / .h5 for predictions; .h5 / .zarr for a label volume")
    p.add_argument("--mode", choices=("whole", "sliding"), default="whole",
                   help="segmentation: one spatially parallel pass over the whole volume "
                   "(padded to the network's downsampling factor), or nnU-Net's sliding "
                   "windows of the training patch size with Gaussian blending")
    p.add_argument("--step", type=float, default=0.5, help="sliding windows: step as a "
                   "fraction of the window (nnU-Net: 0.5)")
    p.add_argument("--sigma-scale", type=float, default=0.125, help="sliding windows: the "
                   "Gaussian's sigma as a fraction of the window (nnU-Net: 1/8)")
    p.add_argument("--grid", default=None, help="SxDxHxW ranks (default: data parallel for "
                   "regression; 1xDxHx1 spatial cuts for segmentation)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--batch-size", type=int, default=8, help="regression: samples per "
                   "forward pass (global)")
    p.add_argument("--x-dataset", default="full", help="the input dataset in the files")
    p.add_argument("--y-dataset", default=None, help="the targets (regression, default "
                   "unitPar): compared with the predictions when the files hold them")
    p.add_argument("--labels-dataset", default="labels", help="segmentation: the dataset "
                   "name of the written label volume")
    p.add_argument("--quiet", action="store_true")
    return p


def parse_args(argv):
    """``(args, model_argv)``: the inference options and the remaining (model) options."""
    return _parser().parse_known_args(argv)


def training_args(args, model_argv, dtype: str):
    """The training command line's namespace for ``args.model`` with the model options
    ``model_argv`` (what :func:`disttensor.train.build_model` reads), in ``dtype``."""
    t = train_parse_args([args.model, "--data", args.data, *model_argv])
    t.dtype, t.device = dtype, args.device
    return t


def output_kind(path: str) -> str:
    """``'csv'``, ``'hdf5'`` or ``'zarr'`` by the extension of ``path``."""
    ext = os.path.splitext(path.rstrip("/"))[1].lower()
    if ext not in _KINDS:
        raise ValueError(f"--out {path!r}: unknown extension {ext!r} (one of "
                         f"{', '.join(_KINDS)})")
    return _KINDS[ext]


def check_args(args, comm):
    """Reject bad arguments on every rank (collective over ``comm``); returns the grid dims
    given with ``--grid`` (``None`` without)."""
    with collective(comm):
        segmentation = args.model in SEGMENTATION_MODELS
        allowed = ("hdf5", "zarr") if segmentation else ("csv", "hdf5")
        for path in args.out:
            kind = output_kind(path)
            if kind not in allowed:
                raise ValueError(f"--out {path!r}: {args.model} writes "
                                 f"{' or '.join(allowed)} files, not {kind}")
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent):
                raise FileNotFoundError(f"--out {path!r}: directory {parent!r} does not exist")
        if args.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
        if not 0 < args.step <= 1:
            raise ValueError(f"--step is a fraction of the window in (0, 1], got {args.step}")
        if args.sigma_scale <= 0:
            raise ValueError(f"--sigma-scale must be > 0, got {args.sigma_scale}")
        if not os.path.exists(args.checkpoint):
            raise FileNotFoundError(f"--checkpoint {args.checkpoint!r} does not exist")
        if not os.path.exists(args.data):
            raise FileNotFoundError(f"--data {args.data!r} does not exist")
        dims = None
        if args.grid is not None:
            dims = parse_grid(args.grid)
            if math.prod(dims) != comm.size:
                raise ValueError(f"--grid {args.grid} has {math.prod(dims)} ranks but the job "
                                 f"runs on {comm.size}")
            if segmentation and dims[0] != 1:
                raise ValueError(f"--grid {args.grid}: a segmentation volume is one sample, "
                                 "so the sample axis must have 1 rank (1xDxHxW)")
    return dims
