"""Checkpoints: a named collection of DistArrays, small host arrays and scalars in one HDF5
file (no pickle), written atomically and loadable on another grid.

File layout (format ``disttensor.checkpoint``, version 1)::

    /                 attrs: format, version
    /arrays/<name>    one dataset per DistArray, the global array; attrs dt_shape,
                      dt_grid_dims, dt_split (-1 = not split), dt_offsets (JSON ownership
                      offsets per axis): the distribution it was written with
    /host/<name>      one dataset per host array (written by rank 0)
    /scalars          group whose attributes are the scalars (int -> int64, float -> float64,
                      bool -> bool, str -> UTF-8 string)

Names may contain ``/`` (nested groups, e.g. ``"model/conv1/weight"``).

Atomicity: the file is written to a temporary file in the same directory
(``.{name}.{host}.{pid}.{random}.tmp``), flushed, and renamed over ``path`` by rank 0 only after
every rank finished without error (``os.replace``), so a crash or error mid-write never loses
the previous checkpoint at ``path``.  A save that was killed leaves its temporary file behind;
the next save to the same path removes it (rank 0, before it creates its own) once it is stale:
its writer ran on this host and that process is gone, or it ran on another host and the file
has not been modified for ``DISTTENSOR_STALE_TMP_AGE`` seconds (default 3600).  Temporary files
of a save still running are never touched.

Agreement: both functions compare their arguments across the ranks before any file is opened
(:mod:`disttensor.core.agreement`): path, driver, the array names with their distributions and
dtypes, host array names with shapes and dtypes, scalar names and values (``save``); path,
driver, device, grid and splits (``load``).  One that differs raises
:class:`~disttensor.core.agreement.ArgumentMismatchError` on every rank.
"""
from __future__ import annotations

import math
import numbers
import os

import numpy as np

from ..core.array import DistArray
from ..core.layout import default_split
from ..core.backend import to_host, xp_for
from ..core.comm import collective
from ..core.distribution import Distribution
from ..core.grid import ProcessGrid, get_default_grid
from ._args import arg_path, usable_device
from ._atomic import atomic_update
from ._h5file import (check_file, dataset_meta, drain_background_reads, h5py, open_file,
                      resolve_driver, root_call, storable_dtype)
from ._sessions import DatasetSpec, ReadSession, WriteSession, c_contiguous
from .layout import check_dataset_name, decode_distribution, encode_distribution, is_writer

__all__ = ["save_checkpoint", "load_checkpoint", "FORMAT", "VERSION"]

FORMAT = "disttensor.checkpoint"
VERSION = 1


def _scalar_value(name, v):
    if isinstance(v, (bool, np.bool_)):
        return np.bool_(v)
    if isinstance(v, numbers.Integral):
        v = int(v)
        if not -2**63 <= v < 2**63:
            raise ValueError(f"scalar {name!r} = {v} does not fit in int64; store it as a str")
        return np.int64(v)
    if isinstance(v, numbers.Real):
        return np.float64(v)
    if isinstance(v, str):
        return v
    raise TypeError(f"scalar {name!r} must be an int, float, bool or str, got "
                    f"{type(v).__name__}")


def _from_attr(v):
    if isinstance(v, (bytes, np.bytes_)):
        return v.decode()
    if isinstance(v, str):
        return v
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


