"""Training command line: CosmoFlow or a 3D U-Net, spatially partitioned, data parallel.

Run under MPI::

    mpiexec -n 4 python -m disttensor.train cosmoflow --data DIR --grid 2x2x1x1 --epochs 5

The ranks form a 4-D grid ``(sample, depth, height, width)``: the global batch is dealt over the
sample axis, and every sample is cut into blocks over the three spatial axes (each rank reads
only its block from the files, see :class:`disttensor.io.SampleDataset`).  Without ``--grid``
the grid is the one whose step the performance model predicts fastest
(:func:`disttensor.nn.perfmodel.plan_grid`: measured layer times per local block and a
measured latency/bandwidth model of halo exchange and all-reduce); rank 0 prints the
ranking.  Parameters are replicated; their gradients are summed over all ranks in buckets
overlapped with backward (:class:`disttensor.nn.DistributedDataParallel`).  With batch norm
in its default global mode the run computes the same thing on any grid as on one rank.

Each epoch trains over the shuffled training samples (a progress line with the loss and
samples/s on rank 0 when it writes to a terminal), validates (CosmoFlow: MSE and MAE; U-Net:
Dice and accuracy), appends a row to ``OUT/metrics.csv`` and writes ``OUT/checkpoint.h5``
atomically; SIGTERM (or SIGINT) checkpoints at the next step and exits.  ``--resume`` continues
from ``OUT/checkpoint.h5`` exactly where it stopped (same batches, same loss curve).  The last
line compares the validation error with a trivial predictor (the mean training target; the
majority class).

Data: ``--data DIR`` is a directory of per-sample files or one stacked file as written by
``python -m disttensor.io.synthetic`` (``--task segmentation`` for the U-Net).  Validation
uses ``--val`` if given, else the last ``--val-fraction`` of the files of ``--data``.

The package, by job:

* :mod:`~disttensor.train.arguments`: the options (:func:`parse_args`) and their checks;
* :mod:`~disttensor.train.job`: :func:`run` (one job: data split, grid, datasets, model) and
  :func:`main` (``python -m disttensor.train``, :mod:`~disttensor.train.__main__`);
* :mod:`~disttensor.train.grid_choice`: the grid without ``--grid`` (:func:`choose_grid`);
* :mod:`~disttensor.train.builders`: model, optimizer, learning-rate schedule;
* :mod:`~disttensor.train.loop`: the epochs and steps (:class:`TrainResult`);
* :mod:`~disttensor.train.data`: training/validation files, dataset-wide facts;
* :mod:`~disttensor.train.checkpoints`: ``OUT/checkpoint.h5`` and ``--resume``;
* :mod:`~disttensor.train.metrics`: validation metrics, ``OUT/metrics.csv``, result lines;
* :mod:`~disttensor.train.progress`: rank 0's progress (a tqdm bar on a terminal);
* :mod:`~disttensor.train.watch`: TensorBoard event files, ``OUT/best.h5``, ``--target-mae``
  and the time to train, MLPerf logging; :mod:`~disttensor.train.plots`: ``OUT/curves.png``;
* :mod:`~disttensor.train.presets`: ``--preset mlperf-hpc`` (the MLPerf HPC CosmoFlow
  recipe), learning-rate batch scaling and the reference's per-epoch decay.
"""
from .arguments import parse_args
from .builders import build_model, build_optimizer, build_schedule
from .checkpoints import CHECKPOINT
from .grid_choice import choose_grid
from .job import main, run
from .loop import TrainResult
from .metrics import METRICS

__all__ = ["main", "run", "parse_args", "choose_grid", "TrainResult", "build_model",
           "build_optimizer", "build_schedule", "CHECKPOINT", "METRICS"]
