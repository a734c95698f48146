"""Parallel ``.npy`` files: :func:`save` and :func:`load` of DistArrays (positional I/O).

File format: NumPy's ``.npy`` (format version 1.0, or 2.0 when the header is longer than
65535 bytes), C order, the array's dtype in native byte order.  Any ``.npy`` file of version
1.0 or 2.0 (C or Fortran order, either byte order, no object dtype) can be loaded.

Algorithm
---------
The header is a pure function of the shape and dtype, so every rank knows its length and
thus the data offset without communication.  Rank 0 creates the file with the header and its
full length; then every rank writes its block with positional writes (``os.pwrite``): the
block is cut into the longest runs that are contiguous in the global C-order array (the
trailing axes the block spans whole, times the first partial axis), one write per run, so a
block split only along axis 0 is one write and a block split along the last axis is one write
per row.  Replicated blocks are written once: only the replica at coordinate 0 along the
replication grid axes writes.  ``load`` maps the file read-only (``numpy.load`` with
``mmap_mode='r'``) and copies its block out of the map: every distribution, Fortran order and
either byte order come for free, and each rank touches only the pages of its block.

Why not MPI-IO file views: collective ``MPI_File_write_all`` through a subarray file view
aborts in ROMIO's type flattening ("Out of memory in file adio/common/flatten.c") in the
MPICH 4.0.2 build of this project's environment (configured ``--without-yaksa``), even for a
2-rank 4x3 example; positional I/O needs only a shared POSIX file system, as
:mod:`disttensor.io` already does.

Atomicity
---------
``save`` writes a hidden temporary file next to ``path`` (the name and stale-file cleanup of
:mod:`disttensor.io`, see :func:`disttensor.io._temps.temp_path_for`), and rank 0 renames it
over ``path`` only after every rank's write succeeded; on any failure the temporary file is
removed and ``path`` keeps its previous content.  Errors (an unwritable directory, a missing
or malformed file, an object dtype) are raised on every rank.

Both calls are collective over the array's (``load``: the given) grid; the ranks agree on the
path and the layout arguments.
"""
from __future__ import annotations

import os

import numpy as np

from ..core.array import DistArray
from ..core.layout import make_distribution
from ..core.entry import agreed, canon, collective_entry, split_key
from ..core.backend import to_host
from ..core.comm import collective
from ..core.grid import get_default_grid

__all__ = ["save", "load", "header_bytes"]


def header_bytes(shape, dtype, fortran_order: bool = False) -> bytes:
    """The complete ``.npy`` header (magic, version, length, dict, padding) that NumPy writes
    for an array of ``shape`` and ``dtype`` (pure; its length is the data offset)."""
    import io
    from numpy.lib import format as fmt
    d = {"descr": fmt.dtype_to_descr(np.dtype(dtype)), "fortran_order": bool(fortran_order),
         "shape": tuple(int(n) for n in shape)}
    buf = io.BytesIO()
    try:
        fmt.write_array_header_1_0(buf, d)
    except ValueError:  # header longer than 65535 bytes: format 2.0
        buf = io.BytesIO()
        fmt.write_array_header_2_0(buf, d)
    return buf.getvalue()


def runs(shape, box):
    """``(start, count)`` pairs, in elements of the global C-order array of ``shape``, of the
    contiguous runs that make up ``box`` (pure; nothing for an empty box)."""
    shape = tuple(shape)
    if any(n == 0 for n in box.shape):
        return []
    if not shape:
        return [(0, 1)]
    nd = len(shape)
    k = nd - 1  # axes after k are spanned whole
    while k > 0 and box.shape[k] == shape[k]:
        k -= 1
    inner = int(np.prod(shape[k + 1:], dtype=np.int64))
    count = box.shape[k] * inner
    strides = [int(np.prod(shape[t + 1:], dtype=np.int64)) for t in range(nd)]
    out = []
    for idx in np.ndindex(*box.shape[:k]):
        start = sum((box.start[t] + i) * strides[t] for t, i in enumerate(idx))
        out.append((start + box.start[k] * strides[k], count))
    return out


