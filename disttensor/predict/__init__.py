"""Inference command line: apply a model trained by ``python -m disttensor.train``.

Run under MPI (or ``srun``)::

    mpiexec -n 4 python -m disttensor.predict cosmoflow --checkpoint runs/train/checkpoint.h5 \\
        --data val/ --out preds.csv preds.h5 --widths 8,16,32
    mpiexec -n 4 python -m disttensor.predict unet3d --checkpoint runs/seg/checkpoint.h5 \\
        --data volume.h5 --out labels.h5 --mode sliding --unet-widths 8,16:16,32

The model is rebuilt from the checkpoint (its recorded configuration: model name, sample
shape, parameter shapes, dtype) and the training run's model options, which are passed as
they were to ``python -m disttensor.train``; a checkpoint of another model or configuration
raises an error naming both, on every rank.

* **Regression** (``cosmoflow``, ``resnet3d``): every sample of ``--data`` (a directory of
  per-sample files or a stacked file, as for training) in file order, batches of
  ``--batch-size`` dealt over the grid's sample axis and cut spatially; writes ``.csv`` and/or
  ``.h5`` tables with the predictions and, when the files hold targets, the targets and the
  mean absolute error (:mod:`~disttensor.predict.regression`).
* **Segmentation** (``unet3d``, ``nnunet``): one volume of any size (``--data`` file,
  ``--x-dataset``) is read spatially split over the grid ``1 x d x h x w`` and segmented in
  one parallel pass (``--mode whole``) or by nnU-Net's sliding windows of the training patch
  size with Gaussian blending (``--mode sliding``, ``--step``, ``--sigma-scale``); the label
  volume is written in parallel, each rank its block, to ``.h5`` (and ``.zarr``)
  (:mod:`~disttensor.predict.segment`, :mod:`~disttensor.predict.windows`).

Modules: :mod:`~disttensor.predict.arguments` (options), :mod:`~disttensor.predict.model`
(checkpoint -> model), :mod:`~disttensor.predict.regression`,
:mod:`~disttensor.predict.segment`, :mod:`~disttensor.predict.windows`,
:mod:`~disttensor.predict.job` (:func:`run`, :func:`main`).
"""
from .job import PredictResult, main, run
from .model import load_trained, save_model_checkpoint
from .segment import segment_sliding, segment_whole
from .windows import gaussian_importance, window_boxes, window_starts

__all__ = ["run", "main", "PredictResult", "load_trained", "save_model_checkpoint",
           "segment_whole", "segment_sliding", "gaussian_importance", "window_boxes",
           "window_starts"]
