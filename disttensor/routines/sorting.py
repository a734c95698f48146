"""Sorting and searching of DistArrays: ``sort``, ``argsort``, ``searchsorted``, and the
data-dependent selections built on them (``nonzero``, ``argwhere``, ``count_nonzero``,
boolean masks ``x[mask]`` / ``x[mask] = v``), ``histogram``, ``bincount`` and the order
statistics ``quantile`` / ``percentile`` / ``median``.  Every function is collective over the
grid of its DistArray arguments.

sort / argsort (``sort(x, axis=-1, descending=False, stable=True)``)
--------------------------------------------------------------------
* The result keeps ``x``'s distribution (same split, same ownership sizes).
* Along an unsplit axis: local (``numpy.sort``/``argsort`` with a stable kind).
* A 1-D array split over grid axis ``g`` (``p`` ranks along it): a parallel sample sort on the
  sub-communicator of ``g``.  Each rank sorts its block (stable), picks ``p-1`` regular
  samples, the samples are all-gathered and ``p-1`` splitters chosen among them, every rank
  cuts its sorted block at the splitters and one ``MPI_Alltoallv`` sends piece ``j`` to rank
  ``j``, which merges its ``p`` sorted runs (a stable merge-sort, which detects the runs).
  Keys are ``(value, global index)`` pairs, so ties never straddle a splitter unevenly and
  the order is stable (ties in global index order); NaNs sort last as in NumPy.  ``sort``
  (values only) needs no index key: equal values are indistinguishable, so only the values
  travel and the pieces are cut by value.  The sorted
  sequence (uneven, data-dependent blocks) is then redistributed to ``x``'s distribution.
  Cost: ``O((n/p) log(n/p))`` local work, ``O(p^2)`` samples, ``n/p`` elements per rank sent
  twice (Alltoallv + redistribution).
* An N-d array sorted along a split axis ``a`` is first redistributed so that ``a`` is whole
  and its grid axis cuts another, unsplit axis (the longest), like a transpose of a pencil
  FFT; each line is then sorted locally and the result redistributed back.  When every other
  axis is already split, ``a`` is gathered along its grid axis (replicated) instead.
* ``descending=True`` equals ``flip(sort(flip(x)))`` (the array API's reference behaviour):
  ties keep their original order and NaNs come first.  ``argsort`` returns ``int64`` global
  indices.  ``stable`` is accepted; the sort is always stable.

searchsorted(x1, x2, side="left")
---------------------------------
``x1`` is 1-D and sorted (NaNs last).  ``x2`` is brought to a layout not split over ``x1``'s
grid axis (a redistribution if it was), every rank counts with ``numpy.searchsorted`` against
its own block of ``x1``, and one all-reduce over ``x1``'s grid axis sums the counts.  The
result has ``x2``'s distribution (a NumPy ``x2`` or scalar gives a replicated NumPy result).

Data-dependent shapes
---------------------
``nonzero``, ``argwhere``, ``x[mask]`` return 1-D (``argwhere``: ``(k, ndim)``) DistArrays
whose first axis is split over the grid axis of the flattened input (``x.reshape(-1)``) with
explicit uneven ownership: rank ``c`` along it owns the hits of its own flat block, in global
row-major order.  Replicated inputs give replicated results.  ``x[mask] = v`` writes in place
(``v`` a scalar, a NumPy array of length ``count_nonzero(mask)``, or a 1-D DistArray).

Statistics
----------
``histogram(x, bins, range, weights)`` and ``bincount(x, weights, minlength)`` count locally
and all-reduce over the split grid axes (replicas not counted twice); they return NumPy arrays
(replicated on every rank), as NumPy does.  ``quantile(x, q, axis, method, keepdims)`` sorts
along ``axis`` (distributed sort above) and reads the order statistics it needs with integer
indexing, combining them with NumPy's formulas (methods ``linear``, ``lower``, ``higher``,
``nearest``, ``midpoint``); a line holding a NaN gives NaN.  ``percentile`` = ``quantile(q /
100)``; ``median`` = ``quantile(0.5)``.
"""
from __future__ import annotations

import numbers
import operator

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, operand_key
from ..core.backend import to_host
from ..core.comm import allreduce, mpi_type
from ..core.distribution import Distribution
from .scans import cumprod, cumsum, cumulative_prod, cumulative_sum  # noqa: F401 (re-exported)
from .sets import (unique, unique_all, unique_counts, unique_inverse,  # noqa: F401
                       unique_values)

__all__ = ["sort", "argsort", "searchsorted", "nonzero", "argwhere", "count_nonzero",
           "mask_getitem", "mask_setitem", "histogram", "bincount", "quantile", "percentile",
           "median", "nanquantile", "nanpercentile", "nanmedian", "HANDLED_FUNCTIONS"]


def _check(x, name: str = "x") -> None:
    if not isinstance(x, DistArray):
        raise TypeError(f"{name} must be a DistArray, got {type(x).__name__}")


