"""The data side of a training run: which files train and which validate, facts about the
whole dataset that rank 0 reads once (the number of classes, the mean target), and the batches
of an epoch resumed part-way.

The samples themselves are read by :class:`disttensor.io.SampleDataset` (each rank only its
block).  :func:`num_classes` and :func:`target_mean` are collective over ``comm``: rank 0 reads,
its error is raised on every rank, its result is broadcast.
"""
from __future__ import annotations

import os

import numpy as np

from ..io._h5file import root_call
from ..io.dataset import list_sample_files

__all__ = ["split_files", "num_classes", "target_mean", "batches", "dataset_options"]


def split_files(data: str, val: str | None, fraction: float):
    """``(training source, validation source)``: ``--data`` and ``--val``, or without
    ``--val`` the sample files of the directory ``--data`` with the last ``fraction`` of them
    (sorted by name) held out for validation."""
    if val is not None:
        return data, val
    if not os.path.isdir(data):
        raise ValueError(f"--data {data!r} is one file: give validation samples with --val")
    files = list_sample_files(data)
    nval = max(1, int(round(len(files) * fraction)))
    if len(files) - nval < 1:
        raise ValueError(f"--data {data!r} holds {len(files)} sample files: too few to keep "
                         f"{nval} for validation")
    return files[:-nval], files[-nval:]


def num_classes(ds, comm) -> int:
    """Number of classes of a segmentation dataset (its ``classes`` attribute, else 1 + the
    largest label of the first sample)."""
    def read():
        import h5py
        with h5py.File(ds.files[0], "r") as f:
            c = f.attrs.get("classes", f[ds.y_dataset].attrs.get("classes"))
            if c is None:
                c = int(np.max(f[ds.y_dataset][...])) + 1
            return int(c)
    return root_call(comm, read)


def target_mean(files, stacked: bool, yname: str, comm) -> np.ndarray:
    """Mean training target vector (rank 0 reads the small target datasets, broadcasts)."""
    def read():
        import h5py
        if stacked:
            with h5py.File(files[0], "r") as f:
                return np.asarray(f[yname][...], dtype=np.float64).mean(axis=0)
        acc = None
        for path in files:
            with h5py.File(path, "r") as f:
                v = np.asarray(f[yname][...], dtype=np.float64)
            acc = v if acc is None else acc + v
        return acc / len(files)
    return root_call(comm, read)


def batches(ds, epoch, skip):
    """The batches of ``epoch`` of the dataset ``ds`` from batch ``skip`` on (a resumed epoch
    reads them one by one; a whole epoch with the dataset's prefetching)."""
    if skip == 0:
        yield from ds.epoch(epoch)
        return
    for idx in ds.batch_indices(epoch)[skip:]:
        yield ds.read_batch(idx, epoch)  # the epoch's crops and augmentation


def dataset_options(args, stored_dtype, training: bool) -> dict:
    """The read-time pipeline options of :class:`~disttensor.io.SampleDataset` from the command
    line (``--crop``, ``--log1p``, ``--divide-by-mean``, ``--x-shift``, ``--x-scale``,
    ``--x-dtype``, ``--augment``, ``--channels-last``).  Training: random crops and the augmentation; validation: centred
    crops, no augmentation.  Samples stored as integers are converted to ``--dtype`` unless
    ``--x-dtype`` says otherwise (the model computes in floats)."""
    dtype = args.x_dtype
    if dtype is None and np.dtype(stored_dtype).kind != "f":
        dtype = args.dtype
    crop = None
    if args.crop:
        crop = tuple(int(t) for t in str(args.crop).split(",") if t.strip())
        crop = crop[0] if len(crop) == 1 else crop
    augment = {"none": False, "flip": "flip", "permute": "permute", "all": True}[args.augment]
    return {"channels_last": args.channels_last, "dtype": dtype, "log1p": args.log1p,
            "divide_by_mean": args.divide_by_mean, "x_shift": args.x_shift,
            "x_scale": args.x_scale, "crop": crop, "random_crop": training,
            "augment": augment if training else False}
