"""Set routines (NumPy's "Set routines"): the array API's ``unique_values``,
``unique_counts``, ``unique_inverse``, ``unique_all``, NumPy's ``unique`` (``axis=None``
only) and ``isin``.

Algorithm (collective): flatten ``x`` (``x.reshape(-1)``), sort it with its permutation
(:mod:`disttensor.routines.sorting`: sample sort along the split axis, stable), mark the first
element of each run of equal values (the last element of the previous non-empty block is
all-gathered along the grid axis, ``O(p)``), and select the marked elements locally.
First-occurrence indices are the permutation at the marks (the sort is stable); counts are the
distances between consecutive marks (the next block's first mark is all-gathered); inverse
indices are a running count of the marks (:mod:`disttensor.routines.scans`) sent back to the
elements' original positions by one ``MPI_Alltoallv`` (the inverse permutation).

Output distributions (data-dependent): ``values``, ``indices`` and ``counts`` are 1-D, split
over the grid axis of the flattened ``x`` with explicit uneven ownership (rank ``c`` owns the
unique values whose first sorted occurrence it held; replicated when ``x.reshape(-1)`` is);
``inverse_indices`` has ``x``'s shape and distribution.  Indices and counts are ``int64``.

NaNs: the array API functions treat every NaN as distinct (``equal_nan=False``); NumPy's
``unique`` collapses them (``equal_nan=True``), as NumPy 2 does.

``isin(x1, x2)``: the test values ``x2`` are gathered on every rank (memory ``O(x2.size)``),
then each block of ``x1`` is tested locally; the result has ``x1``'s layout.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, operand_key
from ..core.backend import to_host
from ..core.distribution import Distribution
from ._operands import check_array
from .scans import _scan
from .searching import hits_distribution
from .sorting import _sort_any, alltoallv

__all__ = ["unique_values", "unique_counts", "unique_inverse", "unique_all", "unique", "isin",
           "UniqueAllResult", "UniqueCountsResult", "UniqueInverseResult"]

UniqueAllResult = namedtuple("UniqueAllResult", ["values", "indices", "inverse_indices", "counts"])
UniqueCountsResult = namedtuple("UniqueCountsResult", ["values", "counts"])
UniqueInverseResult = namedtuple("UniqueInverseResult", ["values", "inverse_indices"])


def _eq(a, b, equal_nan: bool):
    e = a == b
    if equal_nan and a.dtype.kind in "fc":
        e |= np.isnan(a) & np.isnan(b)
    return e


def _scatter_back(comm, vals: np.ndarray, pos: np.ndarray, offsets, my_off: int, m: int):
    """Inverse permutation: element ``vals[i]`` goes to global position ``pos[i]`` of a 1-D
    array whose blocks along ``comm``'s ranks start at ``offsets``; returns this rank's block
    (length ``m``, starting at ``my_off``)."""
    owner = np.searchsorted(np.asarray(offsets), pos, side="right") - 1
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=comm.size) if owner.size else np.zeros(comm.size, int)
    rv, _ = alltoallv(comm, vals[order], counts)
    rp, _ = alltoallv(comm, pos[order], counts)
    out = np.empty(m, dtype=vals.dtype)
    out[rp - my_off] = rv
    return out


@collective_entry
def _unique(x: DistArray, equal_nan: bool, call: str, want: tuple, axis=None):
    check_array(x)
    with agreed(x.grid.cart, call, x=x, equal_nan=bool(equal_nan), want=want, axis=canon(axis)):
        if axis is not None:
            raise TypeError(f"{call}: only axis=None is supported for DistArrays")
        if x.dtype.kind not in "biufc":
            raise TypeError(f"{call}: unsupported dtype {x.dtype}")
    y = x.reshape(-1) if x.ndim != 1 else x
    n = y.shape[0]
    vals, perm = _sort_any(y, 0, False, "both") if n else (y, y.astype(np.int64))
    xp = y.xp
    s = to_host(vals.local)
    pm = to_host(perm.local)
    g = y.split[0]
    comm = y.grid.sub_comm([g]) if g is not None and y.grid.dims[g] > 1 else None
    d = y.distribution
    my_off = d.offsets[0][d.axis_coord(0, y.grid.coords)]
    m = s.shape[0]
    prev = None
    if comm is not None:
        info = comm.allgather(s[-1:])
        for blk in info[:comm.rank][::-1]:
            if blk.size:
                prev = blk
                break
    start = np.ones(m, dtype=bool)
    if m:
        start[1:] = ~_eq(s[1:], s[:-1], equal_nan)
        if prev is not None:
            start[0] = not bool(_eq(s[:1], prev, equal_nan)[0])
    pos = np.flatnonzero(start).astype(np.int64) + my_off
    hd = hits_distribution(y, int(pos.shape[0]))

    def wrap(a):
        return DistArray(a if xp is np else xp.asarray(a), hd, y.grid)

    out = {"values": wrap(s[start])}
    if "indices" in want:
        out["indices"] = wrap(pm[start].astype(np.int64))
    if "counts" in want:
        nxt = n
        if comm is not None:
            firsts = comm.allgather(pos[:1])
            for blk in firsts[comm.rank + 1:]:
                if blk.size:
                    nxt = int(blk[0])
                    break
        out["counts"] = wrap(np.diff(np.append(pos, nxt)).astype(np.int64))
    if "inverse" in want:
        st = DistArray(start.astype(np.int64), Distribution(d.shape, d.grid_dims, d.split,
                                                            d.split_sizes), y.grid)
        inv_sorted = to_host(_scan(st, 0, np.int64, "sum", False).local) - 1
        if comm is None:
            inv = np.empty(m, dtype=np.int64)
            inv[pm] = inv_sorted
        else:
            inv = _scatter_back(comm, inv_sorted, pm.astype(np.int64), d.offsets[0], my_off, m)
        r = DistArray(inv if xp is np else xp.asarray(inv), d, y.grid)
        if x.ndim != 1:
            r = r.reshape(x.shape)
            if r.distribution != x.distribution:
                r = r.redistribute(distribution=x.distribution)
        out["inverse"] = r
    return out


def unique_values(x: DistArray, /) -> DistArray:
    """Array API ``unique_values``: sorted distinct values (NaNs distinct), 1-D, uneven
    distribution (module docstring)."""
    return _unique(x, False, "unique_values", ("values",))["values"]


def unique_counts(x: DistArray, /) -> UniqueCountsResult:
    """Array API ``unique_counts``: ``(values, counts)``."""
    r = _unique(x, False, "unique_counts", ("values", "counts"))
    return UniqueCountsResult(r["values"], r["counts"])


def unique_inverse(x: DistArray, /) -> UniqueInverseResult:
    """Array API ``unique_inverse``: ``(values, inverse_indices)``; ``inverse_indices`` has
    ``x``'s shape and distribution."""
    r = _unique(x, False, "unique_inverse", ("values", "inverse"))
    return UniqueInverseResult(r["values"], r["inverse"])


