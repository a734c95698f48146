"""Parallel Zarr v3 reads and writes of DistArrays (``zarr`` 3.x, the optional extra
``disttensor[zarr]``): every rank transfers exactly its own block, no rank holds the array.

Stores
------
``store`` is a directory (Zarr's local store).  ``name=None``: the store *is* the array
(``zarr.open_array(store)``).  ``name="x"`` (or ``"a/b"``): the store is a group and the array
is its member ``name`` (``zarr.open_group(store)[name]``); other members are kept.

Chunk-aligned writes
--------------------
Zarr stores every chunk as one object, so two ranks writing parts of the same chunk would
overwrite each other's.  :func:`write_zarr` therefore writes with a chunk grid in which every
chunk lies inside one rank's block (:func:`aligned_chunks`): along each axis the chunk extent
divides every interior block boundary.  ``chunks=None`` takes the greatest common divisor of
the boundaries (the block size for balanced blocks), reduced to at most
:data:`TARGET_CHUNK_BYTES` per chunk by dividing it; when that divisor would be small (less
than half the balanced block: uneven blocks such as 4,3,3 give 1), the array is first
**redistributed** (``x.redistribute``, point-to-point messages) to a chunk-aligned
distribution over the same grid, whose blocks are whole numbers of chunks of the balanced
block size (``ceil(n / p)``; 10 over 3 ranks: blocks 4,4,2, chunks of 4).  Explicit
``chunks=`` are used as given; if the array's block boundaries are not multiples of them it
is redistributed the same way (:func:`aligned_distribution`).  Replicated blocks are written
once (the replica at coordinate 0 along the replication grid axes), empty blocks not at all.

Compression: ``compressors='zstd'`` (default: ``ZstdCodec(level=3)``), ``'blosc'`` (Blosc
with zstd and byte shuffling), ``None`` (raw chunks) or a zarr codec / sequence of codecs.

Atomicity
---------
The array is written to a hidden temporary directory next to its target
(``.{name}.{host}.{pid}.{random}.tmp``, see :mod:`disttensor.io`), which rank 0 renames over
the target once every rank has written its chunks without error.  Any failure removes the
temporary directory and leaves a previous array untouched.  Replacing an existing array takes
two renames (the old directory to a hidden backup name, the new one into place, then the backup
is removed): a crash exactly between them leaves the target missing and the previous array
in the backup directory.  The temporary directories a killed write left behind are removed by
the next write of the same node once they are stale (:func:`remove_stale_temp_dirs`, the
rules of :mod:`disttensor.io` for temporary files, applied to their ``zarr.json``).  Chunk files are not fsynced one by one.  A path that exists but is
not a Zarr node (no ``zarr.json``) is never replaced (``FileExistsError``).

Collective
----------
Both functions are collective over the grid's communicator; their arguments are agreed across
the ranks first (:mod:`disttensor.core.agreement`) and every error (a missing store, a group
where an array was asked for, a shape or dtype other than the expected one, zarr not installed)
is raised on every rank.
"""
from __future__ import annotations

import math
import os
import shutil

import numpy as np

from ..core.array import DistArray
from ..core.backend import to_host, xp_for
from ..core.comm import collective
from ..core.distribution import Distribution, balanced_sizes
from ..core.grid import get_default_grid
from ..core.layout import make_distribution
from ._args import arg_attrs, arg_dtype, arg_path, usable_device
from ._atomic import replace_directory
from ._h5file import root_call
from ._temps import (_inflight, _inflight_lock, _release, parse_temp_name, temp_is_stale,
                     temp_path_for)
from .layout import (check_dataset_name, file_hyperslab, is_writer, normalize_selection,
                     selection_shape)

__all__ = ["read_zarr", "write_zarr", "aligned_chunks", "aligned_distribution",
           "chunks_aligned", "zarr_available", "remove_stale_temp_dirs",
           "TARGET_CHUNK_BYTES"]

#: Upper bound of the bytes of one chunk chosen by ``chunks=None`` (before compression).
TARGET_CHUNK_BYTES = 8 << 20


