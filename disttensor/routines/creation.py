"""Array creation routines (NumPy's "Array creation routines").

* From shape or value: ``empty``, ``zeros``, ``ones``, ``full``, ``eye`` and the ``*_like``
  forms (the ``*_like`` forms take the layout of their operand).
* From existing data: ``from_global``.
* Numerical ranges: ``arange``, ``linspace``, ``meshgrid``.
* Building matrices: ``tril``, ``triu`` (masks from global indices of the last two axes; the
  result has the operand's layout, no messages).

All are collective over the grid.  Those that create an array from nothing take
``grid=None`` (default grid), ``split=None`` (default split, see
:func:`disttensor.core.layout.default_split`), ``sizes=None`` (balanced ownership),
``device='cpu'`` and (the "from shape or value" ones) ``halo=None`` (no halo cells); values
come from global indices, so nothing moves.  ``meshgrid`` outputs have the result shape in
the default layout of ``grid`` (default: the first operand's grid); only aligning the 1-D
inputs moves data.

Each rank's block is allocated by :func:`disttensor.core.memory.allocate` inside the call's
agreed block, so a block too large for one rank (explicit uneven ``sizes``, a node short of
memory) raises ``MemoryError`` naming that rank and the bytes on every rank, at no extra
message (the failure rides on the call's agreement all-reduce; one small all-reduce where the
call is nested in another entry point).
"""
from __future__ import annotations

import math

import operator

import numpy as np

from ..core.array import DistArray
from ..core.layout import make_distribution, normalize_halo
from ..core.entry import (agreed, canon, collective_entry, device_key, dtype_key, halo_key,
    operand_key, split_key)
from ..core.backend import normalize_device, to_host, xp_for
from ..core.grid import ProcessGrid, get_default_grid
from ..core.comm import collective
from ..core.memory import allocate
from ._operands import anchor, check_array
from .ufuncs import align

__all__ = ["empty", "zeros", "ones", "full", "eye", "empty_like", "zeros_like", "ones_like",
           "full_like", "arange", "linspace", "meshgrid", "from_global", "tril", "triu",
           "local_index_grid"]


def _grid(grid) -> ProcessGrid:
    g = get_default_grid() if grid is None else grid
    if not isinstance(g, ProcessGrid):
        raise TypeError(f"grid must be a ProcessGrid, got {type(g).__name__}")
    return g


def shape_key(shape):
    """``n`` as ``(n,)``, sequences as tuples (for agreement; never raises)."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        return (int(shape),)
    return canon(shape)


def layout_args(shape, grid: ProcessGrid, split, sizes, device="cpu", halo=None,
                ndim: int | None = None) -> dict:
    """The layout arguments of a creation call as the ranks agree on them (``shape=None``
    with ``ndim``: a shape that follows from other agreed arguments)."""
    out = {}
    if shape is not None:
        out["shape"] = shape = shape_key(shape)
        ndim = len(shape) if isinstance(shape, tuple) else 0
    out.update(grid=grid, split=split_key(split, ndim), sizes=canon(sizes),
               device=device_key(device))
    if halo is not None:
        out["halo"] = halo_key(halo, ndim)
    return out


def _new_array(call: str, g: ProcessGrid, shape, dtype, split, sizes, device="cpu", halo=None,
               fill=None):
    """The layout of a creation call and its local buffer (``fill``: ``None`` uninitialised,
    else the value of every owned element; halo cells are zero).  Call it inside the call's
    agreed block with ``rank_local=True``: the allocation may fail on one rank only
    (:func:`disttensor.core.memory.allocate`) and that block makes every rank raise."""
    grid, dist = make_distribution(shape, g, split, sizes)
    xp = xp_for(normalize_device(device))
    h = normalize_halo(halo, dist.ndim)
    bshape = tuple(lo + n + hi for (lo, hi), n in zip(h, dist.block_shape(grid.coords)))
    haloed = any(lo or hi for lo, hi in h)
    buf = allocate(bshape, dtype, xp=xp, fill=0 if haloed and fill is not None else fill,
                   rank=g.cart.rank, call=call)
    x = DistArray(buf, dist, grid, h)
    if haloed and fill is not None and not (np.isscalar(fill) and fill == 0):
        x.local[...] = fill
    return x


# A creation call nested in another collective call (random's, reshape's, an op's output)
# agrees a failure of its allocation (one extra small all-reduce) only from this many bytes of
# the global array, or on a GPU (device memory is small and may be used by others): a
# per-layer op then keeps its one agreement, and the allocations that can realistically fail on
# one rank are still raised on every rank.  At the user's level the call's own agreement covers
# the allocation at no cost.  (Global sizes are agreed metadata: every rank decides alike.)
NESTED_GUARD_BYTES = 64 << 20


def _guard_nested(shape, dtype, device="cpu") -> bool:
    """``rank_local`` of a creation call's agreed block (see :data:`NESTED_GUARD_BYTES`)."""
    try:
        if device_key(device) != "cpu":
            return True
        n = math.prod(int(v) for v in (shape if isinstance(shape, tuple) else (shape,)))
        return n * np.dtype(float if dtype is None else dtype).itemsize >= NESTED_GUARD_BYTES
    except Exception:  # noqa: BLE001 - bad arguments: the agreed block raises them anyway
        return True