def _axis(axis, nd: int) -> int:
    from numpy.lib.array_utils import normalize_axis_index
    return normalize_axis_index(operator.index(axis), nd)


def _like(host, xp):
    return host if xp is np else xp.asarray(host)


def _dist(d: Distribution, **change) -> Distribution:
    """``d`` with per-axis ``split``/``sizes`` lists replaced."""
    split = change.get("split", list(d.split))
    sizes = change.get("sizes", [d.sizes(t) if g is not None else None
                                 for t, g in enumerate(d.split)])
    return Distribution(change.get("shape", d.shape), d.grid_dims, split, sizes)


# -- all-to-all of variable pieces ------------------------------------------------------------
def alltoallv(comm, send: np.ndarray, counts) -> tuple[np.ndarray, np.ndarray]:
    """Collective over ``comm``: send ``send[displ[j]:displ[j]+counts[j]]`` (a 1-D NumPy array
    cut in consecutive pieces) to rank ``j``; returns ``(received, received counts)``, the
    pieces concatenated in source rank order."""
    counts = np.asarray(counts, dtype=np.int64)
    rc = np.asarray(comm.alltoall(counts.tolist()), dtype=np.int64)
    sd = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    rd = np.concatenate([[0], np.cumsum(rc)[:-1]]).astype(np.int64)
    send = np.ascontiguousarray(send)
    recv = np.empty(int(rc.sum()), dtype=send.dtype)
    t = mpi_type(send.dtype)
    comm.Alltoallv([send, (counts.tolist(), sd.tolist()), t],
                   [recv, (rc.tolist(), rd.tolist()), t])
    return recv, rc


