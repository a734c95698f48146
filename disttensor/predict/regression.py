"""Regression inference (CosmoFlow, ResNet): the targets of every sample of a dataset.

:func:`predict_targets` reads the samples with :class:`disttensor.io.SampleDataset` in file
order (no shuffling, the last batch possibly short) on the grid ``(s, d, h, w)``: each batch
is dealt over the sample axis and every sample cut spatially, as in training; the
predictions ``(B, k)`` are gathered on every rank.  When the files hold no target dataset the
samples are read one at a time with :func:`disttensor.io.read_hdf5` (spatially split over the
whole grid) and there is no error to report.  :func:`write_predictions` writes rank 0's
table as CSV (one row per sample: ``file``, ``pred_0..``, ``target_0..``) or HDF5
(``files``, ``predictions``, ``targets`` and the attribute ``mae``) through a temporary file
renamed over the target, so a failed write leaves an earlier output intact.  Both are
collective over the grid's ranks; errors are raised on every rank.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field

import numpy as np

from ..autograd import Tensor, no_grad
from ..core.array import DistArray
from ..core.comm import collective
from ..core.distribution import Distribution
from ..io import SampleDataset, read_hdf5
from ..io._atomic import replace_atomically
from ..io._h5file import probe, root_call
from ..io._temps import remove_quietly, temp_path_for
from ..io.dataset import list_sample_files

__all__ = ["Predictions", "predict_targets", "write_predictions"]


@dataclass
class Predictions:
    """The result of :func:`predict_targets` (the same on every rank)."""
    files: list = field(default_factory=list)       # one name per sample
    predictions: np.ndarray | None = None           # (N, k) float64
    targets: np.ndarray | None = None               # (N, k) float64, or None

    @property
    def mae(self) -> float | None:
        """Mean absolute error over samples and targets (``None`` without targets)."""
        if self.targets is None or not len(self.targets):
            return None
        return float(np.abs(self.predictions - self.targets).mean())


def _names(files, stacked: bool, n: int) -> list[str]:
    if stacked:
        return [f"{files[0]}[{i}]" for i in range(n)]
    return list(files)


def _forward(model, x, dtype):
    x = x if x.dtype == dtype else x.astype(dtype)
    with no_grad():
        return model(Tensor(x)).data.to_numpy().astype(np.float64)


def _list_files(source) -> list[str]:
    """The HDF5 files of ``source``: a directory's sample files, or the one file."""
    p = os.fspath(source)
    files = list_sample_files(p) if os.path.isdir(p) else [p]
    if not files:
        raise FileNotFoundError(f"--data {p!r}: no HDF5 sample files in the directory")
    return files


def _dataset_exists(path, name) -> bool:
    import h5py
    with h5py.File(path, "r", locking=False) as f:
        return name in f


def predict_targets(model, source, grid, batch_size: int, dtype, *, x_dataset="full",
                    y_dataset=None, device="cpu", outputs: int | None = None) -> Predictions:
    """The predictions of ``model`` for every sample of ``source`` (collective over
    ``grid``, a 4-D grid ``(s, d, h, w)``).  ``y_dataset`` ``None``: ``'unitPar'`` when
    the files hold it; a name given must exist (``DatasetNotFoundError`` on every rank).
    ``outputs``: the model's number of targets, checked against the files' (``ValueError``
    on every rank)."""
    comm = grid.cart
    dtype = np.dtype(dtype)
    yname = y_dataset or "unitPar"
    present = y_dataset is not None or root_call(
        comm, lambda: _dataset_exists(_first_file(source, x_dataset), yname))
    if present:
        ds = SampleDataset(source, grid, (0, None, 1, 2, 3), batch_size=batch_size,
                           shuffle=False, prefetch=False, x_dataset=x_dataset,
                           y_dataset=yname, device=device)
        try:
            with collective(comm):
                if ds.target_kind != "vector" or (outputs is not None and
                                                  ds.num_targets != outputs):
                    raise ValueError(f"the model predicts {outputs} targets, but {yname!r} "
                                     f"of {ds.files[0]!r} holds "
                                     f"{ds.target_shape} per sample")
            preds, targets = [], []
            for x, y in ds.epoch(0):
                preds.append(_forward(model, x, dtype))
                targets.append(y.to_numpy().astype(np.float64).reshape(len(preds[-1]), -1))
            return Predictions(_names(ds.files, ds.stacked, ds.num_samples),
                               np.concatenate(preds), np.concatenate(targets))
        finally:
            ds.close()
    files = root_call(comm, lambda: _list_files(source))
    shape = root_call(comm, lambda: tuple(probe(files[0], [x_dataset])[x_dataset]["shape"]))
    stacked = len(files) == 1 and len(shape) == 5
    n = shape[0] if stacked else len(files)
    preds = []
    for i in range(n):
        if stacked:
            x = read_hdf5(files[0], x_dataset, grid=grid, split=(None, None, 1, 2, 3),
                          slices=(slice(i, i + 1),), device=device)
        else:
            v = read_hdf5(files[i], x_dataset, grid=grid, split=(None, 1, 2, 3),
                          device=device)
            d = v.distribution
            dist = Distribution((1,) + d.shape, d.grid_dims, (None,) + d.split,
                                (None,) + d.split_sizes)
            x = DistArray(v.local.reshape(dist.block_shape(grid.coords)), dist, grid)
        preds.append(_forward(model, x, dtype))
    return Predictions(_names(files, stacked, n), np.concatenate(preds), None)


def _first_file(source, x_dataset):
    files = _list_files(source)
    probe(files[0], [x_dataset])  # a missing input dataset: DatasetNotFoundError
    return files[0]


def _write_csv(p: Predictions, path):
    k = p.predictions.shape[1]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["file"] + [f"pred_{j}" for j in range(k)] +
                   ([f"target_{j}" for j in range(k)] if p.targets is not None else []))
        for i, name in enumerate(p.files):
            row = [name] + [repr(float(v)) for v in p.predictions[i]]
            if p.targets is not None:
                row += [repr(float(v)) for v in p.targets[i]]
            w.writerow(row)


def _write_h5(p: Predictions, path, attrs):
    import h5py
    with h5py.File(path, "w", locking=False) as f:
        f.create_dataset("files", data=np.array(p.files, dtype=object),
                         dtype=h5py.string_dtype())
        f.create_dataset("predictions", data=p.predictions)
        if p.targets is not None:
            f.create_dataset("targets", data=p.targets)
            f.attrs["mae"] = p.mae
            f.attrs["mae_per_target"] = np.abs(p.predictions - p.targets).mean(axis=0)
        for k, v in attrs.items():
            f.attrs[k] = v


def write_predictions(p: Predictions, path, kind: str, comm, attrs=None) -> None:
    """Write ``p`` to ``path`` as ``kind`` (``'csv'`` or ``'hdf5'``), rank 0 through a
    temporary file renamed over ``path`` (collective: the error on every rank)."""
    def write():
        target = os.path.abspath(path)
        tmp = temp_path_for(target)
        try:
            if kind == "csv":
                _write_csv(p, tmp)
            else:
                _write_h5(p, tmp, dict(attrs or {}))
            replace_atomically(tmp, target)
        except BaseException:
            remove_quietly(tmp)
            raise
    root_call(comm, write)