def _alloc(call, shape, dtype, grid, split, sizes, device, halo, fill, fill_value=None):
    g = _grid(grid)
    # rank_local: the allocation (and a device's availability) may fail on one rank only
    with agreed(g.cart, call, rank_local=_guard_nested(shape, dtype, device),
                dtype=dtype_key(dtype, float),
                **layout_args(shape, g, split, sizes, device, halo),
                **({} if fill_value is None else {"fill_value": np.asarray(fill_value)})):
        dtype = np.dtype(float if dtype is None else dtype)
        return _new_array(call, g, shape, dtype, split, sizes, device, halo, fill)


@collective_entry
def empty(shape, dtype=None, grid=None, split=None, sizes=None, device="cpu",
          halo=None) -> DistArray:
    return _alloc("empty", shape, dtype, grid, split, sizes, device, halo, None)


@collective_entry
def zeros(shape, dtype=None, grid=None, split=None, sizes=None, device="cpu",
          halo=None) -> DistArray:
    return _alloc("zeros", shape, dtype, grid, split, sizes, device, halo, 0)


@collective_entry
def ones(shape, dtype=None, grid=None, split=None, sizes=None, device="cpu",
         halo=None) -> DistArray:
    return _alloc("ones", shape, dtype, grid, split, sizes, device, halo, 1)


@collective_entry
def full(shape, fill_value, dtype=None, grid=None, split=None, sizes=None, device="cpu",
         halo=None) -> DistArray:
    """The fill value is data: the ranks agree on its type (on its value too under
    ``DISTTENSOR_DEBUG``), and on the dtype it gives."""
    if dtype is None:
        dtype = np.asarray(fill_value).dtype
    return _alloc("full", shape, dtype, grid, split, sizes, device, halo, fill_value,
                  fill_value)


def _like(call, x: DistArray, dtype, fill):
    if not isinstance(x, DistArray):
        raise TypeError(f"{call} needs a DistArray, got {type(x).__name__}")
    # rank_local: the allocation may fail on one rank only
    with agreed(x.grid.cart, call, rank_local=_guard_nested(x.shape, dtype or x.dtype, x.device),
                x=x, dtype=dtype_key(dtype),
                **({} if fill is None else {"fill_value": np.asarray(fill)})):
        dtype = x.dtype if dtype is None else np.dtype(dtype)
        buf = allocate(x.local_shape, dtype, xp=x.xp, fill=fill, rank=x.grid.cart.rank,
                       call=call)
    return DistArray(buf, x.distribution, x.grid)


@collective_entry
def empty_like(x: DistArray, dtype=None) -> DistArray:
    return _like("empty_like", x, dtype, None)


@collective_entry
def zeros_like(x: DistArray, dtype=None) -> DistArray:
    return _like("zeros_like", x, dtype, 0)


