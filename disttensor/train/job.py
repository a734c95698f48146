"""One training job, from the command line to the :class:`~disttensor.train.loop.TrainResult`.

:func:`run` (collective over ``comm``) agrees the argument list across the ranks (before
parsing: an option that made argparse exit on one rank only would leave the others waiting),
parses and checks it, splits the files into training and validation, probes the sample shape,
chooses the grid (``--grid``, else the performance model's fastest), opens the datasets on it,
builds the model and hands over to :func:`~disttensor.train.loop.train_epochs`.  :func:`main`
is ``python -m disttensor.train``.
"""
from __future__ import annotations

import sys

from mpi4py import MPI

from .. import nn
from ..core.agreement import agree
from ..core.comm import collective
from ..core.grid import ProcessGrid
from ..io import SampleDataset
from .arguments import check_args, micro_batches, parse_args, parse_grid
from .builders import SEGMENTATION_MODELS, build_model
from .data import dataset_options, num_classes, split_files
from .grid_choice import choose_grid, plan_grid
from .loop import TrainResult, train_epochs
from .metrics import Progress

__all__ = ["run", "main"]


def run(argv=None, comm=None, on_step=None) -> TrainResult:
    """Parse ``argv`` and train (collective over ``comm``, default ``COMM_WORLD``).
    ``on_step(step)``, if given, runs on every rank after each training step."""
    comm = MPI.COMM_WORLD if comm is None else comm
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    # agreed before parsing: an option that makes argparse exit on one rank only would
    # leave the others waiting
    agree(comm, "disttensor.train", argv=argv)
    args = parse_args(argv)
    check_args(args, comm)
    rank0 = comm.rank == 0
    progress = Progress(rank0 and not args.quiet)
    with collective(comm):
        train_src, val_src = split_files(args.data, args.val, args.val_fraction)
    segmentation = args.model in SEGMENTATION_MODELS
    yname = "labels" if segmentation else "unitPar"

    # probe the data on a provisional grid to learn the sample shape
    probe = SampleDataset(train_src, ProcessGrid((comm.size,), comm=comm), split=(0,),
                          batch_size=1, prefetch=False, y_dataset=yname,
                          channels_last=args.channels_last)
    try:  # the read-time pipeline (crops, transforms) checked now, on the probe's grid
        train_kw = dataset_options(args, probe.stored_dtype, training=True)
        val_kw = dataset_options(args, probe.stored_dtype, training=False)
        probe.close()
        probe = SampleDataset(train_src, ProcessGrid((comm.size,), comm=comm), split=(0,),
                              batch_size=1, prefetch=False, y_dataset=yname, **train_kw)
    except BaseException:
        probe.close()
        raise
    sample_shape, n_train = probe.sample_shape, probe.num_samples
    args.outputs = probe.num_targets
    per_stage = comm.size // args.stages
    try:
        if args.grid:
            dims = parse_grid(args.grid)
        elif args.stages == 1:
            dims = plan_grid(args, comm, sample_shape, probe, segmentation, progress,
                             comm.size, args.batch_size)
        elif args.batch_size % micro_batches(args) == 0:
            dims = plan_grid(args, comm, sample_shape, probe, segmentation, progress,
                             per_stage, args.batch_size // micro_batches(args))
        else:
            dims = choose_grid(per_stage, args.batch_size, sample_shape[1:])
    finally:
        probe.close()
    full = None
    if args.stages > 1:
        # (groups, stages, d, h, w); the ranks of one stage hold a (sample, d, h, w) grid
        full = ProcessGrid((dims[0], args.stages) + tuple(dims[1:]), comm=comm)
        grid = ProcessGrid(dims, comm=full.sub_comm([0, 2, 3, 4]))
    else:
        grid = ProcessGrid(dims, comm=comm)
    with collective(comm):
        if args.batch_size > n_train:
            raise ValueError(f"the global batch {args.batch_size} is larger than the "
                             f"{n_train} training samples")
    split = (0, None, 1, 2, 3)
    prefetch = not args.no_prefetch
    train_ds = SampleDataset(train_src, grid, split, batch_size=args.batch_size, shuffle=True,
                             seed=args.seed, prefetch=prefetch, drop_last=True,
                             y_dataset=yname, device=args.device, **train_kw)
    val_ds = SampleDataset(val_src, grid, split, batch_size=args.batch_size, shuffle=False,
                           seed=args.seed, prefetch=prefetch, y_dataset=yname,
                           device=args.device, **val_kw)
    try:
        if segmentation:
            args.classes = num_classes(train_ds, comm)
        with collective(comm):
            if val_ds.sample_shape != sample_shape:
                raise ValueError(f"validation samples have shape {val_ds.sample_shape}, the "
                                 f"training samples {sample_shape}")
            model = build_model(args, sample_shape, nn.init.manual_seed(args.seed))
        with nn.amp.autocast(enabled=args.amp):  # float16 activations, float32 weights
            return train_epochs(args, comm, grid, train_ds, val_ds, model, progress,
                                segmentation, yname, sample_shape, on_step, full)
    finally:
        train_ds.close()
        val_ds.close()


def main(argv=None) -> int:
    """``python -m disttensor.train``: exit status 0 when the run trained (or was stopped
    by a signal), else 1."""
    result = run(argv)
    return 0 if result.epochs_done or result.interrupted or result.steps else 1