def save_checkpoint(path, arrays: dict | None = None, host: dict | None = None,
                    scalars: dict | None = None, *, grid: ProcessGrid | None = None,
                    driver: str | None = None) -> None:
    """Save a checkpoint (collective over the arrays' communicator).

    Parameters
    ----------
    arrays : ``{name: DistArray}``; all on grids over the same ranks (their shapes may differ).
        Each is stored as its global array plus the distribution it had.
    host : ``{name: array-like}`` small arrays that every rank holds identically (optimizer
        hyper-parameters, RNG state vectors, ...); rank 0's copy is written.
    scalars : ``{name: int | float | bool | str}`` (e.g. step, epoch, seeds, a JSON string).
    grid : the grid whose communicator takes part when ``arrays`` is empty (default grid).
    driver : ``'mpio'``, ``'independent'`` or ``None`` (see :mod:`disttensor.io.hdf5`).

    Every rank must pass the same names, shapes, dtypes, distributions and scalar values
    (checked, ``ValueError`` on every rank otherwise).
    """
    drain_background_reads()
    arrays = dict(arrays or {})
    host = dict(host or {})
    scalars = dict(scalars or {})
    first = next(iter(arrays.values()), None)
    if grid is None:
        grid = first.grid if isinstance(first, DistArray) else get_default_grid()
    comm = grid.cart
    with collective(comm, "save_checkpoint", path=arg_path(path), arrays=arrays, host=host,
                    scalars=scalars, grid=None if arrays else grid, driver=driver):
        driver = resolve_driver(driver)
        for kind, d in (("array", arrays), ("host array", host), ("scalar", scalars)):
            for n in d:
                if not isinstance(n, str) or not n:
                    raise ValueError(f"{kind} names must be non-empty str, got {n!r}")
                if kind != "scalar":  # scalars are attributes: any name
                    check_dataset_name(n, kind)
        for n, x in arrays.items():
            if not isinstance(x, DistArray):
                raise TypeError(f"arrays[{n!r}] must be a DistArray, got {type(x).__name__}")
            if not x.grid.compatible(grid):
                raise ValueError(f"arrays[{n!r}] lives on a grid over other ranks than "
                                 f"the checkpoint's communicator")
            storable_dtype(x.dtype)
        host_np = {n: c_contiguous(to_host(v) if hasattr(v, "get") else v)
                   for n, v in host.items()}
        for n, v in host_np.items():
            storable_dtype(v.dtype)
        svals = {n: _scalar_value(n, v) for n, v in scalars.items()}

    names = sorted(arrays)
    specs, parts = [], []
    with collective(comm):
        for n in names:
            x = arrays[n]
            dist = x.distribution
            specs.append(DatasetSpec("arrays/" + check_dataset_name(n), x.shape,
                                     np.dtype(x.dtype), attrs=encode_distribution(dist)))
            writer = is_writer(dist, x.grid.coords)
            parts.append(("arrays/" + check_dataset_name(n), dist.block_box(x.grid.coords).start,
                          c_contiguous(to_host(x.local)) if writer else None))
        for n in sorted(host_np):
            v = host_np[n]
            specs.append(DatasetSpec("host/" + check_dataset_name(n), v.shape, v.dtype))
            parts.append(("host/" + check_dataset_name(n), (0,) * v.ndim,
                          v if comm.rank == 0 else None))

    def header(f):
        f.attrs["format"] = FORMAT
        f.attrs["version"] = VERSION
        f.require_group("arrays")
        f.require_group("host")
        g = f.require_group("scalars")
        for k in sorted(svals):
            g.attrs[k] = svals[k]

    def body(sess: WriteSession):
        sess.metadata(header)
        sess.create(specs)
        sess.write(parts)

    needed = sum(math.prod(arrays[n].shape) * arrays[n].dtype.itemsize for n in names) + \
        sum(v.nbytes for v in host_np.values())
    atomic_update(comm, path, driver, "w", True, needed, body, agreed=True)


def _read_meta(path):
    p = check_file(path, "checkpoint")
    with open_file(p, "r") as f:
        if f.attrs.get("format") != FORMAT:
            raise ValueError(f"{p!r} is an HDF5 file but not a disttensor checkpoint "
                             f"(no format={FORMAT!r} attribute)")
        version = int(f.attrs.get("version", -1))
        if version > VERSION:
            raise ValueError(f"{p!r} is a checkpoint of format version {version}; this "
                             f"disttensor reads versions <= {VERSION}")

        def datasets(group):
            out = {}
            if group not in f:
                return out

            def visit(name, obj):
                if isinstance(obj, h5py.Dataset):
                    out[name] = obj
            f[group].visititems(visit)
            return out

        arrays = {}
        for n, d in datasets("arrays").items():
            m = dataset_meta(d)
            # broadcast the attributes, not a Distribution: a Distribution unpickled in another
            # process compares unequal to an identical one (it keeps the sender's hash)
            m["dist_attrs"] = {k: d.attrs[k] for k in encode_distribution(
                Distribution((), (1,))) if k in d.attrs}
            dist = decode_distribution(m["dist_attrs"])
            if dist.shape != m["shape"]:
                raise ValueError(f"checkpoint {p!r}: array {n!r} has shape {m['shape']} but "
                                 f"its distribution attributes say {dist.shape}")
            arrays[n] = m
        host = {n: dataset_meta(d) for n, d in datasets("host").items()}
        scalars = {k: _from_attr(v) for k, v in f["scalars"].attrs.items()} \
            if "scalars" in f else {}
    return arrays, host, scalars


