"""Parallel HDF5 reads and writes of DistArrays: every rank transfers exactly the hyperslab of
the file that maps to its own block; no rank ever holds the whole array.

Drivers (``driver=``):

* ``'mpio'`` (default when h5py was built with MPI): the file is opened once over the grid's
  communicator with HDF5's MPI-IO driver and each dataset moves in one *collective* transfer
  (``H5FD_MPIO_COLLECTIVE``, what ``with dset.collective:`` selects in h5py's high-level API),
  so MPI-IO can aggregate the ranks' requests.
* ``'independent'`` (default without MPI-enabled h5py, and selectable explicitly): every rank
  opens the file with HDF5's default POSIX driver; reads are independent, writes are ordered:
  rank 0 creates the file and its datasets, then a token passes from rank to rank and only the
  holder has the file open for writing (HDF5 without MPI-IO has no concurrent writers).

Both drivers produce the same bytes and read any HDF5 file, including chunked and compressed
datasets (compressed *writes* with ``mpio`` use HDF5's parallel filter support, HDF5 >= 1.10.2).

Files are written atomically by default: to a temporary file in the same directory which rank 0
renames (``os.replace``) over the target only when every rank has finished without error; an
existing file is never left half-written (see :func:`write_hdf5`).

Every function here is collective over the grid's communicator; bad arguments, missing files or
datasets, mismatching shapes or dtypes and I/O errors on any rank raise the same exception on
every rank.  The metadata arguments (path, dataset name, driver, mode, storage options, the
array's distribution, ...) are agreed across the ranks before any file is opened: one that
differs between ranks raises :class:`~disttensor.core.agreement.ArgumentMismatchError` (a
``ValueError`` naming the argument and its value on every rank) on every rank, in preference to
any other error (see :mod:`disttensor.core.agreement`).

Temporary files: an atomic write works on ``.{name}.{host}.{pid}.{random}.tmp`` next to the
target ``name``.  A write killed before its rename leaves that file behind; the next write to
the same path removes it once it is stale (its writer was on this host and its process is
gone, or it was on another host and the file has not been modified for
``DISTTENSOR_STALE_TMP_AGE`` seconds, default 3600).  See :mod:`disttensor.io`.
"""
from __future__ import annotations

import math
import os

import numpy as np

from ..core.array import DistArray
from ..core.layout import make_distribution
from ..core.backend import to_host, xp_for
from ..core.comm import collective
from ..core.grid import get_default_grid
from ._args import arg_attrs, arg_dtype, arg_path, usable_device
from ._atomic import atomic_update
from ._h5file import (dataset_meta, drain_background_reads, get_dataset, h5py_available,
                      h5py_has_mpi, probe, resolve_driver, storable_dtype)
from ._sessions import DatasetSpec, ReadSession, WriteSession, c_contiguous
from .layout import check_dataset_name, file_hyperslab, is_writer, normalize_selection, \
    selection_shape

__all__ = ["read_hdf5", "write_hdf5", "hdf5_driver_available"]


def hdf5_driver_available(driver: str) -> bool:
    """Whether ``driver`` (``'mpio'`` or ``'independent'``) can be used here."""
    if driver == "mpio":
        return h5py_has_mpi()
    return driver == "independent" and h5py_available()


