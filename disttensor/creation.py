"""Creation functions.  All are collective over the grid and take
``grid=None`` (default grid), ``split=None`` (default split, see
:func:`disttensor.array.default_split`), ``sizes=None`` (balanced ownership),
``device='cpu'`` and ``halo=None`` (no halo cells)."""
from __future__ import annotations

import numpy as np

from .array import DistArray, make_distribution, normalize_halo
from .backend import normalize_device, to_host, xp_for
from .comm import collective

__all__ = ["empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like",
           "full_like", "arange", "linspace", "from_global", "local_index_grid"]


def _alloc(shape, dtype, grid, split, sizes, device, halo, fill):
    grid, dist = make_distribution(shape, grid, split, sizes)
    xp = xp_for(normalize_device(device))
    h = normalize_halo(halo, dist.ndim)
    block = dist.block_shape(grid.coords)
    bshape = tuple(lo + n + hi for (lo, hi), n in zip(h, block))
    dtype = np.dtype(float if dtype is None else dtype)
    if fill is None:
        buf = xp.empty(bshape, dtype=dtype)
    elif fill == 0:
        buf = xp.zeros(bshape, dtype=dtype)
    else:
        buf = xp.zeros(bshape, dtype=dtype)
        x = DistArray(buf, dist, grid, h)
        x.local[...] = fill
        return x
    return DistArray(buf, dist, grid, h)


def empty(shape, dtype=None, grid=None, split=None, sizes=None, device="cpu", halo=None) -> DistArray:
    return _alloc(shape, dtype, grid, split, sizes, device, halo, None)


def zeros(shape, dtype=None, grid=None, split=None, sizes=None, device="cpu", halo=None) -> DistArray:
    return _alloc(shape, dtype, grid, split, sizes, device, halo, 0)


def ones(shape, dtype=None, grid=None, split=None, sizes=None, device="cpu", halo=None) -> DistArray:
    return _alloc(shape, dtype, grid, split, sizes, device, halo, 1)


def full(shape, fill_value, dtype=None, grid=None, split=None, sizes=None, device="cpu",
         halo=None) -> DistArray:
    if dtype is None:
        dtype = np.asarray(fill_value).dtype
    return _alloc(shape, dtype, grid, split, sizes, device, halo, fill_value)


def _like(x: DistArray, dtype, fill):
    xp = x.xp
    dtype = x.dtype if dtype is None else np.dtype(dtype)
    shape = x.local_shape
    buf = xp.empty(shape, dtype) if fill is None else xp.full(shape, fill, dtype)
    return DistArray(buf, x.distribution, x.grid)


def empty_like(x: DistArray, dtype=None) -> DistArray:
    return _like(x, dtype, None)


def zeros_like(x: DistArray, dtype=None) -> DistArray:
    return _like(x, dtype, 0)


def ones_like(x: DistArray, dtype=None) -> DistArray:
    return _like(x, dtype, 1)


def full_like(x: DistArray, fill_value, dtype=None) -> DistArray:
    return _like(x, dtype, fill_value)


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


def arange(start, stop=None, step=1, dtype=None, grid=None, split=None, sizes=None,
           device="cpu") -> DistArray:
    """Like ``numpy.arange``, with NumPy's formula: the first two elements are ``start`` and
    ``start + step`` cast to the dtype, element ``i >= 2`` is ``v0 + i * (v1 - v0)`` evaluated
    in the dtype (float32 for float16), so the values are bit-identical to NumPy's."""
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ZeroDivisionError("arange step cannot be zero")
    out_dtype = np.arange(start, start, step, dtype=dtype).dtype  # NumPy's dtype rule
    n = max(0, int(np.ceil((stop - start) / step)))
    x = empty((n,), dtype=out_dtype, grid=grid, split=split, sizes=sizes, device="cpu")
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


def linspace(start, stop, num=50, endpoint=True, dtype=None, grid=None, split=None, sizes=None,
             device="cpu") -> DistArray:
    """Like ``numpy.linspace`` (same formula: ``start + i * step``, last point ``stop``)."""
    num = int(num)
    if num < 0:
        raise ValueError(f"Number of samples, {num}, must be non-negative.")
    div = (num - 1) if endpoint else num
    dt = np.result_type(start, stop, float(num)) if dtype is None else np.dtype(dtype)
    x = empty((num,), dtype=dt, grid=grid, split=split, sizes=sizes, device="cpu")
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


def from_global(a, grid=None, split=None, sizes=None, root=None, device="cpu", halo=None) -> DistArray:
    """Distribute a global array (collective).

    With ``root=None`` every rank passes the same global array and keeps its block (no
    messages).  With ``root=r`` only rank ``r`` needs the array (others may pass ``None``):
    its shape and dtype are broadcast and the blocks are scattered by one redistribution."""
    from .grid import get_default_grid
    from .distribution import Distribution
    from .redistribute import redistribute_blocks
    g = get_default_grid() if grid is None else grid
    comm = g.cart
    if root is None:
        host = to_host(a) if not np.isscalar(a) else np.asarray(a)
        host = np.asarray(host)
        grid_, dist = make_distribution(host.shape, g, split, sizes)
        from .comm import check_same
        check_same(comm, (host.shape, host.dtype.str), "global array shapes/dtypes passed to from_global")
        # always a copy (never alias the caller's array); `...` keeps 0-d blocks arrays
        local = np.array(host[dist.block_slices(g.coords) + (Ellipsis,)], copy=True, order="C")
    else:
        with collective(comm):
            if not 0 <= root < comm.size:
                raise ValueError(f"root {root} outside 0..{comm.size - 1}")
            if comm.rank == root and a is None:
                raise ValueError("from_global: the root rank must pass the array")
        meta = None
        if comm.rank == root:
            host = np.asarray(to_host(a))
            meta = (host.shape, host.dtype.str)
        shape, dtype = comm.bcast(meta, root=root)
        grid_, dist = make_distribution(shape, g, split, sizes)
        if len(shape) == 0:
            val = comm.bcast(host if comm.rank == root else None, root=root)
            local = np.array(val, dtype=dtype)
        else:
            psizes = [0] * comm.size
            psizes[root] = shape[0]
            src = Distribution(shape, (comm.size,), (0,), [psizes] + [None] * (len(shape) - 1))
            mine = np.ascontiguousarray(host) if comm.rank == root else np.empty((0,) + tuple(shape[1:]), dtype)
            local = redistribute_blocks(comm, mine, src, dist)
    x = DistArray(local, dist, grid_)
    if device != "cpu":
        x = x.to_device(device)
    if halo is not None:
        x = x.with_halo(halo)
    return x
