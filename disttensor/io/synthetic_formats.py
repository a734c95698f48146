"""The synthetic datasets of :mod:`disttensor.io.synthetic` written in the other sample formats
:class:`~disttensor.io.SampleDataset` reads: a Zarr group, a directory of ``.npy`` pairs, or
gzipped TFRecord files of the MLPerf HPC CosmoFlow layout
(``python -m disttensor.io.synthetic --format zarr|npy|tfrecord``).

The samples are those of :func:`~disttensor.io.synthetic.synthetic_sample` (regression; target
vectors of 3 values) or :func:`~disttensor.io.synthetic.synthetic_segmentation_sample`
(``zarr`` and ``npy`` only; ``uint8`` label volumes), so sample ``i`` is the same in every
format and on any number of ranks.  ``dtype='int16'`` stores particle-count-like integers, as
the CosmoFlow data: ``counts = floor(exp(2 + 3 x))`` of the float field ``x`` (a log-normal
field, clipped to the int16 range; ``log1p`` of it is nearly linear in ``x``); a float dtype
stores ``x`` itself.

Layouts written:

* ``zarr``: the group ``out`` with ``full`` ``N,C,D,H,W`` (``N,D,H,W,C`` with
  ``channels_last``) chunked one sample per chunk (zstd) and ``unitPar`` ``N,3`` (or
  ``labels`` ``N,D,H,W``); every rank writes its samples' chunks into a temporary group that
  rank 0 renames into place (atomic, as :func:`~disttensor.io.write_zarr`).
* ``npy``: the directory ``out`` with ``sample_%06d_data.npy`` (``D,H,W,C``, or ``C,D,H,W``
  with ``channels_last=False``) and ``sample_%06d_label.npy``; every rank writes its samples'
  pairs, each file atomically.
* ``tfrecord``: the directory ``out`` with ``sample_%06d.tfrecord`` files (gzip) of
  ``records_per_file`` records each (``x``: the ``D,H,W,C`` sample's bytes, ``y``: the
  targets); files are dealt round-robin over the ranks.

Samples are dealt round-robin over the ranks; collective over ``comm`` (errors on every rank,
arguments agreed).
"""
from __future__ import annotations

import os
import shutil

import numpy as np

__all__ = ["generate_synthetic_format", "FORMATS", "int16_counts"]

FORMATS = ("zarr", "npy", "tfrecord")


def int16_counts(x: np.ndarray) -> np.ndarray:
    """Count-like ``int16`` values of a float field: ``floor(exp(2 + 3 x))``, clipped."""
    v = np.floor(np.exp(np.clip(2.0 + 3.0 * x.astype(np.float64), None, 10.4)))
    return np.clip(v, 0, np.iinfo(np.int16).max).astype(np.int16)