def read_hdf5(path, dataset: str, grid=None, split=None, sizes=None, slices=None,
              driver: str | None = None, device: str = "cpu", *, dtype=None, shape=None,
              out: DistArray | None = None, collective_io: bool = True) -> DistArray:
    """Read ``dataset`` of the HDF5 file ``path`` into a DistArray (collective over the grid).

    Parameters
    ----------
    path, dataset : the file (every rank must see the same file) and the dataset in it.
    grid, split, sizes : the distribution of the result, as for :func:`disttensor.zeros`
        (default grid and split when omitted; ``sizes``: explicit ownership sizes).  Ranks
        along replication axes each read their (identical) block.
    slices : optional global sub-selection: a tuple of ``slice`` objects with step > 0, one
        per leading axis.  The result is the DistArray of ``dataset[slices]`` (its shape is the
        selection's), each rank reading only the (strided) hyperslab of its block.
    driver : ``'mpio'``, ``'independent'`` or ``None`` (``'mpio'`` when available).
    device : ``'cpu'`` or ``'cuda'``: blocks are read into host memory and moved to the GPU.
    dtype, shape : optional expectations: the dataset's dtype and (whole, before ``slices``)
        shape must equal them, else ``TypeError`` / ``ValueError`` on every rank.
    out : optional DistArray to read into (its distribution and grid are used, ``grid``,
        ``split`` and ``sizes`` must be omitted); its shape must equal the selection's and its
        dtype the dataset's.  Returned.
    collective_io : with ``driver='mpio'``, move the data in one collective MPI-IO transfer
        (default; lets MPI-IO aggregate requests, which pays on parallel file systems with
        many ranks) or, with ``False``, each rank independently (often faster on one node or
        from the page cache: see ``bench/io_bench.py``).  Datasets compressed with filters
        that are not built into HDF5 (h5py's LZF, plugins) are always read independently:
        HDF5 1.10's collective filtered read hands them wrong buffer sizes.

    Raises (on every rank) ``FileNotFoundError``, ``IsADirectoryError``,
    :class:`~disttensor.io.NotHDF5FileError`, :class:`~disttensor.io.DatasetNotFoundError`
    (a ``KeyError``), ``TypeError`` (bad dtype), ``ValueError`` (bad arguments or shape).
    """
    drain_background_reads()
    grid = (out.grid if isinstance(out, DistArray) else None) if grid is None else grid
    grid = get_default_grid() if grid is None else grid
    comm = getattr(grid, "cart", None)
    with collective(comm, "read_hdf5", path=arg_path(path), dataset=dataset, grid=grid,
                    split=split, sizes=sizes, slices=slices, driver=driver, device=device,
                    dtype=arg_dtype(dtype), shape=shape, out=out,
                    collective_io=collective_io):
        if comm is None:
            raise TypeError(f"grid must be a ProcessGrid, got {type(grid).__name__}")
        if out is not None:
            if not isinstance(out, DistArray):
                raise TypeError(f"out must be a DistArray, got {type(out).__name__}")
            if grid is not out.grid or split is not None or sizes is not None:
                raise ValueError("read_hdf5: pass either out= or grid/split/sizes, not both")
        name = check_dataset_name(dataset)
        driver = resolve_driver(driver)
        device = usable_device(device)
        if dtype is not None:
            dtype = np.dtype(dtype)
        path = os.fspath(path)

    # every rank opens the file and checks the metadata itself (no extra serial probe: a
    # failed open is diagnosed on every rank, see ReadSession)
    sess = ReadSession(path, comm, driver, collective_io, agreed=True)
    try:
        with collective(comm):
            meta = dataset_meta(get_dataset(sess.f, name, path))
            fshape, fdtype = meta["shape"], meta["dtype"]
            if shape is not None and tuple(shape) != fshape:
                raise ValueError(f"dataset {name!r} in {path!r} has shape {fshape}, expected "
                                 f"{tuple(shape)}")
            if dtype is not None and dtype != fdtype:
                raise TypeError(f"dataset {name!r} in {path!r} has dtype {fdtype}, expected "
                                f"{dtype}")
            sel = normalize_selection(slices, fshape)
            sshape = selection_shape(sel)
            if out is not None:
                if out.shape != sshape:
                    raise ValueError(f"out has shape {out.shape} but the selection of dataset "
                                     f"{name!r} has shape {sshape}")
                if out.dtype != fdtype:
                    raise TypeError(f"out has dtype {out.dtype} but dataset {name!r} has "
                                    f"{fdtype}")
                dist = out.distribution
            else:
                grid, dist = make_distribution(sshape, grid, split, sizes)
            box = dist.block_box(grid.coords)
            start, stride, count = file_hyperslab(sel, box)
            host = np.empty(count, dtype=fdtype)
        sess.read([(name, start, stride, host)])
    finally:
        sess.close()

    if out is not None:
        with collective(comm):
            out.local[...] = host if out.device == "cpu" else out.xp.asarray(host)
        return out
    local = host if device == "cpu" else xp_for(device).asarray(host)
    return DistArray(local, dist, grid)