@collective_entry
def ones_like(x: DistArray, dtype=None) -> DistArray:
    return _like("ones_like", x, dtype, 1)


@collective_entry
def full_like(x: DistArray, fill_value, dtype=None) -> DistArray:
    return _like("full_like", x, dtype, fill_value)


def local_index_grid(x: DistArray):
    """Per-axis global index vectors of the owned block, shaped to broadcast (open mesh)."""
    box = x.distribution.block_box(x.grid.coords)
    nd = x.ndim
    out = []
    for t, (a, b) in enumerate(zip(box.start, box.stop)):
        shp = [1] * nd
        shp[t] = b - a
        out.append(np.arange(a, b, dtype=np.int64).reshape(shp))
    return out


def arange_dtype(start, stop, step, dtype=None) -> np.dtype:
    """The dtype of ``numpy.arange(start, stop, step, dtype=dtype)`` (pure): ``dtype`` if
    given, else NumPy's rule: at least the default integer, promoted with the type of each of
    ``start``, ``stop`` and ``step`` (``arange(5.0)`` and ``arange(0, 5.0)`` are float64)."""
    if dtype is not None:
        return np.dtype(dtype)
    out = np.dtype(np.intp)
    for v in (start, stop, step):
        if v is not None:
            out = np.promote_types(out, np.asarray(v).dtype)
    return out


@collective_entry
def arange(start, stop=None, step=1, dtype=None, grid=None, split=None, sizes=None,
           device="cpu") -> DistArray:
    """Like ``numpy.arange`` (NumPy's dtype rule, :func:`arange_dtype`; its length
    ``ceil((stop - start) / step)``), with NumPy's formula: the first two elements are
    ``start`` and ``start + step`` cast to the dtype, element ``i >= 2`` is
    ``v0 + i * (v1 - v0)`` evaluated in the dtype (float32 for float16), so the values are
    bit-identical to NumPy's."""
    if stop is None:
        start, stop = 0, start
    g = _grid(grid)
    with agreed(g.cart, "arange", rank_local=True, start=start, stop=stop, step=step,
                dtype=dtype_key(dtype), **layout_args(None, g, split, sizes, device, ndim=1)):
        if step == 0:
            raise ZeroDivisionError("arange step cannot be zero")
        out_dtype = arange_dtype(start, stop, step, dtype)
        if out_dtype.kind in "OSUV":
            raise TypeError(f"arange: no {out_dtype} ranges (the arguments {start!r}, "
                            f"{stop!r}, {step!r} do not fit a numeric dtype)")
        q = (stop - start) / step
        # NumPy's length: a Python complex quotient counts the shorter of its two parts,
        # other complex scalars their real part
        n = max(0, min(int(np.ceil(q.real)), int(np.ceil(q.imag))) if isinstance(q, complex)
                else int(np.ceil(np.real(q))))
        normalize_device(device)
        x = _new_array("arange", g, (n,), out_dtype, split, sizes)
    (i,) = local_index_grid(x)
    if out_dtype.kind in "iu" and all(isinstance(v, (int, np.integer)) for v in (start, step)):
        vals = start + i * step  # exact (no wrap-around in int64 for sane ranges)
    else:
        acc = np.dtype(np.float32) if out_dtype == np.float16 else out_dtype
        with np.errstate(over="ignore", invalid="ignore"):
            v0 = np.asarray(start).astype(out_dtype).astype(acc)
            v1 = np.asarray(start + step).astype(out_dtype).astype(acc)
            vals = v0 + i.astype(acc) * (v1 - v0)
            vals = np.where(i == 0, v0, np.where(i == 1, v1, vals))
    x.local[...] = vals.astype(out_dtype)
    return x.to_device(device) if device != "cpu" else x


