"""Distributed sparse matrices in HDF5 files, written and read in parallel (collective).

File layout (CSR, readable by SciPy and h5sparse): a group ``group`` holding

* ``indptr`` ``(m + 1,)`` int64, ``indices`` ``(nnz,)`` int64, ``data`` ``(nnz,)`` float32/64:
  the compressed sparse row arrays (column indices ascending in each row, no duplicates);
* group attributes ``shape`` ``[m, n]``, ``format = "csr"`` and the same as h5sparse names them
  (``h5sparse_format``, ``h5sparse_shape``).

So ``scipy.sparse.csr_matrix((g["data"][:], g["indices"][:], g["indptr"][:]),
shape=g.attrs["shape"])`` reads it back on one process.

Writing: the rows are cut into balanced ranges over all ranks of the grid (the matrix's own row
ranges in the row layout; the block layout first sends each entry to its range's rank); every
rank writes the hyperslabs of its rows of the three datasets (offsets into ``indices``/``data``
from an exclusive scan of the entry counts) through the sessions of :mod:`disttensor.io`
(MPI-IO collective transfers, or ordered independent writes), atomically: to a temporary file
renamed over ``path`` once every rank is done (:func:`disttensor.io._atomic.atomic_update`).
Reading: each rank reads ``indptr`` of a balanced range of rows and then their ``indices`` and
``data``, and the entries go to their owners in the requested grid and layout: a file reads
back on any number of ranks.
"""
from __future__ import annotations

import os

import numpy as np

from ..core.comm import collective
from ..core.distribution import balanced_sizes, offsets_from_sizes
from ..core.entry import agreed, canon, collective_entry
from ..core.grid import ProcessGrid, get_default_grid
from ..io._args import arg_path
from ..io._atomic import atomic_update
from ..io._h5file import get_dataset, resolve_driver
from ..io._sessions import DatasetSpec, ReadSession
from ..io.layout import check_dataset_name
from .dist_plan import owners
from .distributed import DistCSBMatrix, route

__all__ = ["write_hdf5", "read_hdf5"]


def _rows_of_ranks(a: DistCSBMatrix):
    """This rank's balanced range of rows over all ranks and its entries in it, sorted by
    (row, column) (collective in the block layout)."""
    comm = a.grid.cart
    off = offsets_from_sizes(balanced_sizes(a.shape[0], comm.size))
    r, c, v = a.local_coo()
    if a.layout != "rows" or tuple(a.row_sizes) != tuple(np.diff(off)):
        r, c, v = route(comm, owners(r, off), r, c, v)
    order = np.lexsort((c, r))
    return off[comm.rank], off[comm.rank + 1], r[order], c[order], v[order]


@collective_entry
def write_hdf5(a: DistCSBMatrix, path, group: str, driver: str | None = None, *,
               mode: str = "a", atomic: bool = True) -> None:
    """Write the distributed sparse matrix ``a`` as the CSR group ``group`` of the HDF5 file
    ``path`` (collective; see the module doc).  ``mode``: ``'a'`` (keep the file's other
    content; an existing group's datasets are replaced) or ``'w'`` (the file holds only this
    matrix).  ``atomic`` and ``driver`` as for :func:`disttensor.io.write_hdf5`."""
    comm = a.grid.cart if isinstance(a, DistCSBMatrix) else None
    with agreed(comm, "sparse.write_hdf5", a=a._key() if comm else None,
                path=arg_path(path), group=group, driver=driver, mode=mode, atomic=atomic):
        if not isinstance(a, DistCSBMatrix):
            raise TypeError(f"write_hdf5 needs a DistCSBMatrix, got {type(a).__name__}")
        name = check_dataset_name(group, "group")
        driver = resolve_driver(driver)
        if mode not in ("w", "a"):
            raise ValueError(f"mode must be 'w' or 'a', got {mode!r}")
        path = os.fspath(path)
    lo, hi, r, c, v = _rows_of_ranks(a)
    counts = np.bincount(r - lo, minlength=hi - lo).astype(np.int64)
    before = comm.exscan(int(len(r))) if comm.size > 1 else 0
    before = int(before or 0)   # (None on rank 0)
    ptr = before + np.cumsum(counts)
    start_ptr = lo + 1
    if comm.rank == 0:   # rank 0's range (holding row 0, if any) also writes indptr[0] = 0
        ptr, start_ptr = np.concatenate(([0], ptr)), 0
    m, n = a.shape
    attrs = {"shape": np.array([m, n], np.int64), "format": "csr",
             "h5sparse_format": "csr", "h5sparse_shape": np.array([m, n], np.int64)}
    specs = [DatasetSpec(f"{name}/indptr", (m + 1,), np.dtype(np.int64)),
             DatasetSpec(f"{name}/indices", (a.nnz,), np.dtype(np.int64)),
             DatasetSpec(f"{name}/data", (a.nnz,), a.dtype)]

    def set_attrs(f):
        f[name].attrs.update(attrs)

    def body(sess):
        sess.create(specs)
        sess.metadata(set_attrs)
        sess.write([(f"{name}/indptr", (start_ptr,), ptr.astype(np.int64) if ptr.size else None),
                    (f"{name}/indices", (before,), c if c.size else None),
                    (f"{name}/data", (before,), v if v.size else None)])

    needed = (m + 1 + a.nnz) * 8 + a.nnz * a.dtype.itemsize
    atomic_update(comm, path, driver, mode, atomic, needed, body, None, agreed=True)