def write_hdf5(x: DistArray, path, dataset: str, driver: str | None = None, *, mode: str = "a",
               atomic: bool = True, chunks=None, compression=None, compression_opts=None,
               shuffle: bool = False, attrs: dict | None = None) -> None:
    """Write the DistArray ``x`` as ``dataset`` of the HDF5 file ``path`` (collective over
    ``x.grid``): each block goes to its hyperslab, and a block held by several ranks
    (replication axes of the grid) is written once, by the replica at coordinate 0 along every
    replication axis.  GPU blocks are copied to host memory first.

    Parameters
    ----------
    mode : ``'a'`` (default: keep the file's other content; create it if missing; an existing
        dataset of that name is replaced), ``'w'`` (the file will hold only this dataset) or
        ``'r+'`` (the file and the dataset must exist, with ``x``'s shape and dtype, else
        ``ValueError``/``TypeError``; the dataset keeps its storage layout and filters).
    atomic : ``True`` (default): the write goes to a temporary file in the same directory
        (for ``'a'``/``'r+'`` a copy of the existing file) that replaces ``path`` only once every
        rank has finished; a failure (I/O error, no space left, a crash) leaves ``path`` as it
        was.  ``False``: write ``path`` in place (no copy, but an interrupted write leaves a
        partly written file).
    driver : ``'mpio'``, ``'independent'`` or ``None`` (``'mpio'`` when available).
    chunks, compression, compression_opts, shuffle : storage of a newly created dataset, as in
        ``h5py.Group.create_dataset`` (ignored for scalar and empty datasets).
    attrs : attributes to set on the dataset (same values on every rank).

    Space: the target directory must have room for the uncompressed data (plus, with
    ``atomic`` and ``'a'``/``'r+'``, the copy of the existing file), checked and reserved before
    any data moves; otherwise ``OSError(ENOSPC)`` on every rank and ``path`` is unchanged.
    """
    drain_background_reads()
    comm = getattr(getattr(x, "grid", None), "cart", None)
    with collective(comm, "write_hdf5", x=x, path=arg_path(path), dataset=dataset,
                    driver=driver, mode=mode, atomic=atomic, chunks=chunks,
                    compression=compression, compression_opts=compression_opts,
                    shuffle=shuffle, attrs=arg_attrs(attrs)):
        if not isinstance(x, DistArray):
            raise TypeError(f"write_hdf5 needs a DistArray, got {type(x).__name__}")
        name = check_dataset_name(dataset)
        driver = resolve_driver(driver)
        if mode not in ("w", "a", "r+"):
            raise ValueError(f"mode must be 'w', 'a' or 'r+', got {mode!r}")
        dtype = storable_dtype(x.dtype)
        if chunks is not None and chunks is not True:
            chunks = tuple(int(c) for c in chunks)
            if len(chunks) != x.ndim or any(c < 1 for c in chunks):
                raise ValueError(f"chunks {chunks} must have one positive entry per axis of "
                                 f"the array (shape {x.shape})")
        path = os.fspath(path)
        attrs = dict(attrs or {})

    dist = x.distribution
    writer = is_writer(dist, x.grid.coords)
    with collective(comm):
        data = c_contiguous(to_host(x.local)) if writer else None
        start = dist.block_box(x.grid.coords).start

    def validate(existing):
        if mode != "r+":
            return
        meta = probe(existing, [name])[name]
        if meta["shape"] != x.shape:
            raise ValueError(f"dataset {name!r} in {existing!r} has shape {meta['shape']}, the "
                             f"array has {x.shape} (mode 'r+' writes into the existing dataset)")
        if meta["dtype"] != dtype:
            raise TypeError(f"dataset {name!r} in {existing!r} has dtype {meta['dtype']}, the "
                            f"array has {dtype} (mode 'r+' writes into the existing dataset)")

    spec = DatasetSpec(name, x.shape, dtype, chunks=chunks, compression=compression,
                       compression_opts=compression_opts, shuffle=shuffle, attrs=attrs)

    def body(sess: WriteSession):
        if mode == "r+":
            if attrs:
                sess.metadata(lambda f: f[name].attrs.update(attrs))
        else:
            sess.create([spec])
        sess.write([(name, start, data)])

    needed = math.prod(x.shape) * dtype.itemsize  # uncompressed size, also with filters
    atomic_update(comm, path, driver, mode, atomic, needed, body, validate,
                  agreed=True)
