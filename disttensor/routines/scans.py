"""Cumulative sums and products of DistArrays along any axis (split or not).

``cumulative_sum(x, axis, dtype, include_initial)`` / ``cumulative_prod`` (array API) and
``cumsum`` / ``cumprod`` (NumPy: ``axis=None`` scans the flattened array) are collective.

Algorithm along an axis split over grid axis ``g`` (``p`` ranks along it): every rank scans
its block locally (``cumsum``/``cumprod``), takes the last slice of its local scan (the block
totals; the identity for an empty block), and one ``MPI_Exscan`` on the sub-communicator of
grid axis ``g`` gives each rank the combined totals of the blocks before it, which it adds to
(multiplies into) its local scan.  One message round of ``O(block / extent along axis)``
elements; no data moves.  Along an unsplit axis the scan is local.

Output distribution: that of ``x`` (``include_initial=True``: the axis gets one more element,
owned by the block of grid coordinate 0).  Results differ from a serial scan only by the
association of the sums/products: the error is bounded by ``(n_local + p) * eps`` times the
scan of ``|x|`` (tested at 1e-12 relative to it).
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, dtype_key
from ..core.backend import to_host
from ..core.comm import mpi_type
from ..core.distribution import Distribution
from ._operands import axis_index, check_array

__all__ = ["cumulative_sum", "cumulative_prod", "cumsum", "cumprod"]


def _exscan(comm, tot: np.ndarray, op: str) -> np.ndarray:
    """Exclusive scan of ``tot`` over ``comm`` (identity on the first rank)."""
    dt = tot.dtype
    work = np.ascontiguousarray(tot)
    if dt == np.bool_ or dt.char not in "bBhHiIlLqQfdgFD":
        work = work.astype(np.complex128 if dt.kind == "c" else np.float64)
    out = np.empty_like(work)
    t = mpi_type(work.dtype)
    comm.Exscan([work, t], [out, t], op=MPI.SUM if op == "sum" else MPI.PROD)
    if comm.rank == 0:
        out[...] = 0 if op == "sum" else 1
    return out.astype(dt, copy=False)


def _scan(x: DistArray, axis: int, dtype, op: str, include_initial: bool) -> DistArray:
    xp = x.xp
    loc = x.local
    r = (xp.cumsum if op == "sum" else xp.cumprod)(loc, axis=axis, dtype=dtype)
    g = x.split[axis]
    ident = 0 if op == "sum" else 1
    if g is not None and x.grid.dims[g] > 1:
        comm = x.grid.sub_comm([g])
        tshape = list(r.shape)
        tshape[axis] = 1
        if r.shape[axis]:
            idx = [slice(None)] * r.ndim
            idx[axis] = slice(r.shape[axis] - 1, None)
            tot = to_host(r[tuple(idx)])
        else:
            tot = np.full(tshape, ident, dtype=r.dtype)
        ex = _exscan(comm, tot, op)
        ex = ex if xp is np else xp.asarray(ex)
        r = r + ex if op == "sum" else r * ex
    d = x.distribution
    if not include_initial:
        return DistArray(r, Distribution(d.shape, d.grid_dims, d.split, d.split_sizes), x.grid)
    shape = list(d.shape)
    shape[axis] += 1
    sizes = list(d.split_sizes)
    first = True
    if g is not None:
        s = list(sizes[axis])
        s[0] += 1
        sizes[axis] = s
        first = x.grid.coords[g] == 0
    if first:
        ishape = list(r.shape)
        ishape[axis] = 1
        r = xp.concatenate([xp.full(ishape, ident, dtype=r.dtype), r], axis=axis)
    return DistArray(r, Distribution(shape, d.grid_dims, d.split, sizes), x.grid)


def _entry(call, x, axis, dtype, include_initial, op, flatten_none: bool):
    check_array(x, None)
    with agreed(x.grid.cart, call, x=x, axis=canon(axis), dtype=dtype_key(dtype),
                include_initial=bool(include_initial)):
        if axis is None:
            if not flatten_none and x.ndim != 1:
                raise ValueError(f"{call}: axis must be given for a {x.ndim}-d array")
            if x.ndim == 0:
                raise ValueError(f"{call} of a 0-d array needs axis=None with NumPy's cumsum")
            ax = 0
        else:
            ax = axis_index(axis, x.ndim)
        if dtype is not None:
            dtype = np.dtype(dtype)
    if axis is None and x.ndim != 1:
        x = x.reshape(-1)
    return _scan(x, ax, dtype, op, include_initial)


@collective_entry
def cumulative_sum(x: DistArray, /, *, axis=None, dtype=None, include_initial=False) -> DistArray:
    """Array API ``cumulative_sum``: inclusive running sum along ``axis`` (required unless
    ``x`` is 1-D); ``include_initial`` prepends a zero.  Collective; the result keeps ``x``'s
    distribution (see the module docstring)."""
    return _entry("cumulative_sum", x, axis, dtype, include_initial, "sum", False)


@collective_entry
def cumulative_prod(x: DistArray, /, *, axis=None, dtype=None, include_initial=False) -> DistArray:
    """Array API ``cumulative_prod`` (``include_initial`` prepends a one)."""
    return _entry("cumulative_prod", x, axis, dtype, include_initial, "prod", False)


@collective_entry
def cumsum(x: DistArray, axis=None, dtype=None) -> DistArray:
    """NumPy ``cumsum``: ``axis=None`` scans the flattened array (``x.reshape(-1)``)."""
    if isinstance(x, DistArray) and x.ndim == 0 and axis is None:
        x = x.reshape(1)
    return _entry("cumsum", x, axis, dtype, False, "sum", True)


@collective_entry
def cumprod(x: DistArray, axis=None, dtype=None) -> DistArray:
    """NumPy ``cumprod``: ``axis=None`` scans the flattened array."""
    if isinstance(x, DistArray) and x.ndim == 0 and axis is None:
        x = x.reshape(1)
    return _entry("cumprod", x, axis, dtype, False, "prod", True)