@collective_entry
def linspace(start, stop, num=50, endpoint=True, dtype=None, grid=None, split=None, sizes=None,
             device="cpu") -> DistArray:
    """Like ``numpy.linspace`` (same formula: ``start + i * step``, last point ``stop``)."""
    g = _grid(grid)
    with agreed(g.cart, "linspace", rank_local=True, start=start, stop=stop, num=num,
                endpoint=bool(endpoint),
                dtype=dtype_key(dtype), **layout_args(None, g, split, sizes, device, ndim=1)):
        num = int(num)
        if num < 0:
            raise ValueError(f"Number of samples, {num}, must be non-negative.")
        dt = np.result_type(start, stop, float(num)) if dtype is None else np.dtype(dtype)
        normalize_device(device)
        x = _new_array("linspace", g, (num,), dt, split, sizes)
    div = (num - 1) if endpoint else num
    (i,) = local_index_grid(x)
    delta = np.float64(stop) - np.float64(start)
    if div > 0:
        step = delta / div
        vals = i.astype(np.float64) * step + start if step != 0 else i / div * delta + start
    else:
        vals = i.astype(np.float64) * delta + start
    if endpoint and num > 1:
        vals = np.where(i == num - 1, np.float64(stop), vals)
    x.local[...] = vals.astype(dt) if dt.kind != "i" else np.floor(vals).astype(dt)
    return x.to_device(device) if device != "cpu" else x


@collective_entry
def from_global(a, grid=None, split=None, sizes=None, root=None, device="cpu",
                halo=None) -> DistArray:
    """Distribute a global array (collective).

    With ``root=None`` every rank passes the same global array and keeps its block (no
    messages; the ranks agree on its shape and dtype, on its values too under
    ``DISTTENSOR_DEBUG``).  With ``root=r`` only rank ``r`` needs the array (others may pass
    ``None``, and what they pass is ignored): its shape and dtype are broadcast and the blocks
    are scattered by one redistribution."""
    from ..core.distribution import Distribution
    from ..core.redistribute import redistribute_blocks
    g = _grid(grid)
    comm = g.cart
    if root is None:
        err = None
        try:
            host = np.asarray(to_host(a) if not np.isscalar(a) else np.asarray(a))
        except Exception as e:  # noqa: BLE001 - raised inside the agreement block
            host, err = None, e
        nd = host.ndim if host is not None else 0
        # rank_local: converting the array may fail on one rank only
        with agreed(comm, "from_global", rank_local=True, a=host, root=None, grid=g,
                    split=split_key(split, nd),
                    sizes=canon(sizes), device=device_key(device),
                    halo=None if halo is None else halo_key(halo, nd)):
            if err is not None:
                raise err
            normalize_device(device)
            # always a copy (never alias the caller's array), with its halo cells
            x = _new_array("from_global", g, host.shape, host.dtype, split, sizes, halo=halo,
                           fill=None if halo is None else 0)
        x.local[...] = host[x.local_slices + (Ellipsis,)]
        return x.to_device(device) if device != "cpu" else x
    else:
        # the array's number of axes is known on the root only: split and halo agree as given
        with agreed(comm, "from_global", rank_local=True, root=root, grid=g, split=canon(split),
                    sizes=canon(sizes), device=device_key(device), halo=canon(halo)):
            if not isinstance(root, (int, np.integer)) or not 0 <= root < comm.size:
                raise ValueError(f"root {root} outside 0..{comm.size - 1}")
            meta = None
            if comm.rank == root:
                if a is None:
                    raise ValueError("from_global: the root rank must pass the array")
                host = np.asarray(to_host(a))
                meta = (host.shape, host.dtype.str)
        shape, dtype = comm.bcast(meta, root=root)
        # pure functions of agreed arguments and the broadcast shape: the same on every rank
        grid_, dist = make_distribution(shape, g, split, sizes)
        normalize_device(device)
        if len(shape) == 0:
            val = comm.bcast(host if comm.rank == root else None, root=root)
            local = np.array(val, dtype=dtype)
        else:
            psizes = [0] * comm.size
            psizes[root] = shape[0]
            src = Distribution(shape, (comm.size,), (0,), [psizes] + [None] * (len(shape) - 1))
            mine = (np.ascontiguousarray(host) if comm.rank == root
                    else np.empty((0,) + tuple(shape[1:]), dtype))
            with collective(comm):  # the block may be too large for one rank only
                local = allocate(dist.block_shape(g.coords), dtype, rank=comm.rank,
                                 call="from_global")
            local = redistribute_blocks(comm, mine, src, dist, out=local)
    x = DistArray(local, dist, grid_)
    if device != "cpu":
        x = x.to_device(device)
    if halo is not None:
        x = x.with_halo(halo)
    return x