def zarr_available() -> bool:
    """Whether ``zarr`` 3.x can be imported."""
    try:
        _zarr()
    except ImportError:
        return False
    return True


def _zarr():
    try:
        import zarr
    except ImportError:
        raise ImportError("Zarr I/O needs the 'zarr' package (3.x): pip install "
                          "'disttensor[zarr]'") from None
    if int(zarr.__version__.split(".")[0]) < 3:
        raise ImportError(f"Zarr I/O needs zarr 3.x, found {zarr.__version__}")
    return zarr


# -- chunk plans (pure) ----------------------------------------------------------------------
def _interior(offsets, n):
    return sorted({int(b) for b in offsets if 0 < b < n})


def chunks_aligned(dist: Distribution, chunks) -> bool:
    """Whether every block of ``dist`` is a union of whole chunks of extent ``chunks`` (every
    interior block boundary a multiple of the chunk extent along its axis)."""
    return all(b % c == 0 for o, n, c in zip(dist.offsets, dist.shape, chunks)
               for b in _interior(o, n))


def _cap(chunks, itemsize, target):
    """Divide chunk extents (largest first, by their largest proper divisor) until a chunk
    holds at most ``target`` bytes or no extent can shrink."""
    chunks = list(chunks)
    while math.prod(chunks) * itemsize > target:
        order = sorted(range(len(chunks)), key=lambda t: -chunks[t])
        for t in order:
            c = chunks[t]
            d = next((d for d in range(2, int(math.isqrt(c)) + 1) if c % d == 0), c)
            if c > 1:
                chunks[t] = c // d
                break
        else:
            break
    return tuple(chunks)


