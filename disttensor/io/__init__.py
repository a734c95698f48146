"""Parallel HDF5 I/O for DistArrays: file hyperslabs straight to local blocks.

* :func:`read_hdf5` / :func:`write_hdf5`: one dataset <-> one DistArray, any distribution,
  every rank transferring only its own block (``mpio`` collective transfers, or independent
  reads and ordered writes without MPI-enabled h5py); atomic writes.
* :class:`SampleDataset`: training samples (CosmoFlow layout, one ``C,D,H,W`` file per sample,
  or one stacked ``N,C,D,H,W`` dataset), each sample read spatially partitioned, samples dealt
  over the grid's sample axis, shuffled per epoch, the next batch read in the background.
* :func:`save_checkpoint` / :func:`load_checkpoint`: named DistArrays, host arrays and scalars
  in one HDF5 file, written atomically, loadable on another grid.
* :mod:`disttensor.io.synthetic`: a learnable synthetic CosmoFlow-like dataset generator
  (``python -m disttensor.io.synthetic --help``).

Importing this package sets ``HDF5_USE_FILE_LOCKING=FALSE`` (unless already set) before h5py
is imported; files are also opened with ``locking=False``.
"""
from .errors import DatasetNotFoundError, HDF5UnavailableError, NotHDF5FileError
from .hdf5 import hdf5_driver_available, read_hdf5, write_hdf5
from .checkpoint import load_checkpoint, save_checkpoint
from .dataset import SampleDataset

__all__ = ["read_hdf5", "write_hdf5", "hdf5_driver_available", "SampleDataset",
           "save_checkpoint", "load_checkpoint", "generate_synthetic", "synthetic_sample",
           "synthetic_segmentation_sample",
           "DatasetNotFoundError", "NotHDF5FileError", "HDF5UnavailableError"]


def __getattr__(name):
    # imported lazily so that ``python -m disttensor.io.synthetic`` does not find the module
    # already imported by its package (runpy's warning)
    if name in ("generate_synthetic", "synthetic_sample", "synthetic_segmentation_sample"):
        import importlib
        return getattr(importlib.import_module(__name__ + ".synthetic"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