def _pwrite_all(fd, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while len(view):
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _writer(x: DistArray) -> bool:
    """Whether this rank writes its block: coordinate 0 along every replication axis."""
    return all(x.grid.coords[g] == 0 for g in x.distribution.replicated_grid_axes)


@collective_entry
def save(path, x: DistArray) -> None:
    """Collective: write ``x`` to the ``.npy`` file ``path`` (replaced atomically)."""
    from ..io._temps import remove_stale_temps_for, temp_path_for, _release
    if not isinstance(x, DistArray):
        raise TypeError(f"save needs a DistArray, got {type(x).__name__}")
    comm = x.grid.cart
    spelled = os.fspath(path) if isinstance(path, (str, os.PathLike)) else type(path).__name__
    with agreed(comm, "npyio.save", path=spelled, x=x):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"save needs a path (str or os.PathLike), got "
                            f"{type(path).__name__}: the ranks write the file in parallel")
        path = os.fspath(path)
        if x.dtype.hasobject:
            raise ValueError("cannot save an array of object dtype")
        d = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(d):
            raise FileNotFoundError(f"directory {d!r} does not exist")
    tmp = None
    with collective(comm):
        if comm.rank == 0:
            try:
                remove_stale_temps_for(path)
            except Exception:  # noqa: BLE001 - cleanup of others' leftovers is best effort
                pass
            tmp = temp_path_for(path)
    tmp = comm.bcast(tmp, root=0)
    header = header_bytes(x.shape, x.dtype)
    nbytes = len(header) + x.size * x.dtype.itemsize
    try:
        with collective(comm):
            if comm.rank == 0:
                with open(tmp, "wb") as f:
                    f.write(header)
                    f.truncate(nbytes)
        with collective(comm):
            if _writer(x):
                block = np.ascontiguousarray(to_host(x.local)).reshape(-1).view(np.uint8)
                item = x.dtype.itemsize
                fd = os.open(tmp, os.O_WRONLY)
                try:
                    done = 0
                    for start, count in runs(x.shape, x.distribution.block_box(x.grid.coords)):
                        _pwrite_all(fd, block[done:done + count * item],
                                    len(header) + start * item)
                        done += count * item
                    os.fsync(fd)
                finally:
                    os.close(fd)
        with collective(comm):
            if comm.rank == 0:
                os.replace(tmp, path)
    except BaseException:
        if comm.rank == 0 and os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        if comm.rank == 0:
            _release(tmp)


def _read_header(path):
    from numpy.lib import format as fmt
    with open(path, "rb") as f:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(f"{path}: .npy format version {version} is not supported")
        offset = f.tell()
    if dtype.hasobject:
        raise ValueError(f"{path}: object arrays cannot be loaded in parallel")
    size = os.path.getsize(path)
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size < need:
        raise ValueError(f"{path}: file is truncated ({size} bytes, the header promises {need})")
    return tuple(shape), bool(fortran), dtype.str, offset


@collective_entry
def load(path, grid=None, split=None, sizes=None) -> DistArray:
    """Collective: the array in the ``.npy`` file ``path`` as a DistArray on ``grid`` (default
    grid) with ``split``/``sizes`` (default split).  Rank 0 reads the header and broadcasts
    it; every rank reads its own block with one collective MPI-IO read.  A Fortran-order file
    is read as its C-order transpose and transposed back (metadata only): the result then has
    the requested layout of the transposed axes."""
    g = get_default_grid() if grid is None else grid
    comm = g.cart
    path = os.fspath(path)
    meta = None
    with agreed(comm, "npyio.load", path=path, grid=g, split=canon(split), sizes=canon(sizes)):
        if comm.rank == 0:
            meta = _read_header(path)
    shape, fortran, descr, offset = comm.bcast(meta, root=0)
    dtype = np.dtype(descr)
    with collective(comm):
        nd = len(shape)
        _, dist = make_distribution(shape, g, split_key(split, nd) if split is not None else None,
                                    sizes)
    with collective(comm):
        m = np.load(path, mmap_mode="r", allow_pickle=False)
        if m.shape != tuple(shape) or m.dtype != dtype:
            raise ValueError(f"{path} changed while it was being loaded")
        block = m[dist.block_slices(g.coords) + (Ellipsis,)]
        out = np.array(block, dtype=dtype.newbyteorder("="), order="C")
        del m, block
    return DistArray(out, dist, g)