@collective_entry
def read_hdf5(path, group: str, grid: ProcessGrid | None = None, *, layout: str | None = None,
              row_sizes=None, col_sizes=None, block_size=None,
              driver: str | None = None) -> DistCSBMatrix:
    """Read the CSR group ``group`` of ``path`` (written by :func:`write_hdf5`, SciPy or
    h5sparse) into a :class:`DistCSBMatrix` on ``grid`` (collective; any number of ranks;
    ``layout``, ``row_sizes``, ``col_sizes``, ``block_size`` as for its constructors).
    Missing files or groups raise as :func:`disttensor.io.read_hdf5` does; a group that is not
    a CSR matrix raises ``ValueError`` on every rank."""
    grid = get_default_grid() if grid is None else grid
    comm = grid.cart
    with agreed(comm, "sparse.read_hdf5", path=arg_path(path), group=group, grid=grid,
                layout=layout, row_sizes=canon(row_sizes), col_sizes=canon(col_sizes),
                block_size=block_size, driver=driver):
        name = check_dataset_name(group, "group")
        driver = resolve_driver(driver)
        path = os.fspath(path)
    sess = ReadSession(path, comm, driver, agreed=True)
    try:
        with collective(comm):
            g = sess.f.get(name)
            if g is None or not hasattr(g, "keys"):
                get_dataset(sess.f, f"{name}/indptr", path)  # DatasetNotFoundError
                raise ValueError(f"{name!r} in {path!r} is not a group")
            for part in ("indptr", "indices", "data"):
                get_dataset(sess.f, f"{name}/{part}", path)
            if "shape" not in g.attrs:
                raise ValueError(f"group {name!r} in {path!r} has no 'shape' attribute")
            m, n = (int(s) for s in g.attrs["shape"])
            nptr, nnz = len(g["indptr"]), len(g["indices"])
            if nptr != m + 1 or len(g["data"]) != nnz:
                raise ValueError(f"group {name!r} in {path!r} is not a CSR matrix of shape "
                                 f"{(m, n)}: indptr has {nptr} entries, indices {nnz}, data "
                                 f"{len(g['data'])}")
            vdtype = g["data"].dtype
            off = offsets_from_sizes(balanced_sizes(m, comm.size))
            lo, hi = off[comm.rank], off[comm.rank + 1]
            ptr = np.empty(hi - lo + 1, dtype=np.int64)
        sess.read([(f"{name}/indptr", (lo,), None, ptr)])
        with collective(comm):
            if np.any(np.diff(ptr) < 0) or ptr[0] < 0 or ptr[-1] > nnz:
                raise ValueError(f"group {name!r} in {path!r}: indptr is not a valid row "
                                 f"pointer")
            cols = np.empty(int(ptr[-1] - ptr[0]), dtype=np.int64)
            vals = np.empty(len(cols), dtype=vdtype)
        sess.read([(f"{name}/indices", (int(ptr[0]),), None, cols),
                   (f"{name}/data", (int(ptr[0]),), None, vals)])
    finally:
        sess.close()
    rows = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(ptr))
    return DistCSBMatrix.from_local_coo(rows, cols, vals, (m, n), grid, layout=layout,
                                        row_sizes=row_sizes, col_sizes=col_sizes,
                                        block_size=block_size)
