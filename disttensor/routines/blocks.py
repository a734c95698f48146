"""Functions applied block by block: ``map_blocks`` (Dask's) and ``apply_along_axis`` (NumPy's).

Every function here is collective over the grid of its DistArray operands.  The user's
function runs on every rank, on that rank's block (empty blocks included: a rank whose block is
empty calls it on an empty array, as Dask calls a function on its empty ``meta``).  An
exception it raises on any rank is raised on every rank (the lowest failing rank's), and
blocks that cannot form one global array (a non-split axis whose extent differs between ranks,
different numbers of axes or dtypes) raise ``ValueError`` on every rank.  Results never share
memory with the operands (a block the function returned unchanged is copied).

:func:`assemble` is the shared last step (also used by
:func:`disttensor.routines.stencils.map_overlap`): one all-gather of every rank's outcome,
block shape and dtype, from which every rank decides alike.
"""
from __future__ import annotations

import inspect
import numbers

import numpy as np

from ..core.array import DistArray
from ..core.backend import array_module
from ..core.distribution import Distribution
from ..core.entry import agreed, canon, collective_entry, dtype_key, operand_key
from ._operands import axis_index, axis_tuple, check_array, cut_balanced, unsplit
from .ufuncs import align, elementwise_layout

__all__ = ["map_blocks", "apply_along_axis", "assemble", "call_local"]


