"""Set routines (NumPy's "Set routines"): the array API's ``unique_values``,
``unique_counts``, ``unique_inverse``, ``unique_all``, NumPy's ``unique`` (``axis=None``
only) and ``isin``.

Algorithm (collective): flatten ``x`` (``x.reshape(-1)``) and take NumPy's ``unique`` of each
block (values, counts and what else is asked).  Over one rank (or a replicated ``x``) that is
the result.  Otherwise the local unique values (far fewer than the elements when values
repeat) are merged: a values-only sample sort (splitters chosen among regular samples of the
local uniques, one ``MPI_Alltoallv`` of :mod:`disttensor.routines.sorting`, so every copy
of a value goes to the same rank), then the copies of each value are merged (counts summed,
first index the lowest rank's: the blocks are in index order).  Inverse indices: each rank
numbers its merged values (an ``Exscan`` of their counts gives the offsets), the numbers go
back to the senders by the reverse ``MPI_Alltoallv``, and each element picks its value's
number through its local inverse.  No ``(value, index)`` sort and no tie handling.

Output distributions (data-dependent): ``values``, ``indices`` and ``counts`` are 1-D, split
over the grid axis of the flattened ``x`` with explicit uneven ownership (rank ``c`` owns the
``c``-th run of the sorted unique values, cut by the splitters; replicated when
``x.reshape(-1)`` is); ``inverse_indices`` has ``x``'s shape and distribution.  Indices and
counts are ``int64``.

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
from ._operands import check_array
from .searching import hits_distribution
from .sorting import alltoallv

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


def _local_unique(a: np.ndarray, equal_nan: bool, want):
    """NumPy's unique of a 1-D block: ``(values, first index, inverse, counts)`` (``None``
    where not wanted; counts always: the merge sums them)."""
    r = np.unique(a, return_index="indices" in want, return_inverse="inverse" in want,
                  return_counts=True, equal_nan=equal_nan)
    vals, rest = r[0], list(r[1:])
    first = rest.pop(0) if "indices" in want else None
    inv = rest.pop(0) if "inverse" in want else None
    return vals, first, inv, rest[0]


def _merge_unique(comm, u, first, counts, equal_nan: bool, want):
    """Distributed merge of the ranks' local unique values ``u`` (sorted, with their global
    first indices and counts): a values-only sample sort by value (every copy of a value goes
    to one rank), then the copies merged (first index = the lowest rank's, the blocks being in
    index order; counts summed).  Returns ``(values, first, counts, ids)``: this rank's run of
    the global unique values and, for ``inverse``, the global number of each of ``u``."""
    p = comm.size
    m = u.shape[0]
    samples = u[(np.arange(1, p) * m) // p] if m else u[:0]
    sv = np.sort(np.concatenate(comm.allgather(samples)))
    cuts = np.searchsorted(u, sv[(np.arange(1, p) * sv.size) // p], "left") if sv.size \
        else np.zeros(p - 1, dtype=np.int64)
    send = np.diff(np.concatenate([[0], cuts, [m]]).astype(np.int64))
    ru, rc = alltoallv(comm, u, send)
    rn, _ = alltoallv(comm, counts.astype(np.int64), send)
    rf = alltoallv(comm, first.astype(np.int64), send)[0] if first is not None else None
    order = np.argsort(ru, kind="stable")  # ties in source order: first indices ascending
    s = ru[order]
    start = np.ones(s.shape[0], dtype=bool)
    start[1:] = ~_eq(s[1:], s[:-1], equal_nan)
    heads = np.flatnonzero(start)
    vals = s[heads]
    cnt = np.add.reduceat(rn[order], heads) if heads.size else rn[:0]
    fst = rf[order][heads] if rf is not None else None
    ids = None
    if "inverse" in want:
        base = comm.exscan(int(heads.shape[0])) or 0
        gid = np.empty(s.shape[0], dtype=np.int64)
        gid[order] = np.cumsum(start) - 1 + base
        ids, _ = alltoallv(comm, gid, rc)  # back to the senders, in the order they sent
    return vals, fst, cnt, ids


@collective_entry
def _unique(x: DistArray, equal_nan: bool, call: str, want: tuple, axis=None):
    check_array(x)
    with agreed(x.grid.cart, call, x=x, equal_nan=bool(equal_nan), want=want, axis=canon(axis)):
        if axis is not None:
            raise TypeError(f"{call}: only axis=None is supported for DistArrays")
        if x.dtype.kind not in "biufc":
            raise TypeError(f"{call}: unsupported dtype {x.dtype}")
    y = x.reshape(-1) if x.ndim != 1 else x
    xp = y.xp
    d = y.distribution
    g = y.split[0]
    loc = np.ascontiguousarray(to_host(y.local))
    vals, first, inv, counts = _local_unique(loc, bool(equal_nan), want)
    if g is not None and y.grid.dims[g] > 1:
        comm = y.grid.sub_comm([g])
        if first is not None:
            first = first.astype(np.int64) + d.offsets[0][d.axis_coord(0, y.grid.coords)]
        vals, first, counts, ids = _merge_unique(comm, vals, first, counts, bool(equal_nan),
                                                 want)
        if inv is not None:
            inv = ids[inv]
    hd = hits_distribution(y, int(vals.shape[0]))

    def wrap(a, dist=hd):
        return DistArray(a if xp is np else xp.asarray(a), dist, y.grid)

    out = {"values": wrap(vals)}
    if "indices" in want:
        out["indices"] = wrap(first.astype(np.int64))
    if "counts" in want:
        out["counts"] = wrap(counts.astype(np.int64))
    if "inverse" in want:
        r = wrap(inv.reshape(-1).astype(np.int64), d)
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