@collective_entry
def eye(n_rows, n_cols=None, k=0, dtype=None, grid=None, split=None, sizes=None,
        device="cpu") -> DistArray:
    """The 2-D array with ones on diagonal ``k`` (``n_rows x n_cols``), in the given layout."""
    g = _grid(grid)
    m = n_rows if n_cols is None else n_cols
    with agreed(g.cart, "eye", rank_local=True, n_rows=canon(n_rows), n_cols=canon(m),
                k=canon(k), dtype=dtype_key(dtype, float),
                **layout_args((n_rows, m), g, split, sizes, device)):
        n_rows, m, k = operator.index(n_rows), operator.index(m), operator.index(k)
        if n_rows < 0 or m < 0:
            raise ValueError("negative dimensions are not allowed")
        x = _new_array("eye", g, (n_rows, m), np.dtype(float if dtype is None else dtype),
                       split, sizes, fill=0)
    i, j = local_index_grid(x)
    x.local[...] = (j - i == k)
    return x.to_device(device) if device != "cpu" else x


@collective_entry
def meshgrid(*arrays, indexing="xy", grid=None, split=None) -> tuple:
    """Coordinate matrices from 1-D DistArrays (``indexing`` ``'xy'`` or ``'ij'``).  Every
    output has the result shape in the default layout of ``grid`` (default: the first
    operand's grid; ``split`` as in :func:`disttensor.zeros`)."""
    first = anchor(arrays)
    with agreed(None if first is None else first.grid.cart, "meshgrid",
                arrays=tuple(operand_key(a) for a in arrays), indexing=indexing,
                grid=grid, split=canon(split)):
        for a in arrays:
            check_array(a, "every operand")
            if a.ndim != 1:
                raise ValueError("meshgrid needs 1-D arrays")
        if indexing not in ("xy", "ij"):
            raise ValueError("Valid values for `indexing` are 'xy' and 'ij'.")
        g = first.grid if (grid is None and first is not None) else grid
        shape = [a.shape[0] for a in arrays]
        if indexing == "xy" and len(shape) >= 2:
            shape[0], shape[1] = shape[1], shape[0]
        g, dist = make_distribution(tuple(shape), g, split) if arrays else (None, None)
    out = []
    for k, a in enumerate(arrays):
        pos = k
        if indexing == "xy" and len(arrays) >= 2 and k < 2:
            pos = 1 - k
        shp = [1] * len(shape)
        shp[pos] = shape[pos]
        loc = align(a.reshape(shp), g, dist, a.device)
        out.append(DistArray(a.xp.broadcast_to(loc, dist.block_shape(g.coords)).copy(), dist, g))
    return tuple(out)


def _tri(call, x, k, lower: bool):
    check_array(x)
    with agreed(x.grid.cart, call, x=x, k=canon(k)):
        if x.ndim < 2:
            raise ValueError(f"{call} needs an array of at least 2 dimensions")
        k = operator.index(k)
    idx = local_index_grid(x)
    i, j = idx[-2], idx[-1]
    keep = (j - i <= k) if lower else (j - i >= k)
    xp = x.xp
    loc = xp.where(xp.asarray(keep), x.local, xp.zeros((), x.dtype))
    return DistArray(loc.astype(x.dtype, copy=False), x.distribution, x.grid)


@collective_entry
def tril(x: DistArray, k=0) -> DistArray:
    """Zero the elements above diagonal ``k`` of the last two axes (no messages)."""
    return _tri("tril", x, k, True)


@collective_entry
def triu(x: DistArray, k=0) -> DistArray:
    """Zero the elements below diagonal ``k`` of the last two axes (no messages)."""
    return _tri("triu", x, k, False)
