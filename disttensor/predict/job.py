"""One inference job: :func:`run` (collective over ``comm``) agrees the argument list across
the ranks, checks it, rebuilds the trained model from the checkpoint
(:func:`~disttensor.predict.model.load_trained`), chooses the grid and hands over to the
regression or segmentation path; :func:`main` is ``python -m disttensor.predict``.

Outputs are written only after the whole computation succeeded, each atomically (a temporary
file or directory renamed over the target), so any error leaves earlier outputs intact.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from mpi4py import MPI

from ..core.agreement import agree
from ..core.grid import ProcessGrid
from ..io import write_hdf5
from ..train.builders import SEGMENTATION_MODELS
from ..train.grid_choice import choose_grid
from ..train.metrics import Progress
from .arguments import check_args, output_kind, parse_args
from .model import load_trained
from .regression import Predictions, predict_targets, write_predictions
from .segment import segment

__all__ = ["PredictResult", "run", "main"]


@dataclass
class PredictResult:
    """What a job produced (the same on every rank but ``labels``, a DistArray)."""
    model: str
    grid: tuple
    seconds: float
    predictions: Predictions | None = None   # regression
    labels: object = None                     # segmentation: the (D, H, W) DistArray


def _write_labels(labels, path, kind, args):
    attrs = {"model": args.model, "mode": args.mode}
    if kind == "zarr":
        from ..io import write_zarr
        write_zarr(labels, path, args.labels_dataset, attrs=attrs)
    else:
        write_hdf5(labels, path, args.labels_dataset, mode="w", attrs=attrs)


def run(argv=None, comm=None) -> PredictResult:
    """Parse ``argv``, predict and write the outputs (collective over ``comm``, default
    ``COMM_WORLD``)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    agree(comm, "disttensor.predict", argv=argv)
    args, model_argv = parse_args(argv)
    dims = check_args(args, comm)
    progress = Progress(comm.rank == 0 and not args.quiet)
    segmentation = args.model in SEGMENTATION_MODELS
    t0 = time.perf_counter()
    trained = load_trained(args, model_argv, ProcessGrid((comm.size,), comm=comm))
    if dims is None:
        spatial = trained.sample_shape[1:]
        dims = (1,) + choose_grid(comm.size, 1, spatial)[1:] if segmentation else \
            choose_grid(comm.size, args.batch_size, spatial)
    grid = ProcessGrid(dims, comm=comm)
    result = PredictResult(args.model, dims, 0.0)
    if segmentation:
        labels = segment(trained, args, grid)
        for path in args.out:
            _write_labels(labels, path, output_kind(path), args)
        result.labels = labels
        what = f"labels {labels.shape} ({args.mode})"
    else:
        p = predict_targets(trained.model, args.data, grid, args.batch_size, trained.dtype,
                            x_dataset=args.x_dataset, y_dataset=args.y_dataset,
                            device=args.device, outputs=trained.outputs)
        for path in args.out:
            write_predictions(p, path, output_kind(path), comm,
                              {"model": args.model, "checkpoint": str(args.checkpoint)})
        result.predictions = p
        what = f"{len(p.files)} samples" + (f", MAE {p.mae:.5f}" if p.mae is not None else "")
    result.seconds = comm.bcast(time.perf_counter() - t0, root=0)
    progress.say(f"disttensor.predict {args.model}: {what} on grid (sample, d, h, w) = "
                 f"{dims} in {result.seconds:.2f} s -> {', '.join(args.out)}")
    return result


def main(argv=None) -> int:
    """``python -m disttensor.predict``: exit status 0 when the outputs were written."""
    run(argv)
    return 0