def load_checkpoint(path, grid: ProcessGrid | None = None, split: dict | None = None, *,
                    driver: str | None = None, device: str = "cpu"):
    """Load a checkpoint written by :func:`save_checkpoint` (collective over the grid).

    Returns ``(arrays, host, scalars)``: ``{name: DistArray}``, ``{name: numpy array}`` (on
    every rank) and ``{name: int | float | bool | str}``.

    Distribution of each loaded array:

    * grid: ``grid`` if given, else a grid of the shape the array was saved on over the
      default grid's communicator (the default grid itself when it has that shape) if the
      communicator's size allows, else the default grid.
    * split: ``split[name]`` if ``split`` (a dict) names the array, else the saved split when
      it fits the grid, else the default split.
    * ownership sizes: the saved ones when grid shape and split are the saved ones (so an
      unbalanced distribution comes back exactly), else balanced.

    Each rank reads only its own block (collective transfers with ``mpio``), so a checkpoint
    written on one grid loads on any other.
    """
    drain_background_reads()
    if grid is not None and not isinstance(grid, ProcessGrid):
        raise TypeError(f"grid must be a ProcessGrid, got {type(grid).__name__}")
    base = grid if grid is not None else get_default_grid()
    comm = base.cart
    with collective(comm, "load_checkpoint", path=arg_path(path), grid=base, split=split,
                    driver=driver, device=device):
        driver = resolve_driver(driver)
        device = usable_device(device)
        if split is not None and not isinstance(split, dict):
            raise TypeError("split must be None or a dict {array name: split}")
        path = os.fspath(path)
    ameta, hmeta, scalars = root_call(comm, lambda: _read_meta(path))
    with collective(comm):
        unknown = sorted(set(split or {}) - set(ameta))
        if unknown:
            raise ValueError(f"split names arrays the checkpoint does not hold: {unknown}")

    grids: dict[tuple[int, ...], ProcessGrid] = {}

    def grid_for(dims):
        if grid is not None:
            return grid
        if tuple(dims) == base.dims:
            return base
        if math.prod(dims) != comm.size:
            return base
        if dims not in grids:
            grids[dims] = ProcessGrid(dims, comm=base.comm)
        return grids[dims]

    plan = []
    for n in sorted(ameta):
        m = ameta[n]
        saved: Distribution = decode_distribution(m["dist_attrs"])
        g = grid_for(saved.grid_dims)
        with collective(comm):
            if split is not None and n in split:
                s = split[n]
                s = tuple(s) + (None,) * (len(saved.shape) - len(tuple(s)))
            elif all(a is None or a < g.ndim for a in saved.split):
                s = saved.split
            else:
                s = default_split(len(saved.shape), g)
            if g.dims == saved.grid_dims and tuple(s) == saved.split:
                dist = saved
            else:
                dist = Distribution(saved.shape, g.dims, s)
            box = dist.block_box(g.coords)
            local = np.empty(box.shape, dtype=m["dtype"])
        plan.append((n, g, dist, box.start, local))
    with collective(comm):
        hosts = {n: np.empty(m["shape"], dtype=m["dtype"]) for n, m in hmeta.items()}

    sess = ReadSession(path, comm, driver, agreed=True)
    try:
        sess.read([("arrays/" + n, start, None, local) for n, _, _, start, local in plan] +
                  [("host/" + n, (0,) * a.ndim, None, a) for n, a in sorted(hosts.items())])
    finally:
        sess.close()
    xp = xp_for(device)
    arrays = {n: DistArray(local if xp is np else xp.asarray(local), dist, g)
              for n, g, dist, _, local in plan}
    return arrays, hosts, scalars