def unique_all(x: DistArray, /) -> UniqueAllResult:
    """Array API ``unique_all``: ``(values, indices, inverse_indices, counts)``."""
    r = _unique(x, False, "unique_all", ("values", "indices", "inverse", "counts"))
    return UniqueAllResult(r["values"], r["indices"], r["inverse"], r["counts"])


def unique(x: DistArray, return_index=False, return_inverse=False, return_counts=False,
           axis=None, *, equal_nan=True):
    """NumPy ``unique`` with ``axis=None`` (NaNs collapsed by default, as NumPy); returns the
    values, or a tuple with the requested extras in NumPy's order (collective)."""
    want = ("values",) + (("indices",) if return_index else ()) + \
        (("inverse",) if return_inverse else ()) + (("counts",) if return_counts else ())
    r = _unique(x, bool(equal_nan), "unique", want, axis)
    if len(want) == 1:
        return r["values"]
    return tuple(r[k] for k in want)


@collective_entry
def isin(x1, x2, invert=False) -> DistArray:
    """Elementwise whether each element of ``x1`` (a DistArray) is in ``x2`` (a DistArray,
    gathered on every rank, a NumPy array or a scalar): the result has ``x1``'s layout;
    memory ``O(x2.size)`` per rank, no other messages."""
    check_array(x1, "x1")
    with agreed(x1.grid.cart, "isin", x1=x1, x2=operand_key(x2), invert=bool(invert)):
        if isinstance(x2, DistArray) and not x2.grid.compatible(x1.grid):
            raise ValueError("the two grids are over different communicators")
    vals = x2.to_numpy() if isinstance(x2, DistArray) else np.asarray(x2)
    xp = x1.xp
    loc = xp.isin(x1.local, xp.asarray(vals.reshape(-1)), invert=bool(invert))
    return DistArray(loc, x1.distribution, x1.grid)