def generate_synthetic_format(out, samples: int, size: int = 32, channels: int = 4,
                              seed: int = 0, *, format: str = "npy", dtype="int16",
                              channels_last: bool | None = None, comm=None,
                              task: str = "regression", classes: int = 3,
                              records_per_file: int = 1) -> str:
    """Write a synthetic dataset in ``format`` (``'zarr'``, ``'npy'`` or ``'tfrecord'``) to
    ``out`` (see the module docstring); returns ``out``'s absolute path.  ``channels_last``:
    sample axis order on disk (default ``True`` for ``npy`` and ``tfrecord``, the MLPerf
    layout; ``False`` for ``zarr``; TFRecords are always ``D,H,W,C``).  Collective over
    ``comm`` (default ``COMM_WORLD``)."""
    from mpi4py import MPI

    from ..core.comm import collective
    from ._args import arg_dtype, arg_path
    from ._h5file import root_call
    from .synthetic import TASKS, synthetic_sample, synthetic_segmentation_sample

    comm = MPI.COMM_WORLD if comm is None else comm
    with collective(comm, "generate_synthetic_format", out=arg_path(out), samples=samples,
                    size=size, channels=channels, seed=seed, format=format,
                    dtype=arg_dtype(dtype), channels_last=channels_last, task=task,
                    classes=classes, records_per_file=records_per_file):
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        for name, v, least in (("samples", samples, 0), ("size", size, 2),
                               ("channels", channels, 1), ("seed", seed, 0),
                               ("records_per_file", records_per_file, 1)):
            if not isinstance(v, (int, np.integer)) or v < least:
                raise ValueError(f"{name} must be an int >= {least}, got {v!r}")
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        seg = task == "segmentation"
        if seg and format == "tfrecord":
            raise ValueError("the TFRecord layout holds target vectors only (task "
                             "'regression')")
        dtype = np.dtype(dtype)
        if dtype != np.int16 and dtype.kind != "f":
            raise TypeError(f"dtype must be int16 or a floating type, got {dtype}")
        if channels_last is None:
            channels_last = format != "zarr"
        if format == "tfrecord" and not channels_last:
            raise ValueError("TFRecords of the MLPerf layout are D,H,W,C (channels_last=True)")
        if format == "zarr":
            from .zarrio import _zarr
            _zarr()
        if format == "tfrecord":
            from .tfrecord_samples import _tf
            _tf()
        out = os.path.abspath(os.fspath(out))
        if not os.path.isdir(os.path.dirname(out)):
            raise FileNotFoundError(f"directory {os.path.dirname(out)!r} does not exist")

    def make(i):
        if seg:
            x, y = synthetic_segmentation_sample(i, size, channels, classes, seed,
                                                 np.float32)
        else:
            x, y = synthetic_sample(i, size, channels, seed, np.float32)
        x = int16_counts(x) if dtype == np.int16 else x.astype(dtype)
        return (np.moveaxis(x, 0, -1) if channels_last else x), y

    mine = range(comm.rank, samples, comm.size)
    if format == "npy":
        from .npy_samples import write_npy_pair
        root_call(comm, lambda: os.makedirs(out, exist_ok=True))
        with collective(comm):
            for i in mine:
                write_npy_pair(out, f"sample_{i:06d}", *make(i))
        return out
    if format == "tfrecord":
        from .tfrecord_samples import write_tfrecord
        root_call(comm, lambda: os.makedirs(out, exist_ok=True))
        k = int(records_per_file)
        with collective(comm):
            for f in range(comm.rank, -(-samples // k), comm.size):
                write_tfrecord(os.path.join(out, f"sample_{f:06d}.tfrecord"),
                               (make(i) for i in range(f * k, min(samples, (f + 1) * k))))
        return out
    return _write_zarr_group(comm, out, samples, size, channels, seed, dtype, channels_last,
                             seg, classes, make, mine)


def _write_zarr_group(comm, out, samples, size, channels, seed, dtype, channels_last, seg,
                      classes, make, mine):
    from ..core.comm import collective
    from ._atomic import replace_directory
    from ._h5file import root_call
    from ._temps import _release, temp_path_for
    from .zarrio import _codecs, _zarr, remove_stale_temp_dirs
    zarr = _zarr()
    xshape = (samples,) + ((size,) * 3 + (channels,) if channels_last
                           else (channels,) + (size,) * 3)
    yname, yshape, ydtype = ("labels", (samples,) + (size,) * 3, np.uint8) if seg else \
        ("unitPar", (samples, 3), np.float32)

    def prep():
        if os.path.exists(out) and not os.path.isfile(os.path.join(out, "zarr.json")):
            raise FileExistsError(f"{out!r} exists and is not a Zarr store; not replacing it")
        remove_stale_temp_dirs(out)
        tmp = temp_path_for(out)
        g = zarr.open_group(tmp, mode="w", attributes={
            "generator": "disttensor.io.synthetic", "task": "segmentation" if seg else
            "regression", "seed": int(seed), "size": int(size), "channels": int(channels),
            "samples": int(samples), "axes": "N,D,H,W,C" if channels_last else "N,C,D,H,W"})
        g.create_array("full", shape=xshape, chunks=(1,) + xshape[1:], dtype=dtype,
                       compressors=_codecs(zarr, "zstd"), fill_value=0)
        g.create_array(yname, shape=yshape, chunks=(1,) + yshape[1:], dtype=ydtype,
                       compressors=_codecs(zarr, "zstd"), fill_value=0)
        return tmp

    tmp = root_call(comm, prep)
    try:
        with collective(comm):
            g = zarr.open_group(tmp, mode="r+")
            xa, ya = g["full"], g[yname]
            for i in mine:
                x, y = make(i)
                xa[i] = x
                ya[i] = y

        root_call(comm, lambda: replace_directory(tmp, out))
    except BaseException:
        if comm.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            _release(tmp)
        raise
    return out