def _sample_sort_values(comm, loc: np.ndarray) -> np.ndarray:
    """Values-only sample sort (ascending; equal values are indistinguishable, so no index
    key travels): this rank's run of the sorted sequence."""
    p = comm.size
    s = np.sort(loc)
    m = s.shape[0]
    samples = s[(np.arange(1, p) * m) // p] if m else s[:0]
    sv = np.sort(np.concatenate(comm.allgather(samples)))
    if sv.size:
        cuts = np.searchsorted(s, sv[(np.arange(1, p) * sv.size) // p], "left")
    else:
        cuts = np.zeros(p - 1, dtype=np.int64)
    counts = np.diff(np.concatenate([[0], cuts, [m]]).astype(np.int64))
    rs, _ = alltoallv(comm, s, counts)
    rs.sort(kind="stable")  # merges the p sorted runs
    return rs


def _stable_argsort(a: np.ndarray) -> np.ndarray:
    """Stable argsort of a 1-D NumPy array: NumPy's fast (SIMD, unstable) argsort, then the
    indices inside each run of equal values (NaNs equal) sorted.  ~3x faster than
    ``kind="stable"`` on random float64, the same cost when most values tie."""
    o = np.argsort(a)
    if o.size < 2:
        return o
    s = a[o]
    eq = s[1:] == s[:-1]
    if a.dtype.kind in "fc":
        eq |= np.isnan(s[1:]) & np.isnan(s[:-1])
    if not eq.any():
        return o
    tie = np.zeros(o.size, dtype=bool)
    tie[1:] |= eq
    tie[:-1] |= eq
    pos = np.flatnonzero(tie)
    group = np.concatenate([[0], np.cumsum(~eq)])[pos]
    op = o[pos]
    o[pos] = op[np.lexsort((op, group))]
    return o


def _sample_sort(comm, loc: np.ndarray, off: int, n: int, descending: bool):
    """Sample sort of a 1-D array whose block ``loc`` starts at global ``off`` (ranks of
    ``comm`` in block order).  Returns this rank's run of the sorted sequence (ascending by
    ``(value, t)``, ``t = gi`` or ``n - 1 - gi`` when ``descending``) as ``(values, gi)``."""
    p = comm.size
    m = loc.shape[0]
    work = loc[::-1] if descending else loc
    base = n - off - m if descending else off
    order = _stable_argsort(work)
    s = work[order]
    t = order.astype(np.int64) + base
    if m:
        pick = (np.arange(1, p) * m) // p
        samples = (s[pick], t[pick])
    else:
        samples = (s[:0], t[:0])
    got = comm.allgather(samples)
    sv = np.concatenate([g[0] for g in got])
    st = np.concatenate([g[1] for g in got])
    cuts = [0]
    if sv.size:
        o = np.lexsort((st, sv))
        sv, st = sv[o], st[o]
        sel = (np.arange(1, p) * sv.size) // p
        for v, tt in zip(sv[sel], st[sel]):
            lo = int(np.searchsorted(s, v, "left"))
            hi = int(np.searchsorted(s, v, "right"))
            cuts.append(lo + int(np.searchsorted(t[lo:hi], tt, "left")))
    else:
        cuts += [0] * (p - 1)
    cuts.append(m)
    counts = np.diff(np.asarray(cuts, dtype=np.int64))
    rs, rc = alltoallv(comm, s, counts)
    rt, _ = alltoallv(comm, t, counts)
    if descending:  # ties: t decreases with the source rank, so merge the runs in reverse
        bounds = np.concatenate([[0], np.cumsum(rc)])
        runs = [slice(bounds[j], bounds[j + 1]) for j in range(p)][::-1]
        rs = np.concatenate([rs[r] for r in runs])
        rt = np.concatenate([rt[r] for r in runs])
    o = np.argsort(rs, kind="stable")
    rs, rt = rs[o], rt[o]
    gi = (n - 1 - rt) if descending else rt
    return rs, gi


def _sort_1d_split(x: DistArray, descending: bool, want: str):
    """Sample sort of a 1-D DistArray split over one grid axis; results in ``x``'s layout."""
    from .indexing import flip
    g = x.split[0]
    comm = x.grid.sub_comm([g])
    n = x.shape[0]
    off = x.distribution.offsets[0][x.grid.coords[g]]
    xp = x.xp
    host = np.ascontiguousarray(to_host(x.local))
    if want == "values":  # descending values = the ascending ones reversed
        vals = gi = _sample_sort_values(comm, host)
    else:
        vals, gi = _sample_sort(comm, host, off, n, descending)
    sizes = comm.allgather(int(vals.shape[0]))
    d = Distribution((n,), x.grid.dims, (g,), [sizes])
    out = []
    for a in ((vals,) if want == "values" else (gi,) if want == "indices" else (vals, gi)):
        y = DistArray(_like(a, xp), d, x.grid)
        if descending:
            y = flip(y, 0)
        out.append(y.redistribute(distribution=x.distribution))
    return out


def _local_sort(loc, axis: int, descending: bool, want: str, xp):
    if descending:
        f = xp.flip(loc, axis=axis)
        idx = xp.flip(xp.argsort(f, axis=axis, kind="stable"), axis=axis)
        idx = (loc.shape[axis] - 1 - idx)
    else:
        idx = xp.argsort(loc, axis=axis, kind="stable")
    idx = idx.astype(np.int64)
    if want == "indices":
        return (idx,)
    vals = xp.take_along_axis(loc, idx, axis=axis)
    return (vals,) if want == "values" else (vals, idx)


def _sort_any(x: DistArray, axis: int, descending: bool, want: str):
    g = x.split[axis]
    if g is None or x.grid.dims[g] == 1:
        locs = _local_sort(x.local, axis, descending, want, x.xp)
        return [DistArray(a, x.distribution, x.grid) for a in locs]
    if x.ndim == 1:
        return _sort_1d_split(x, descending, want)
    d = x.distribution
    free = [t for t in range(x.ndim) if t != axis and d.split[t] is None]
    split = list(d.split)
    split[axis] = None
    sizes = [d.sizes(t) if s is not None else None for t, s in enumerate(d.split)]
    sizes[axis] = None
    if free:
        b = max(free, key=lambda t: x.shape[t])
        split[b] = g
    y = x.redistribute(distribution=Distribution(d.shape, d.grid_dims, split, sizes))
    locs = _local_sort(y.local, axis, descending, want, y.xp)
    return [DistArray(a, y.distribution, y.grid).redistribute(distribution=d) for a in locs]


def _sort_args(call, x, axis, descending, stable):
    _check(x)
    with agreed(x.grid.cart, call, x=x, axis=canon(axis), descending=bool(descending),
                stable=bool(stable)):
        if x.ndim == 0:
            raise np.exceptions.AxisError(f"{call} of a 0-d array (axis {axis})")
        ax = _axis(axis, x.ndim)
        if x.dtype.kind not in "biufc?":
            raise TypeError(f"{call}: unsupported dtype {x.dtype}")
    return ax


@collective_entry
def sort(x: DistArray, /, *, axis=-1, descending=False, stable=True) -> DistArray:
    """Sorted copy of ``x`` along ``axis`` with ``x``'s distribution (collective; see the
    module docstring for the algorithm, stability and NaN order)."""
    ax = _sort_args("sort", x, axis, descending, stable)
    return _sort_any(x, ax, bool(descending), "values")[0]


@collective_entry
def argsort(x: DistArray, /, *, axis=-1, descending=False, stable=True) -> DistArray:
    """``int64`` indices along ``axis`` that sort ``x`` (stable: ties in index order), with
    ``x``'s distribution (collective)."""
    ax = _sort_args("argsort", x, axis, descending, stable)
    return _sort_any(x, ax, bool(descending), "indices")[0]


# -- searchsorted -------------------------------------------------------------------------------
@collective_entry
def searchsorted(x1: DistArray, x2, /, *, side="left", sorter=None):
    """Insertion indices of ``x2``'s elements into the sorted 1-D ``x1`` (collective).
    Returns ``int64`` with ``x2``'s distribution, or a NumPy array / integer (replicated) for a
    NumPy / scalar ``x2``."""
    _check(x1, "x1")
    with agreed(x1.grid.cart, "searchsorted", x1=x1, x2=operand_key(x2), side=side,
                sorter=sorter is None):
        if x1.ndim != 1:
            raise ValueError(f"searchsorted: x1 must be 1-D, got {x1.ndim}-d")
        if side not in ("left", "right"):
            raise ValueError(f"side must be 'left' or 'right', got {side!r}")
        if sorter is not None:
            raise TypeError("searchsorted: sorter= is not supported for DistArrays")
        if isinstance(x2, DistArray) and not x2.grid.compatible(x1.grid):
            raise ValueError("searchsorted: x2 lives on a grid over other ranks than x1's")
    g = x1.split[0]
    loc1 = x1.local
    if not isinstance(x2, DistArray):
        v = np.asarray(x2)
        part = np.asarray(np.searchsorted(to_host(loc1), v, side=side), dtype=np.int64)
        if g is not None and x1.grid.dims[g] > 1:
            part = allreduce(x1.grid.sub_comm([g]), part, "sum")
        part = np.asarray(part).reshape(v.shape)
        return part if v.ndim else int(part)
    y = x2
    if x2.grid is not x1.grid:  # another grid over the same ranks: replicate x2 on x1's
        y = x2.redistribute(grid=x1.grid, split=(None,) * x2.ndim)
    elif g is not None and g in x2.split:
        t = x2.split.index(g)
        d = x2.distribution
        split = list(d.split)
        split[t] = None
        sizes = [d.sizes(u) if s is not None else None for u, s in enumerate(d.split)]
        sizes[t] = None
        y = x2.redistribute(distribution=Distribution(d.shape, d.grid_dims, split, sizes))
    xp = x1.xp
    part = xp.asarray(xp.searchsorted(loc1, xp.asarray(y.local), side=side), dtype=np.int64)
    if g is not None and x1.grid.dims[g] > 1:
        part = allreduce(x1.grid.sub_comm([g]), part, "sum").reshape(y.local.shape)
    r = DistArray(part, y.distribution, x1.grid)
    return r if y is x2 else r.redistribute(grid=x2.grid, distribution=x2.distribution)


# -- data-dependent selections --------------------------------------------------------------------
def _flat(x: DistArray) -> DistArray:
    return x if x.ndim == 1 else x.reshape(-1)


def _hits_dist(y: DistArray, count: int, extra=()) -> Distribution:
    """Distribution of ``count`` local hits of the 1-D ``y`` per rank (uneven along its grid
    axis; replicated when ``y`` is)."""
    g = y.split[0]
    if g is None:
        return Distribution((count,) + tuple(extra), y.grid.dims, (None,) * (1 + len(extra)))
    sizes = y.grid.sub_comm([g]).allgather(int(count))
    return Distribution((sum(sizes),) + tuple(extra), y.grid.dims,
                        (g,) + (None,) * len(extra), [sizes] + [None] * len(extra))


def _flat_hits(x: DistArray):
    """(flattened x, global flat indices of its local non-zeros, their distribution)."""
    y = _flat(x)
    loc = y.local
    off = y.distribution.offsets[0][y.distribution.axis_coord(0, y.grid.coords)]
    xp = y.xp
    idx = xp.flatnonzero(loc).astype(np.int64) + off
    return y, idx, _hits_dist(y, int(idx.shape[0]))


@collective_entry
def nonzero(x: DistArray) -> tuple:
    """Tuple of ``x.ndim`` 1-D ``int64`` DistArrays with the indices of the non-zero elements
    in row-major order (uneven distribution: see the module docstring)."""
    _check(x)
    with agreed(x.grid.cart, "nonzero", x=x):
        if x.ndim == 0:
            raise ValueError("Calling nonzero on 0d arrays is not allowed. Use "
                             "np.atleast_1d(scalar).nonzero() instead.")
    y, idx, d = _flat_hits(x)
    xp = y.xp
    coords = xp.unravel_index(idx, x.shape) if x.ndim > 1 else (idx,)
    return tuple(DistArray(c.astype(np.int64), d, y.grid) for c in coords)


@collective_entry
def argwhere(x: DistArray) -> DistArray:
    """``(k, x.ndim)`` ``int64`` indices of the non-zero elements (rows in row-major order;
    the first axis distributed as :func:`nonzero`'s results)."""
    _check(x)
    with agreed(x.grid.cart, "argwhere", x=x):
        pass
    z = x.reshape(1) if x.ndim == 0 else x
    y, idx, d = _flat_hits(z)
    xp = y.xp
    nd = x.ndim
    if nd == 0:
        loc = xp.zeros((idx.shape[0], 0), dtype=np.int64)
    else:
        loc = xp.stack(xp.unravel_index(idx, x.shape), axis=1).astype(np.int64) \
            if idx.shape[0] else xp.zeros((0, nd), dtype=np.int64)
    d2 = Distribution(d.shape + (nd,), d.grid_dims, d.split + (None,),
                      list(d.split_sizes) + [None])
    return DistArray(loc, d2, y.grid)


@collective_entry
def count_nonzero(x: DistArray, axis=None, *, keepdims=False):
    """Number of non-zero elements (an ``int`` for ``axis=None`` without ``keepdims``, as
    NumPy; else an ``int64`` DistArray laid out like a reduction)."""
    from . import reductions
    _check(x)
    with agreed(x.grid.cart, "count_nonzero", x=x, axis=canon(axis), keepdims=bool(keepdims)):
        reductions._axes(x, axis)
    r = reductions.sum(x != 0, axis=axis, dtype=np.int64, keepdims=keepdims)
    return int(r.item()) if axis is None and not keepdims else r


def _mask_operand(x: DistArray, mask):
    """Validate a boolean mask of ``x``'s shape; a NumPy mask becomes a DistArray laid out as
    ``x``."""
    if isinstance(mask, DistArray):
        if mask.dtype != np.bool_:
            raise IndexError("a DistArray index must be a boolean mask")
        if not mask.grid.compatible(x.grid):
            raise ValueError("the mask lives on a grid over other ranks")
    else:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise IndexError("arrays used as indices must be boolean masks of the array's shape")
    if tuple(mask.shape) != x.shape:
        raise IndexError(f"boolean index of shape {tuple(mask.shape)} does not match the "
                         f"indexed array of shape {x.shape} (only full-shape masks)")
    return mask


def _aligned_mask(mask, y: DistArray):
    """The local block of ``mask`` under ``y``'s distribution and grid."""
    if isinstance(mask, DistArray):
        m = mask if mask.ndim == y.ndim and mask.shape == y.shape else mask.reshape(y.shape)
        if m.distribution != y.distribution or m.grid is not y.grid:
            m = m.redistribute(grid=y.grid, distribution=y.distribution)
        return m.local
    return y.xp.asarray(np.asarray(mask).reshape(y.shape)[y.local_slices])


@collective_entry
def mask_getitem(x: DistArray, mask) -> DistArray:
    """``x[mask]`` for a boolean ``mask`` (DistArray or NumPy) of ``x``'s shape: the selected
    elements in row-major order, 1-D with uneven distribution (module docstring)."""
    _check(x)
    with agreed(x.grid.cart, "getitem[mask]", x=x, mask=operand_key(mask)):
        mask = _mask_operand(x, mask)
    y = _flat(x)
    m = _aligned_mask(mask, y)
    loc = y.local[m]
    return DistArray(loc, _hits_dist(y, int(loc.shape[0])), y.grid)


@collective_entry
def mask_setitem(x: DistArray, mask, value) -> None:
    """``x[mask] = value`` in place: ``value`` a scalar (or 0-d), or 1-D with one element per
    selected position (NumPy array, replicated; or a DistArray)."""
    _check(x)
    with agreed(x.grid.cart, "setitem[mask]", x=x, mask=operand_key(mask),
                value=operand_key(value)):
        mask = _mask_operand(x, mask)
        vshape = tuple(getattr(value, "shape", ()))
        if len(vshape) > 1:
            raise ValueError(f"NumPy boolean array indexing assignment cannot assign "
                             f"{len(vshape)}-d input values")
        if isinstance(value, DistArray) and not value.grid.compatible(x.grid):
            raise ValueError("the value lives on a grid over other ranks")
    if len(vshape) == 0 or vshape == (1,):
        v = value.item() if isinstance(value, DistArray) else np.asarray(value).reshape(())[()]
        m = _aligned_mask(mask, x) if x.ndim else None
        if x.ndim == 0:
            if bool(mask.item() if isinstance(mask, DistArray) else np.asarray(mask)):
                x.local[...] = v
        else:
            x.local[m] = v
        return
    y = _flat(x) if x.ndim != 1 else x
    m = _aligned_mask(mask, y)
    cnt = int(m.sum())
    d = _hits_dist(y, cnt)
    from ..core.comm import collective
    with collective(x.grid.cart):
        if vshape[0] != d.shape[0]:
            raise ValueError(f"NumPy boolean array indexing assignment cannot assign "
                             f"{vshape[0]} input values to the {d.shape[0]} output values "
                             "where the mask is true")
    if isinstance(value, DistArray):
        vl = value.redistribute(grid=y.grid, distribution=d).local
    else:
        start = d.offsets[0][d.axis_coord(0, y.grid.coords)]
        vl = y.xp.asarray(np.asarray(value)[start:start + cnt])
    y.local[m] = vl
    if y is not x:
        back = y.reshape(x.shape)
        if back.distribution != x.distribution:
            back = back.redistribute(distribution=x.distribution)
        x.local[...] = back.local


# -- statistics -------------------------------------------------------------------------------
def _split_comm(x: DistArray):
    gaxes = [g for g in x.split if g is not None and x.grid.dims[g] > 1]
    return x.grid.sub_comm(gaxes) if gaxes else None


@collective_entry
def histogram(x: DistArray, bins=10, range=None, density=None, weights=None):
    """NumPy ``histogram`` of all elements of ``x``: ``(hist, bin_edges)`` as NumPy arrays,
    the same on every rank.  ``bins``: an int or a 1-D increasing sequence of edges;
    ``range=None`` takes the global min/max (one all-reduce each).  ``weights``: a DistArray of
    ``x``'s shape.  Collective."""
    from . import reductions
    _check(x)
    with agreed(x.grid.cart, "histogram", x=x, bins=operand_key(bins) if not isinstance(
            bins, numbers.Integral) else int(bins), range=canon(range), density=density,
            weights=operand_key(weights)):
        if isinstance(bins, str):
            raise TypeError("histogram: string bin estimators are not supported for DistArrays")
        if weights is not None:
            _check(weights, "weights")
            if weights.shape != x.shape:
                raise ValueError("weights should have the same shape as a.")
    if range is None and isinstance(bins, numbers.Integral):
        if x.size:
            lo, hi = float(reductions.min(x).item()), float(reductions.max(x).item())
        else:
            lo, hi = 0.0, 1.0
        edges = np.histogram_bin_edges(np.array([lo, hi]), bins=bins)
    elif isinstance(bins, numbers.Integral):
        edges = np.histogram_bin_edges(np.array([], dtype=np.float64), bins=bins, range=range)
    else:
        edges = np.asarray(bins)
        if range is not None:
            raise ValueError("histogram: range is only used with an integer number of bins")
    w = None
    if weights is not None:
        wd = weights if weights.distribution == x.distribution and weights.grid is x.grid \
            else weights.redistribute(grid=x.grid, distribution=x.distribution)
        w = to_host(wd.local).reshape(-1)
    h, _ = np.histogram(to_host(x.local).reshape(-1), bins=edges, weights=w)
    comm = _split_comm(x)
    if comm is not None:
        h = allreduce(comm, h, "sum")
    if density:
        h = h / np.diff(edges) / h.sum()
    return h, edges


@collective_entry
def bincount(x: DistArray, weights=None, minlength=0):
    """NumPy ``bincount`` of a 1-D non-negative integer DistArray: a NumPy array (the same on
    every rank) of length ``max(x.max() + 1, minlength)``.  Collective."""
    from . import reductions
    _check(x)
    with agreed(x.grid.cart, "bincount", x=x, weights=operand_key(weights),
                minlength=canon(minlength)):
        if x.ndim != 1:
            raise ValueError("object too deep for desired array" if x.ndim > 1
                             else "object of too small depth for desired array")
        if x.dtype.kind not in "iub":
            raise TypeError(f"Cannot cast array data from {x.dtype} to int64 according to "
                            "the rule 'safe'")
        minlength = operator.index(minlength)
        if minlength < 0:
            raise ValueError("'minlength' must not be negative")
        if weights is not None:
            _check(weights, "weights")
            if weights.shape != x.shape:
                raise ValueError("The weights and list don't have the same length.")
    if x.size:
        lo = int(reductions.min(x).item())
        if lo < 0:
            raise ValueError("'list' argument must have no negative elements")
        length = max(int(reductions.max(x).item()) + 1, minlength)
    else:
        length = minlength
    w = None
    if weights is not None:
        wd = weights if weights.distribution == x.distribution and weights.grid is x.grid \
            else weights.redistribute(grid=x.grid, distribution=x.distribution)
        w = to_host(wd.local)
    h = np.bincount(to_host(x.local).astype(np.int64), weights=w, minlength=length)
    if w is not None:  # NumPy gives int64 for empty input even with weights: keep ranks alike
        h = h.astype(np.float64)
    comm = _split_comm(x)
    if comm is not None:
        h = allreduce(comm, h, "sum")
    return h


_METHODS = ("linear", "lower", "higher", "nearest", "midpoint")


def _order_stat(s: DistArray, ax: int, i: int) -> DistArray:
    return s[(slice(None),) * ax + (i,)]


def _quantile_one(s: DistArray, ax: int, n: int, q: float, method: str, nanline):
    """One quantile of the lines of ``s`` (sorted along ``ax``, NaNs last)."""
    v = q * (n - 1)
    if method == "lower":
        r = _order_stat(s, ax, int(np.floor(v)))
    elif method == "higher":
        r = _order_stat(s, ax, int(np.ceil(v)))
    elif method == "nearest":
        r = _order_stat(s, ax, int(np.around(v)))
    else:
        lo, hi = int(np.floor(v)), int(np.ceil(v))
        a = _order_stat(s, ax, lo).astype(np.float64) if s.dtype.kind in "biu" \
            else _order_stat(s, ax, lo)
        b = _order_stat(s, ax, hi).astype(a.dtype)
        if method == "midpoint":
            r = (a + b) / 2
        else:  # NumPy's _lerp: a + (b - a) t, or b - (b - a)(1 - t) for t >= 0.5
            t = v - lo
            diff = b - a
            r = b - diff * (1 - t) if t >= 0.5 else a + diff * t
    if nanline is not None:
        r = np.where(nanline, np.nan, r)
    return r


def _quantile_args(x, q, axis, method, keepdims, what: str, scale: float, kinds: str):
    """Agree and check the arguments of a quantile-type call (collective): ``q`` as a float
    array and the normalized ``axis`` (``None`` for the flattened array).  ``kinds``: the dtype
    kinds accepted (real numbers)."""
    _check(x)
    qa = np.asarray(q, dtype=np.float64)
    ax = None
    with agreed(x.grid.cart, what, x=x, q=canon(qa) if qa.size <= 4096 else qa.shape,
                axis=canon(axis), method=method, keepdims=bool(keepdims)):
        if method not in _METHODS:
            raise ValueError(f"'method' must be one of {_METHODS}, got {method!r}")
        if qa.ndim > 1:
            raise ValueError(f"{what}: q must be a scalar or 1-D")
        if not np.all((qa >= 0) & (qa <= scale)):
            raise ValueError(f"{'Quantiles' if scale == 1 else 'Percentiles'} must be in the "
                             f"range [0, {scale:g}]")
        if axis is not None:
            ax = _axis(axis, x.ndim)
        if x.size == 0:
            raise ValueError(f"{what} of an empty array is not supported for DistArrays")
        if x.dtype.kind not in kinds:
            raise TypeError("a must be an array of real numbers")
    return qa, ax


def _sorted_lines(x, axis, ax):
    """``(y, ax, sort(y, axis=ax))``: the lines a quantile reads (the flattened ``x`` for
    ``axis=None``)."""
    y = x.reshape(-1) if axis is None else x
    ax = 0 if axis is None else ax
    return y, ax, sort(y, axis=ax)


def _stack_quantiles(rs, qa, x, axis, ax, keepdims):
    """The quantiles ``rs`` (one per entry of ``qa``) as NumPy lays them out: stacked on a
    leading axis for a vector ``q``, reduced axes kept as length 1 with ``keepdims``."""
    from .manipulation.dims import expand_dims, stack
    r = rs[0] if qa.ndim == 0 else stack(rs, axis=0)
    if keepdims:
        if axis is None:
            for _ in range(x.ndim):
                r = expand_dims(r, axis=r.ndim)
        else:
            r = expand_dims(r, axis=ax + (1 if qa.ndim else 0))
    return r


@collective_entry
def _quantile(x, q, axis, method, keepdims, what: str, scale: float):
    qa, ax = _quantile_args(x, q, axis, method, keepdims, what, scale, "biufmM")
    qa = qa / scale
    y, ax, s = _sorted_lines(x, axis, ax)
    n = y.shape[ax]
    nanline = np.isnan(_order_stat(s, ax, n - 1)) if s.dtype.kind == "f" else None
    rs = [_quantile_one(s, ax, n, float(v), method, nanline) for v in qa.reshape(-1)]
    return _stack_quantiles(rs, qa, x, axis, ax, keepdims)


def quantile(x: DistArray, q, axis=None, method="linear", keepdims=False):
    """NumPy ``quantile`` (``q`` in [0, 1], a scalar or 1-D sequence) along one ``axis``
    (``None``: of the flattened array), methods ``linear``, ``lower``, ``higher``, ``nearest``,
    ``midpoint``.  Collective; the result is laid out like a reduction of ``x`` over
    ``axis`` (a vector ``q`` adds a leading unsplit axis)."""
    return _quantile(x, q, axis, method, keepdims, "quantile", 1.0)


def percentile(x: DistArray, q, axis=None, method="linear", keepdims=False):
    """NumPy ``percentile``: :func:`quantile` of ``q / 100``."""
    return _quantile(x, q, axis, method, keepdims, "percentile", 100.0)


def median(x: DistArray, axis=None, keepdims=False):
    """NumPy ``median``: :func:`quantile` 0.5 (linear)."""
    return _quantile(x, 0.5, axis, "linear", keepdims, "median", 1.0)


def _nanquantile_one(s: DistArray, ax: int, valid: DistArray, q: float, method: str):
    """One quantile of the non-NaN elements of each line of ``s`` (sorted along ``ax``, NaNs
    last); ``valid`` (keepdims layout) counts them.  The order statistics are read with
    ``take_along_axis`` at per-line indices."""
    from .manipulation.dims import squeeze, take_along_axis
    n = s.shape[ax]
    v = (valid - 1) * q  # virtual index per line (negative for an all-NaN line)

    def at(i):
        i = np.clip(i, 0, n - 1).astype(np.int64)
        return squeeze(take_along_axis(s, i, axis=ax), axis=ax)

    if method == "lower":
        r = at(np.floor(v))
    elif method == "higher":
        r = at(np.ceil(v))
    elif method == "nearest":
        r = at(np.around(v))
    else:
        lo = np.floor(v)
        a, b = at(lo), at(np.ceil(v))
        if a.dtype.kind in "biu":
            a, b = a.astype(np.float64), b.astype(np.float64)
        if method == "midpoint":
            r = (a + b) / 2
        else:
            t = squeeze(v - lo, axis=ax)
            diff = b - a
            r = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
    return np.where(squeeze(valid, axis=ax) == 0, np.nan, r)


@collective_entry
def _nanquantile(x, q, axis, method, keepdims, what: str, scale: float):
    from . import reductions
    qa, ax = _quantile_args(x, q, axis, method, keepdims, what, scale, "biuf")
    if x.dtype.kind != "f":
        return _quantile(x, q, axis, method, keepdims, what, scale)
    qa = qa / scale
    y, ax, s = _sorted_lines(x, axis, ax)
    valid = reductions.sum(~np.isnan(y), axis=ax, dtype=np.int64, keepdims=True)
    rs = [_nanquantile_one(s, ax, valid, float(v), method) for v in qa.reshape(-1)]
    return _stack_quantiles(rs, qa, x, axis, ax, keepdims)


def nanquantile(x: DistArray, q, axis=None, method="linear", keepdims=False):
    """NumPy ``nanquantile``: :func:`quantile` of the non-NaN elements of each line (NaN
    for a line of NaNs only).  Collective."""
    return _nanquantile(x, q, axis, method, keepdims, "nanquantile", 1.0)


def nanpercentile(x: DistArray, q, axis=None, method="linear", keepdims=False):
    """NumPy ``nanpercentile``: :func:`nanquantile` of ``q / 100``."""
    return _nanquantile(x, q, axis, method, keepdims, "nanpercentile", 100.0)


def nanmedian(x: DistArray, axis=None, keepdims=False):
    """NumPy ``nanmedian``: :func:`nanquantile` 0.5."""
    return _nanquantile(x, 0.5, axis, "linear", keepdims, "nanmedian", 1.0)


# -- NumPy dispatch ---------------------------------------------------------------------------
def _np_sort(a, axis=-1, kind=None, order=None, *, stable=None):
    if order is not None:
        raise TypeError("sort: order= is not supported for DistArrays")
    if axis is None:
        return sort(a.reshape(-1), axis=0)
    return sort(a, axis=axis)


def _np_argsort(a, axis=-1, kind=None, order=None, *, stable=None):
    if order is not None:
        raise TypeError("argsort: order= is not supported for DistArrays")
    if axis is None:
        return argsort(a.reshape(-1), axis=0)
    return argsort(a, axis=axis)


def _np_q(fn, scale=1.0):
    def impl(a, q, axis=None, out=None, overwrite_input=False, method="linear",
             keepdims=False, *, weights=None, interpolation=None):
        if out is not None or weights is not None or interpolation is not None:
            raise TypeError("out=, weights= and interpolation= are not supported for DistArrays")
        return fn(a, q, axis=axis, method=method, keepdims=keepdims)
    return impl


def _np_median(a, axis=None, out=None, overwrite_input=False, keepdims=False):
    if out is not None:
        raise TypeError("out= is not supported for DistArrays")
    return median(a, axis=axis, keepdims=keepdims)


def _np_count_nonzero(a, axis=None, *, keepdims=False):
    return count_nonzero(a, axis=axis, keepdims=keepdims)


def _np_histogram(a, bins=10, range=None, density=None, weights=None):
    return histogram(a, bins=bins, range=range, density=density, weights=weights)


HANDLED_FUNCTIONS = {
    np.sort: _np_sort,
    np.argsort: _np_argsort,
    np.searchsorted: lambda a, v, side="left", sorter=None: searchsorted(a, v, side=side,
                                                                         sorter=sorter),
    np.nonzero: nonzero,
    np.argwhere: argwhere,
    np.count_nonzero: _np_count_nonzero,
    np.histogram: _np_histogram,
    np.bincount: lambda x, weights=None, minlength=0: bincount(x, weights, minlength),
    np.quantile: _np_q(quantile),
    np.percentile: _np_q(percentile),
    np.median: _np_median,
    np.nanquantile: _np_q(nanquantile),
    np.nanpercentile: _np_q(nanpercentile),
    np.nanmedian: lambda a, axis=None, out=None, overwrite_input=False, keepdims=False:
        nanmedian(a, axis=axis, keepdims=keepdims),
}


def _merge_scans():
    from . import scans
    from . import sets
    HANDLED_FUNCTIONS.update(scans.HANDLED_FUNCTIONS)
    HANDLED_FUNCTIONS.update(sets.HANDLED_FUNCTIONS)


_merge_scans()