def aligned_chunks(dist: Distribution, itemsize: int = 1,
                   target: int = TARGET_CHUNK_BYTES) -> tuple[tuple[int, ...], bool]:
    """The default chunk shape for writing an array of distribution ``dist`` and whether the
    array must first be redistributed to :func:`aligned_distribution` (pure; see the module
    docstring).  Every extent is >= 1."""
    chunks, moved = [], False
    for t, (o, n) in enumerate(zip(dist.offsets, dist.shape)):
        inner = _interior(o, n)
        c = math.gcd(*inner) if inner else max(n, 1)
        blocks = len(o) - 1
        even = -(-n // blocks) if n else 1
        if inner and 2 * c < even:
            c, moved = even, True
        chunks.append(max(c, 1))
    # a divisor of an aligned extent is aligned too
    chunks = _cap(chunks, itemsize, target)
    return chunks, moved and not chunks_aligned(dist, chunks)


def aligned_distribution(dist: Distribution, chunks) -> Distribution:
    """``dist`` with its split axes' ownership sizes made whole numbers of chunks (the chunks
    balanced over the blocks, the last non-empty block shortened to the extent): a
    distribution over the same grid whose blocks are unions of chunks (pure)."""
    sizes = []
    for t, (n, g, c) in enumerate(zip(dist.shape, dist.split, chunks)):
        if g is None:
            sizes.append(None)
            continue
        per = [k * c for k in balanced_sizes(-(-n // c), dist.grid_dims[g])]
        excess = sum(per) - n
        for i in range(len(per) - 1, -1, -1):
            if per[i]:
                per[i] -= excess
                break
        sizes.append(per)
    return Distribution(dist.shape, dist.grid_dims, dist.split, sizes)


# -- codecs ------------------------------------------------------------------------------------
def _codecs(zarr, compressors):
    if compressors is None or compressors == "none":
        return None
    if compressors == "zstd":
        return (zarr.codecs.ZstdCodec(level=3),)
    if compressors == "blosc":
        return (zarr.codecs.BloscCodec(cname="zstd", clevel=5, shuffle="shuffle"),)
    if isinstance(compressors, str):
        raise ValueError(f"compressors must be 'zstd', 'blosc', None or zarr codecs, got "
                         f"{compressors!r}")
    return compressors


def _codec_key(compressors):
    return compressors if compressors is None or isinstance(compressors, str) \
        else repr(compressors)


def _target(store, name):
    store = os.path.abspath(os.fspath(store))
    return store, store if name is None else os.path.join(store, *name.split("/"))


def remove_stale_temp_dirs(path) -> list[str]:
    """Remove the temporary directories that killed writes of the Zarr node ``path`` left
    next to it (serial).  A directory counts as stale by the rules of
    :func:`~disttensor.io._temps.temp_is_stale` applied to its ``zarr.json`` (a dead writer on
    this host, or too old from another host); never one this process is writing."""
    d, b = os.path.split(os.path.abspath(os.fspath(path)))
    removed = []
    try:
        entries = list(os.scandir(d))
    except OSError:
        return removed
    for e in entries:
        if not (e.name.startswith(".") and e.name.endswith(".tmp")):
            continue
        parsed = parse_temp_name(e.name)
        if parsed is None or parsed.base != b or not e.is_dir(follow_symlinks=False):
            continue
        with _inflight_lock:
            if e.path in _inflight:
                continue
        meta = os.path.join(e.path, "zarr.json")
        if os.path.isfile(meta) and temp_is_stale(meta, parsed):
            shutil.rmtree(e.path, ignore_errors=True)
            removed.append(e.path)
    return removed


def _is_node(path) -> bool:
    return os.path.isfile(os.path.join(path, "zarr.json"))


def _open_array(zarr, store, name, path):
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no Zarr array {'' if name is None else repr(name) + ' '}"
                                f"in {store!r}: {path!r} does not exist")
    node = zarr.open(path, mode="r")
    if not isinstance(node, zarr.Array):
        raise ValueError(f"{path!r} is a Zarr group, not an array"
                         + ("" if name is not None else " (pass name= for a member)"))
    return node


# -- read ------------------------------------------------------------------------------------
def read_zarr(store, name: str | None = None, grid=None, split=None, sizes=None,
              slices=None, device: str = "cpu", *, dtype=None, shape=None) -> DistArray:
    """Read the Zarr array ``store`` (``name=None``) or its member ``name`` into a DistArray
    (collective over ``grid``; each rank reads only the chunks that meet its block).

    ``grid``, ``split``, ``sizes``: the result's distribution, as for :func:`disttensor.zeros`.
    ``slices``: optional global sub-selection (slices with step > 0), as in
    :func:`~disttensor.io.read_hdf5`.  ``dtype``, ``shape``: expectations: an array whose dtype or
    (whole) shape differs raises ``TypeError`` / ``ValueError`` on every rank.  Missing store
    or member: ``FileNotFoundError``; a group where an array was expected: ``ValueError``."""
    grid = get_default_grid() if grid is None else grid
    comm = getattr(grid, "cart", None)
    with collective(comm, "read_zarr", store=arg_path(store), name=name, grid=grid,
                    split=split, sizes=sizes, slices=slices, device=device,
                    dtype=arg_dtype(dtype), shape=shape):
        if comm is None:
            raise TypeError(f"grid must be a ProcessGrid, got {type(grid).__name__}")
        zarr = _zarr()
        if name is not None:
            name = check_dataset_name(name, "array")
        device = usable_device(device)
        if dtype is not None:
            dtype = np.dtype(dtype)
        store, path = _target(store, name)
    with collective(comm):
        arr = _open_array(zarr, store, name, path)
        fshape, fdtype = tuple(arr.shape), np.dtype(arr.dtype)
        if shape is not None and tuple(shape) != fshape:
            raise ValueError(f"Zarr array {path!r} has shape {fshape}, expected "
                             f"{tuple(shape)}")
        if dtype is not None and dtype != fdtype:
            raise TypeError(f"Zarr array {path!r} has dtype {fdtype}, expected {dtype}")
        sel = normalize_selection(slices, fshape)
        grid, dist = make_distribution(selection_shape(sel), grid, split, sizes)
        box = dist.block_box(grid.coords)
        start, stride, count = file_hyperslab(sel, box)
        if box.size == 0:
            host = np.empty(count, dtype=fdtype)
        else:
            key = tuple(slice(a, a + s * (c - 1) + 1, s) for a, s, c in zip(start, stride, count))
            host = np.ascontiguousarray(arr[key], dtype=fdtype).reshape(count)
    local = host if device == "cpu" else xp_for(device).asarray(host)
    return DistArray(local, dist, grid)


# -- write -----------------------------------------------------------------------------------
def write_zarr(x: DistArray, store, name: str | None = None, *, chunks=None,
               compressors="zstd", attrs: dict | None = None, atomic: bool = True) -> tuple:
    """Write the DistArray ``x`` as the Zarr v3 array ``store`` (``name=None``) or as member
    ``name`` of the group ``store`` (created if missing; other members kept); an existing array
    there is replaced (collective over ``x.grid``).  Returns the chunk shape used.

    ``chunks``: the chunk shape (``None``: chosen from the distribution; see the module
    docstring for the alignment rule and when the array is redistributed first).
    ``compressors``: ``'zstd'`` (default), ``'blosc'``, ``None`` or zarr codecs.
    ``attrs``: JSON-able attributes stored with the array (same on every rank).
    ``atomic``: write a temporary directory and rename it into place (default); ``False``
    removes an existing array first and writes in place."""
    comm = getattr(getattr(x, "grid", None), "cart", None)
    with collective(comm, "write_zarr", x=x, store=arg_path(store), name=name, chunks=chunks,
                    compressors=_codec_key(compressors), attrs=arg_attrs(attrs),
                    atomic=atomic):
        if not isinstance(x, DistArray):
            raise TypeError(f"write_zarr needs a DistArray, got {type(x).__name__}")
        zarr = _zarr()
        if name is not None:
            name = check_dataset_name(name, "array")
        if x.dtype.hasobject:
            raise TypeError("cannot write an array of object dtype to Zarr")
        codecs = _codecs(zarr, compressors)
        dist = x.distribution
        if chunks is None:
            chunks = aligned_chunks(dist, x.dtype.itemsize)[0]
        else:
            chunks = tuple(int(c) for c in chunks)
            if len(chunks) != x.ndim or any(c < 1 for c in chunks):
                raise ValueError(f"chunks {chunks} must have one positive entry per axis of "
                                 f"the array (shape {x.shape})")
        move = not chunks_aligned(dist, chunks)
        attrs = dict(attrs or {})
        store, path = _target(store, name)
    if move:
        x = x.redistribute(distribution=aligned_distribution(dist, chunks))
        dist = x.distribution

    def prep():
        parent = os.path.dirname(store)
        if not os.path.isdir(parent):
            raise FileNotFoundError(f"directory {parent!r} does not exist (writing {store!r})")
        if name is not None:
            if os.path.exists(store) and not (os.path.isdir(store) and _is_node(store)):
                raise FileExistsError(f"{store!r} exists and is not a Zarr group")
            g = zarr.open_group(store, mode="a")
            for part in name.split("/")[:-1]:
                g = g.require_group(part)
        if os.path.exists(path) and not (os.path.isdir(path) and _is_node(path)):
            raise FileExistsError(f"{path!r} exists and is not a Zarr node; not replacing it")
        remove_stale_temp_dirs(path)
        if atomic:
            target = temp_path_for(path)
        else:
            target = path
            if os.path.exists(path):
                shutil.rmtree(path)
        zarr.create_array(store=target, shape=x.shape, chunks=chunks, dtype=x.dtype,
                          compressors=codecs, fill_value=0, attributes=attrs)
        return target

    target = root_call(comm, prep)
    try:
        with collective(comm):
            if is_writer(dist, x.grid.coords):
                arr = zarr.open_array(target, mode="r+")
                arr[dist.block_box(x.grid.coords).slices()] = to_host(x.local)

        if atomic:
            root_call(comm, lambda: replace_directory(target, path))
    except BaseException:
        if atomic and comm.rank == 0:
            shutil.rmtree(target, ignore_errors=True)
            _release(target)
        raise
    return tuple(chunks)