def call_local(fn, *args, **kwargs):
    """``(result, None)`` or ``(None, exception)``: the user's function on this rank's data,
    its failure kept for :func:`assemble` (so that no rank leaves a collective its peers are
    in)."""
    try:
        return fn(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001 - raised on every rank by assemble()
        return None, e


def _as_block(r, operands):
    if r is None:
        return None
    xp = array_module(r) if hasattr(r, "shape") and hasattr(r, "dtype") else np
    r = xp.asarray(r)
    if any(np.may_share_memory(r, o) for o in operands
           if type(o) is type(r) and xp is np):
        r = r.copy()
    return r


def assemble(name: str, grid, local, err, out_split, *, dtype=None, expect=None,
             operands=()) -> DistArray:
    """The DistArray whose block on this rank is ``local`` (collective: one all-gather).

    ``out_split`` gives the grid axis of each result axis (``None``: whole on every rank; its
    extent must then be the same on every rank, and a split axis's extent the same on the
    ranks sharing a grid coordinate).  ``err`` (an exception or ``None``) is raised on every
    rank (the lowest failing rank's).  ``dtype``: cast every block to it; without it the
    blocks' dtypes must agree.  ``expect``: the Distribution the blocks must form (declared
    ``chunks=``).  ``operands``: local arrays the result must not share memory with."""
    from ..core.comm import _rebuild
    comm = grid.cart
    if err is None:
        try:
            local = _as_block(local, operands)
            if dtype is not None:
                local = local.astype(dtype, copy=False)
        except Exception as e:  # noqa: BLE001
            err = e
    mine = (None if err is not None else (tuple(local.shape), local.dtype.str),
            None if err is None else (type(err), str(err)))
    everyone = comm.allgather(mine) if comm.size > 1 else [mine]
    failed = [r for r, (_, e) in enumerate(everyone) if e is not None]
    if failed:
        first = failed[0]
        if first == comm.rank:
            raise err
        exc_type, msg = everyone[first][1]
        raise _rebuild(exc_type, f"{msg} (raised on rank {first})") from err
    shapes = [info for info, _ in everyone]
    nd = len(out_split)
    dims = grid.dims
    if any(len(s) != nd for s, _ in shapes):
        raise ValueError(f"{name}: the function returned blocks with {[len(s) for s, _ in shapes]}"
                         f" axes on ranks 0..{len(shapes) - 1}; the result needs {nd} (declare "
                         f"drop_axis=/new_axis= where the number of axes changes)")
    kinds = sorted({d for _, d in shapes})
    if len(kinds) > 1:
        raise ValueError(f"{name}: the function returned blocks of different dtypes "
                         f"{[np.dtype(d).name for _, d in shapes]} on ranks 0..{len(shapes) - 1};"
                         f" pass dtype= to cast them to one")
    from ..core.distribution import rank_to_coords
    gshape, sizes = [], []
    for t, g in enumerate(out_split):
        if g is None:
            ext = [s[t] for s, _ in shapes]
            if len(set(ext)) != 1:
                raise ValueError(f"{name}: result blocks do not fit together: axis {t} is whole "
                                 f"on every rank but its extent differs between ranks "
                                 f"(by rank: {ext})")
            gshape.append(ext[0])
            sizes.append(None)
            continue
        per: dict[int, int] = {}
        for r, (s, _) in enumerate(shapes):
            c = rank_to_coords(r, dims)[g]
            if per.setdefault(c, s[t]) != s[t]:
                raise ValueError(f"{name}: result blocks do not fit together: ranks at grid "
                                 f"coordinate {c} of grid axis {g} returned different extents "
                                 f"of axis {t}")
        sz = tuple(per[c] for c in range(dims[g]))
        gshape.append(sum(sz))
        sizes.append(sz)
    dist = Distribution(gshape, dims, out_split, sizes)
    if expect is not None and dist != expect:
        raise ValueError(f"{name}: the function's blocks form an array of shape {tuple(gshape)} "
                         f"with sizes {sizes}, not the declared chunks (shape {expect.shape}, "
                         f"sizes {expect.split_sizes})")
    return DistArray(local, dist, grid)


def _accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _declared(chunks, out_split, dims, nd_out):
    """The Distribution ``chunks=`` declares: per result axis an int (every block's extent) or
    a tuple (ownership sizes along the grid axis, or one extent for a whole axis)."""
    chunks = tuple(chunks)
    if len(chunks) != nd_out:
        raise ValueError(f"chunks {chunks} needs one entry per result axis ({nd_out})")
    shape, sizes = [], []
    for t, (c, g) in enumerate(zip(chunks, out_split)):
        p = 1 if g is None else dims[g]
        sz = (int(c),) * p if isinstance(c, numbers.Integral) else tuple(int(v) for v in c)
        if len(sz) != p:
            raise ValueError(f"chunks[{t}] = {c} needs {p} block extents")
        shape.append(sum(sz))
        sizes.append(None if g is None else sz)
    return Distribution(shape, dims, out_split, sizes)


def _aligned(a: DistArray, dist: Distribution) -> Distribution:
    """The distribution :func:`~disttensor.routines.ufuncs.align` gives operand ``a``."""
    split, sizes = [], []
    for i in range(a.ndim):
        j = i + dist.ndim - a.ndim
        if a.shape[i] == dist.shape[j] and dist.split[j] is not None:
            split.append(dist.split[j])
            sizes.append(dist.sizes(j))
        else:
            split.append(None)
            sizes.append(None)
    return Distribution(a.shape, dist.grid_dims, split, sizes)


def _block_info(dist, grid, arrays, out: Distribution | None, dtype):
    def info(d):
        coords = tuple(d.axis_coord(t, grid.coords) for t in range(d.ndim))
        box = d.block_box(grid.coords)
        return {"shape": d.shape, "num-chunks": tuple(len(o) - 1 for o in d.offsets),
                "chunk-location": coords,
                "array-location": list(zip(box.start, box.stop))}
    res = {i: info(d) for i, d in arrays}
    if out is not None:
        res[None] = dict(info(out), **{"chunk-shape": out.block_shape(grid.coords),
                                       "dtype": dtype})
    return res


@collective_entry
def map_blocks(fn, *args, dtype=None, chunks=None, drop_axis=None, new_axis=None, **kwargs):
    """``fn`` applied to every rank's block(s), Dask's ``map_blocks`` (collective).

    The DistArray arguments are aligned block to block by the library's rule for mixed layouts
    (the layout of the first one of the broadcast shape; the others redistributed to it, see
    :mod:`disttensor.core.array`); every other argument, and ``kwargs``, reach ``fn`` as they
    are (replicated values, the same on every rank).

    Result layout: each result axis keeps the split of the input axis it comes from.
    ``drop_axis`` (input axes ``fn`` removes) are first made whole on every rank (Dask
    concatenates the blocks along them); ``new_axis`` (positions in the result) are whole on
    every rank.  The ownership sizes come from the returned blocks' extents (one all-gather),
    or are declared with ``chunks=``: per result axis an int (every block's extent) or a tuple
    of the blocks' extents along its grid axis.  ``dtype=`` casts every block to it (Dask:
    metadata only); without it the blocks' dtypes must agree.  Raises ``ValueError`` on every
    rank for blocks that do not fit together or do not match ``chunks``.

    If ``fn`` has a parameter ``block_info`` it receives Dask's dict: for each DistArray
    argument (key: its position in ``args``) ``shape``, ``num-chunks``, ``chunk-location`` and
    ``array-location`` (the global ``(start, stop)`` of the block per axis, after alignment),
    and under ``None`` the same for the result plus ``chunk-shape`` and ``dtype`` when
    ``chunks=`` declares it.  A parameter ``block_id`` receives the block's coordinates.

    Differences from Dask: ``fn`` runs eagerly, once per rank; no ``meta``/``name``/``token``;
    the NumPy arrays among ``args`` are not cut into blocks."""
    arrays = [(i, a) for i, a in enumerate(args) if isinstance(a, DistArray)]
    anchor = arrays[0][1] if arrays else None
    comm = None if anchor is None else anchor.grid.cart
    with agreed(comm, "map_blocks", fn=fn, args=tuple(operand_key(a) for a in args),
                dtype=dtype_key(dtype), chunks=canon(chunks), drop_axis=canon(drop_axis),
                new_axis=canon(new_axis), kwargs={k: operand_key(v) for k, v in kwargs.items()}):
        if anchor is None:
            raise TypeError("map_blocks needs at least one DistArray argument")
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        if any(isinstance(v, DistArray) for v in kwargs.values()):
            raise TypeError("map_blocks: pass DistArrays positionally (keyword arguments reach "
                            "fn as they are)")
        grid, dist, _device = elementwise_layout([a for _, a in arrays])
        nd = dist.ndim
        drop = axis_tuple(() if drop_axis is None else drop_axis, nd)
        split = [g for t, g in enumerate(dist.split) if t not in drop]
        n_out = len(split) + len(() if new_axis is None else np.atleast_1d(new_axis))
        new = axis_tuple(() if new_axis is None else new_axis, n_out)
        for t in sorted(new):
            split.insert(t, None)
        out_dist = None if chunks is None else _declared(chunks, split, grid.dims, n_out)
    if drop:
        keep = [None if (t in drop or g is None) else dist.sizes(t)
                for t, g in enumerate(dist.split)]
        dist = Distribution(dist.shape, dist.grid_dims,
                            [None if t in drop else g for t, g in enumerate(dist.split)], keep)
    locs = list(args)
    for i, a in arrays:
        locs[i] = align(a, grid, dist, a.device)
    extra = {}
    if _accepts(fn, "block_info"):
        extra["block_info"] = _block_info(
            dist, grid, [(i, _aligned(a, dist)) for i, a in arrays], out_dist, dtype_key(dtype))
    if _accepts(fn, "block_id"):
        extra["block_id"] = tuple(dist.axis_coord(t, grid.coords) for t in range(nd))
    r, err = call_local(fn, *locs, **kwargs, **extra)
    return assemble("map_blocks", grid, r, err, tuple(split), dtype=dtype_key(dtype),
                    expect=out_dist, operands=[locs[i] for i, _ in arrays])


@collective_entry
def apply_along_axis(func1d, axis, arr, *args, **kwargs):
    """NumPy's ``apply_along_axis`` (collective): ``func1d`` on every 1-D slice of ``arr``
    along ``axis``; the result has shape ``arr.shape[:axis] + r.shape + arr.shape[axis+1:]``
    for ``func1d``'s result ``r``.

    ``axis`` is made whole on every rank first (a redistribution when it is split), and each
    rank applies NumPy's ``apply_along_axis`` to its block.  Result layout: the other axes keep
    ``arr``'s split and sizes; ``func1d``'s axes are whole, except that the first of them is
    cut again over the grid axis that split ``axis`` (balanced, without messages; exactly
    ``arr``'s layout when ``func1d`` keeps the length).  ``func1d`` must return the same shape
    on every rank (``ValueError`` on every rank otherwise); the dtype is that of the lowest
    rank with a non-empty block (NumPy: of the first slice).  Ranks whose block has no slices
    do not call ``func1d``."""
    with agreed(None if not isinstance(arr, DistArray) else arr.grid.cart, "apply_along_axis",
                func1d=func1d, axis=canon(axis), arr=operand_key(arr),
                args=tuple(operand_key(a) for a in args),
                kwargs={k: operand_key(v) for k, v in kwargs.items()}):
        check_array(arr, "arr")
        nd = arr.ndim
        ax = axis_index(axis, nd)
        if any(n == 0 for t, n in enumerate(arr.shape) if t != ax):
            raise ValueError("Cannot apply_along_axis when any iteration dimensions are 0")
    g = arr.distribution.split[ax]
    whole = unsplit(arr, (ax,))
    local = whole.local
    grid = arr.grid
    comm = grid.cart
    iterates = all(n > 0 for t, n in enumerate(local.shape) if t != ax)
    r, err = call_local(array_module(local).apply_along_axis, func1d, ax, local, *args,
                        **kwargs) if iterates else (None, None)
    if r is not None:
        r = array_module(r).asarray(r)
        res = (tuple(r.shape[ax:ax + r.ndim - nd + 1]), r.dtype.str)
    else:
        res = None
    outcome = comm.allgather((res, None if err is None else (type(err), str(err)))) \
        if comm.size > 1 else [(res, None if err is None else (type(err), str(err)))]
    from ..core.comm import _rebuild
    bad = [k for k, (_, e) in enumerate(outcome) if e is not None]
    if bad:
        if bad[0] == comm.rank:
            raise err
        exc_type, msg = outcome[bad[0]][1]
        raise _rebuild(exc_type, f"{msg} (raised on rank {bad[0]})") from err
    kinds = [o for o, _ in outcome if o is not None]
    if len({s for s, _ in kinds}) > 1:
        raise ValueError(f"apply_along_axis: func1d returned different shapes on different ranks"
                         f" ({[s for s, _ in kinds]}); it must return one shape for every slice")
    res_shape, rdtype = kinds[0]
    rdtype = np.dtype(rdtype)
    before, after = local.shape[:ax], local.shape[ax + 1:]
    xp = array_module(local)
    r = xp.empty(before + res_shape + after, dtype=rdtype) if r is None else \
        r.astype(rdtype, copy=False)
    d = whole.distribution
    k = len(res_shape)
    out_split = list(d.split[:ax]) + [None] * k + list(d.split[ax + 1:])
    out_sizes = [d.sizes(t) if s is not None else None for t, s in enumerate(d.split)]
    out_sizes = out_sizes[:ax] + [None] * k + out_sizes[ax + 1:]
    shape = arr.shape[:ax] + res_shape + arr.shape[ax + 1:]
    out_d = Distribution(shape, d.grid_dims, out_split, out_sizes)
    if g is None or k == 0:
        return DistArray(r, out_d, grid)  # a new array (np.ascontiguousarray makes 0-d 1-d)
    out = cut_balanced(r, shape, out_d, grid, {ax: g})
    if res_shape[0] == arr.shape[ax] and k == 1 and out.distribution != arr.distribution:
        out = out.redistribute(distribution=arr.distribution)
    return out
