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

Collective arguments
--------------------
Every function here (and every method of :class:`SampleDataset` that reads) is collective over
its communicator, and compares its metadata arguments across the ranks before any file is
opened or any data moves: paths, dataset names, driver, mode, atomicity, chunks, compression,
the arrays' distributions and dtypes, checkpoint names and scalars, file lists, batch size,
shuffling, seed, epoch, sample indices, generator settings.  An argument that differs between
ranks raises :class:`~disttensor.core.agreement.ArgumentMismatchError` (a ``ValueError`` whose
message names the argument and its value on every rank) on every rank, instead of a hang or a
file written from different arguments (see :mod:`disttensor.core.agreement`).  The comparison rides
on the all-reduce that makes failures collective, so it costs (almost) nothing.

Temporary files
---------------
Atomic writes (:func:`write_hdf5` with ``atomic=True``, :func:`save_checkpoint`, the stacked
and per-sample files of :func:`generate_synthetic`) write to a hidden temporary file next to the
target and rename it over the target when every rank has finished::

    .{name}.{host}.{pid}.{random}.tmp     e.g.  .ckpt.h5.node017.48213.3f9c0a1b2c4d.tmp

(``host``: the writer's host name with every character but letters, digits, ``_`` and ``-``
replaced by ``_``; ``pid``: the process that created it; ``random``: 12 hex digits).  A write
that fails removes its temporary file, but a process that is killed (``SIGKILL``, out of memory,
a node failure, the end of a batch job's time) cannot: its temporary file stays.  The next write
to the same path removes the temporary files of that path that are *stale*, before it creates
its own (rank 0 for shared files; the writing rank for per-sample files):

* written on this host: when the writing process no longer exists (``os.kill(pid, 0)`` fails
  with ``ProcessLookupError``), is a zombie, or started after the file was last modified (its
  pid was reused); a file of the cleaning process itself when none of its writes is using it;
* written on another host (whose processes cannot be checked): when it has not been modified for
  ``DISTTENSOR_STALE_TMP_AGE`` seconds (default 3600; ``inf`` or ``never``: never removed).
  A live writer modifies its file as data arrives, so keep the age above the longest pause of
  a write;
* files of the older pattern ``.{name}.{random}.tmp`` (12 hex digits, no writer recorded):
  by age, as for another host.

Nothing else is touched: only names of this pattern whose ``name`` is the path being written
(the parts split unambiguously: ``host`` contains no dot), regular files only, and errors while
removing are ignored.  Hosts that share a host name *and* the directory but not the process
table (containers with equal host names) would see each other's writers as dead: give them
distinct host names.  :class:`SampleDataset` skips dot-files when it lists a directory, so
temporary files are never read as samples.
"""
from .errors import DatasetNotFoundError, HDF5UnavailableError, NotHDF5FileError
from .hdf5 import hdf5_driver_available, read_hdf5, write_hdf5
from .checkpoint import load_checkpoint, save_checkpoint
from .dataset import SampleDataset
from .zarrio import read_zarr, write_zarr
# the sample sources of the other formats register their openers with io.sources (zarr and
# tfrecord are imported only when such a source is used)
from . import npy_samples, tfrecord_samples, zarr_samples  # noqa: E402,F401

__all__ = ["read_hdf5", "write_hdf5", "hdf5_driver_available", "SampleDataset",
           "save_checkpoint", "load_checkpoint", "generate_synthetic", "synthetic_sample",
           "synthetic_segmentation_sample",
           "DatasetNotFoundError", "NotHDF5FileError", "HDF5UnavailableError"]
__all__ += ["read_zarr", "write_zarr"]


def __getattr__(name):
    # imported lazily so that ``python -m disttensor.io.synthetic`` does not find the module
    # already imported by its package (runpy's warning)
    if name in ("generate_synthetic", "synthetic_sample", "synthetic_segmentation_sample"):
        import importlib
        return getattr(importlib.import_module(__name__ + ".synthetic"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
