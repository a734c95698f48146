"""Advanced (integer-array and partial boolean-mask) indexing of DistArrays: ``x[idx]``,
``x[:, idx]``, ``x[i0, i1]``, ``X[X[:, 0] > 0]`` and assignment through them, ``ufunc.at``
and ``put``.  NumPy's semantics: index arrays (NumPy arrays, lists or DistArrays; integers
next to them count as 0-d index arrays) broadcast together to a shape ``B``; a boolean array
over ``k`` axes is its ``nonzero()`` (``k`` integer arrays); the ``B`` axes replace the
indexed axes where those are adjacent in the key, else they come first.  Every function is
collective over the grid of ``x``.

Layout of ``x[key]`` (the result ``R``): the axes ``x`` keeps (sliced, or new ``None`` axes)
keep ``x``'s split and ownership (of the selected elements, as basic slicing); the ``B`` axes
are laid out

* like the index when the (only) DistArray index has the shape ``B`` and splits at most its
  first axis over a grid axis the kept axes do not use (a row mask gives the hits layout of
  :func:`disttensor.routines.searching.nonzero`, so ``X[X[:, 0] > 0]`` moves no rows);
* else, when an indexed axis is split, with the first ``B`` axis balanced over the grid axis
  of the first split indexed axis (a DistArray index in another layout is gathered first);
* else (no indexed axis split) whole on every rank: ``x.local[key]``, no messages.

Gather: every rank computes the owners of the index tuples of its block of ``R`` (the owners'
coordinates along the grid axes of the indexed axes; its own along the others), sends the
owners their local index tuples and gets the rows ``x[i0, ..., rest block]`` back: two
``MPI_Alltoallv`` (requests, answers) over the grid.  Scatter (``x[key] = v``,
``ufunc.at``): the ranks holding ``R``'s blocks once (coordinate 0 along grid axes ``R`` does
not use) send index tuples and value rows to every replica of the owning block, which
assigns them (``x[i] = v``) or applies ``ufunc.at`` there.  Duplicate indices: ``ufunc.at``
applies each occurrence; assignment keeps the LAST occurrence in row-major order of ``B``
(what NumPy does in practice, which it does not promise).  Out-of-bounds indices raise
NumPy's ``IndexError`` on every rank.  Keys in an assignment may hold slices with a positive
step but no ``None`` or negative step (``TypeError``).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ..core.array import DistArray, _check_grids
from ..core.backend import to_host
from ..core.comm import collective, mpi_type
from ..core.distribution import Distribution
from ..core.entry import agreed, canon, collective_entry, operand_key
from .fancy_keys import (FancyPlan, as_key_entries, broadcast_index_shapes, is_fancy_key,
                         plan_key, shape_str)
from .sorting import alltoallv
from .ufuncs import align

__all__ = ["FancyPlan", "plan_key", "is_fancy_key", "fancy_getitem", "fancy_setitem",
           "ufunc_at", "put"]


def _index_arrays(key, plan_sources_count: int) -> tuple[list, list]:
    """The index arrays of ``key`` in planning order (booleans as their nonzero() parts), and
    which of them come from booleans (in bounds by construction)."""
    out, from_mask = [], []
    for k in key if isinstance(key, tuple) else (key,):
        if isinstance(k, (slice, type(None), type(Ellipsis))):
            continue
        n = len(out)
        if isinstance(k, numbers.Integral):
            out.append(np.asarray(int(k), dtype=np.int64))
        elif isinstance(k, DistArray):
            if k.dtype == np.bool_:
                from .searching import nonzero
                out.extend(nonzero(k))
            else:
                out.append(k)
        else:
            k = np.asarray(k)
            out.extend(np.nonzero(k) if k.dtype == np.bool_ else [k])
        from_mask += [getattr(k, "dtype", None) == np.bool_] * (len(out) - n)
    assert len(out) == plan_sources_count
    return out, from_mask


def _key_meta(key):
    """What must agree about a key: its entries, arrays by value when small (``canon``)."""
    key = key if isinstance(key, tuple) else (key,)
    return tuple(operand_key(k) if isinstance(k, DistArray) else canon(k) for k in key)


# -- the operand: planned key, index blocks, result layout -------------------------------------
@dataclass
class _Fancy:
    """A planned advanced key on ``y`` (``x`` after the basic step): this rank's index tuples
    (one flat int64 array per indexed axis, non-negative, over ``y``'s axes ``plan.axes``)
    of its block of the result ``r`` (distribution ``rdist``; ``b_ndim`` index axes at
    ``plan.position``; ``b_local``: the local shape of the index axes)."""

    y: DistArray
    plan: FancyPlan
    flat: list
    b_local: tuple
    rdist: Distribution


def _check_writable(plan: FancyPlan) -> None:
    if any(k is None or (k.step is not None and k.step < 0) for k in plan.basic):
        raise TypeError("assignment through index arrays supports slices with a positive "
                        "step and no None (np.newaxis) entries")


def _view(x: DistArray, plan: FancyPlan, write: bool) -> DistArray:
    """``x[plan.basic]``: a view on ``x``'s block (slices with a positive step), else (new axes,
    negative steps) a copy through basic indexing; ``write`` refuses the copy."""
    from .indexing import _selection, getitem, normalize_key
    sels, new_axes = normalize_key(plan.basic, x.shape)
    if new_axes or any(s.flip for s in sels):
        assert not write  # _check_writable
        return getitem(x, plan.basic)
    if all(s.count == n and s.step == 1 for s, n in zip(sels, x.shape)):
        return x
    local_sl, dist = _selection(x, sels)
    return DistArray(x.local[local_sl], dist, x.grid)


def _check_bounds(arrays, x_axes, x_shape) -> None:
    """NumPy's ``IndexError`` for the first index out of bounds (axis ``x_axes[j]`` of ``x``)."""
    for a, xa in zip(arrays, x_axes):
        n = x_shape[xa]
        if a.size == 0:
            continue
        bad = (a >= n) | (a < -n)
        if bad.any():
            v = int(a.reshape(-1)[np.argmax(bad.reshape(-1))])
            raise IndexError(f"index {v} is out of bounds for axis {xa} with size {n}")


def _prepare(x: DistArray, key, plan: FancyPlan, write: bool) -> _Fancy:
    """Index arrays to this rank's index tuples and the result layout (module docstring);
    collective over ``x``'s grid (bounds agreed)."""
    grid = x.grid
    y = _view(x, plan, write)
    idx, from_mask = _index_arrays(key, len(plan.sources))
    dy = y.distribution
    rest = [t for t in range(y.ndim) if t not in plan.axes]
    rest_grid = {dy.split[t] for t in rest} - {None}
    dists = [i for i in idx if isinstance(i, DistArray)]
    b_shape = None
    own = None  # the distribution of the index axes when the result follows the index
    if True:  # checks of replicated metadata: every rank raises alike (no all-reduce)
        b_shape = broadcast_index_shapes([i.shape for i in idx])
        if dists:
            d0 = dists[0].distribution
            for i in dists:
                _check_grids(i.grid, grid)
            if (all(i.shape == b_shape and i.distribution == d0 for i in dists)
                    and all(isinstance(i, DistArray) or i.ndim == 0 for i in idx)
                    and d0.grid_dims == grid.dims and all(g is None for g in d0.split[1:])
                    and (not d0.split or d0.split[0] not in rest_grid)):
                own = d0
    if dists and own is None:  # another layout: gather the index arrays
        idx = [i.to_numpy() if isinstance(i, DistArray) else i for i in idx]
    if own is not None:
        b_dist = own
        b_local = own.block_shape(grid.coords)
        loc = [to_host(i.local) if isinstance(i, DistArray) else np.broadcast_to(i, b_local)
               for i in idx]
    else:
        split_adv = [dy.split[t] for t in plan.axes if dy.split[t] is not None]
        split = [None] * len(b_shape)
        if split_adv and b_shape:
            split[0] = split_adv[0]
        b_dist = Distribution(b_shape, grid.dims, split)
        sl = b_dist.block_slices(grid.coords)
        loc = [np.broadcast_to(i, b_shape)[sl] for i in idx]
    if not all(from_mask):  # indices from masks are in bounds
        with collective(grid.cart):
            _check_bounds([a for a, m in zip(loc, from_mask) if not m],
                          [xa for xa, m in zip(plan.x_axes, from_mask) if not m], x.shape)
    flat = []
    for a, t in zip(loc, plan.axes):
        f = np.asarray(a, dtype=np.int64).reshape(-1)
        flat.append(np.where(f < 0, f + y.shape[t], f))
    p = plan.position
    rsplit = [dy.split[t] for t in rest]
    rsizes = [dy.sizes(t) if dy.split[t] is not None else None for t in rest]
    rshape = [y.shape[t] for t in rest]
    bsizes = [b_dist.sizes(t) if g is not None else None for t, g in enumerate(b_dist.split)]
    rdist = Distribution(rshape[:p] + list(b_shape) + rshape[p:], grid.dims,
                         rsplit[:p] + list(b_dist.split) + rsplit[p:],
                         rsizes[:p] + bsizes + rsizes[p:])
    return _Fancy(y, plan, flat, tuple(b_local if own is not None else
                                       b_dist.block_shape(grid.coords)), rdist)


# -- routing index tuples to their owners -------------------------------------------------------
def _strides(dims) -> list:
    s, acc = [0] * len(dims), 1
    for g in reversed(range(len(dims))):
        s[g], acc = acc, acc * dims[g]
    return s


def _route(f: _Fancy, fan_out: bool):
    """``(dest ranks, owner-local index tuples)`` of this rank's flat index tuples; with
    ``fan_out`` each tuple goes to every replica of its owning block (repeated per replica)."""
    y, grid = f.y, f.y.grid
    dy = y.distribution
    dims, coords, st = grid.dims, grid.coords, _strides(grid.dims)
    adv_grid = {dy.split[t] for t in f.plan.axes} - {None}
    fan = [g for g in dy.replicated_grid_axes if dims[g] > 1] if fan_out else []
    base = sum(coords[g] * st[g] for g in range(len(dims))
               if g not in adv_grid and g not in fan)
    dest = np.full(f.flat[0].shape, base, dtype=np.int64)
    local = []
    for a, t in zip(f.flat, f.plan.axes):
        g = dy.split[t]
        if g is None:
            local.append(a)
            continue
        off = np.asarray(dy.offsets[t], dtype=np.int64)
        if len(off) <= 17:  # a few blocks: comparisons beat a binary search per index
            owner = np.zeros(a.shape, dtype=np.int64)
            for o in off[1:-1]:
                owner += a >= o
        else:
            owner = np.searchsorted(off, a, side="right") - 1
        dest += owner * st[g]
        local.append(a - off[owner])
    tuples = local[0].reshape(-1, 1) if len(local) == 1 else np.stack(local, axis=1)
    for g in fan:
        dest = np.concatenate([dest + c * st[g] for c in range(dims[g])])
        tuples = np.concatenate([tuples] * dims[g])
    return dest, tuples


def _sort_by_dest(dest, counts):
    """The stable order of the tuples by destination (a radix sort on small integers)."""
    size = len(counts)
    small = np.uint8 if size <= 256 else np.uint16 if size <= 65536 else np.int64
    return np.argsort(dest.astype(small, copy=False), kind="stable")


def _moved(y: DistArray, axes):
    """``y``'s block with the indexed axes first (a view)."""
    return np.moveaxis(y.local, list(axes), list(range(len(axes))))


# -- gather ---------------------------------------------------------------------------------
def _gather(f: _Fancy) -> DistArray:
    y, grid, plan = f.y, f.y.grid, f.plan
    src = _moved(y, plan.axes)
    rest_shape = tuple(src.shape[len(plan.axes):])
    k = f.flat[0].size
    if all(y.distribution.split[t] is None for t in plan.axes):
        rows = src[tuple(f.flat)]
    else:
        comm = grid.cart
        dest, tuples = _route(f, fan_out=False)
        counts = np.bincount(dest, minlength=comm.size).astype(np.int64)
        if _all_own(comm, counts, dest.size):  # e.g. a row mask's hits: no element moves
            return _finish_gather(f, src[tuple(tuples.T)], rest_shape)
        order = _sort_by_dest(dest, counts)
        na = len(plan.axes)
        req, rcounts = alltoallv(comm, tuples[order].reshape(-1), counts * na)
        req = req.reshape(-1, na)
        ans = to_host(src[tuple(req.T)])
        row = math.prod(rest_shape)
        got = _exchange(comm, ans.reshape(-1), rcounts // na * row, counts * row)
        rows = np.empty((k,) + rest_shape, dtype=y.dtype)
        rows[order] = got.reshape((k,) + rest_shape)
        rows = y.xp.asarray(rows)
    return _finish_gather(f, rows, rest_shape)


def _exchange(comm, send, send_counts, recv_counts):
    """``MPI_Alltoallv`` of consecutive pieces whose receive counts are known (the second
    round of a request/answer exchange: no count exchange)."""
    sd = np.concatenate([[0], np.cumsum(send_counts)[:-1]]).astype(np.int64)
    rd = np.concatenate([[0], np.cumsum(recv_counts)[:-1]]).astype(np.int64)
    send = np.ascontiguousarray(send)
    recv = np.empty(int(np.sum(recv_counts)), dtype=send.dtype)
    t = mpi_type(send.dtype)
    comm.Alltoallv([send, (send_counts.tolist(), sd.tolist()), t],
                   [recv, (recv_counts.tolist(), rd.tolist()), t])
    return recv


def _all_own(comm, counts, k: int) -> bool:
    """Whether every rank's ``k`` tuples all live on itself (one all-reduce; then no
    exchange)."""
    mine = bool(counts[comm.rank] == k)
    return bool(comm.allreduce(mine, op=MPI.LAND))


def _finish_gather(f: _Fancy, rows, rest_shape) -> DistArray:
    """The gathered rows ``(k, *rest)`` as this rank's block of the result."""
    y, plan = f.y, f.plan
    out = rows.reshape(f.b_local + rest_shape)
    nb, p = len(f.b_local), plan.position
    if p:
        out = y.xp.moveaxis(out, list(range(nb)), list(range(p, p + nb)))
    out = y.xp.ascontiguousarray(out)
    return DistArray(out, f.rdist, y.grid)


# -- scatter --------------------------------------------------------------------------------
def _scatter(f: _Fancy, value, ufunc=None) -> None:
    """Write ``value`` (broadcast to the result of the key) to the indexed elements of ``y``
    (assignment, or ``ufunc.at``; ``value`` ``None`` for a unary ``ufunc``)."""
    y, grid, plan = f.y, f.y.grid, f.plan
    rd = f.rdist
    nb, p = len(f.b_local), plan.position
    dst = _moved(y, plan.axes)
    rest_shape = tuple(dst.shape[len(plan.axes):])
    k = f.flat[0].size
    rows = None
    if value is not None:
        vl = align(value, grid, rd, y.device)
        vl = np.broadcast_to(to_host(vl), rd.block_shape(grid.coords))
        if p:
            vl = np.moveaxis(vl, list(range(p, p + nb)), list(range(nb)))
        rows = vl.reshape((k,) + rest_shape)
        if ufunc is None:
            rows = rows.astype(y.dtype, copy=False)

    def apply(target_idx, vals):
        if ufunc is None:
            dst[target_idx] = vals
        elif vals is None:
            ufunc.at(dst, target_idx)
        else:
            ufunc.at(dst, target_idx, vals)

    if all(y.distribution.split[t] is None for t in plan.axes) and \
            all(g is None for g in rd.split[p:p + nb]):
        apply(tuple(f.flat), rows)  # every rank writes its own block (and replicas theirs)
        return
    comm = grid.cart
    unused = set(range(grid.ndim)) - set(g for g in rd.split if g is not None)
    sender = all(grid.coords[g] == 0 for g in unused)
    if not sender:
        f.flat = [a[:0] for a in f.flat]
        rows = None if rows is None else rows[:0]
    dest, tuples = _route(f, fan_out=True)
    reps = dest.size // max(f.flat[0].size, 1) if f.flat[0].size else 1
    counts = np.bincount(dest, minlength=comm.size).astype(np.int64)
    if _all_own(comm, counts, dest.size):  # every write lands on the writer's own block
        apply(tuple(y.xp.asarray(r) for r in tuples.T), rows)
        return
    order = _sort_by_dest(dest, counts)
    na = len(plan.axes)
    req, rcounts = alltoallv(comm, tuples[order].reshape(-1), counts * na)
    req = req.reshape(-1, na)
    vals = None
    if value is not None:
        row = math.prod(rest_shape)
        allrows = np.concatenate([rows] * reps) if reps > 1 else rows
        vals = _exchange(comm, np.ascontiguousarray(allrows[order]).reshape(-1), counts * row,
                         rcounts // na * row)
        vals = y.xp.asarray(vals.reshape((req.shape[0],) + rest_shape))
    apply(tuple(y.xp.asarray(r) for r in req.T), vals)


# -- entry points -----------------------------------------------------------------------------
def _local_key(key):
    """The key on a one-rank grid: DistArray entries as their (whole) blocks."""
    def conv(k):
        return k.local if isinstance(k, DistArray) else k
    return tuple(conv(k) for k in key) if isinstance(key, tuple) else conv(key)


def _one_rank_result(x: DistArray, key, plan: FancyPlan, r) -> DistArray:
    """``r = x.local[key]`` on a one-rank grid, with the split the documented layout gives
    (the same on every grid; one block, so only the split matters)."""
    key = key if isinstance(key, tuple) else (key,)
    ysplit, a = [], 0
    for k in plan.basic:
        ysplit.append(None if k is None else x.split[a])
        a += k is not None
    rest = [g for t, g in enumerate(ysplit) if t not in plan.axes]
    nb = r.ndim - len(rest)
    dists = [k for k in key if isinstance(k, DistArray) and k.grid.dims == x.grid.dims]
    first, own = None, False  # the result follows the index (see _prepare)
    others_0d = all(isinstance(k, DistArray) or np.ndim(k) == 0 for k in key
                    if not isinstance(k, (slice, type(None), type(Ellipsis))))
    if len(dists) == 1 and dists[0].ndim == nb and dists[0].dtype != np.bool_ and others_0d \
            and all(g is None for g in dists[0].split[1:]) \
            and (dists[0].split[0] is None or dists[0].split[0] not in rest):
        first, own = dists[0].split[0], True
    elif len(dists) == 1 and dists[0].dtype == np.bool_ and nb == 1 and others_0d:
        first = next((g for g in dists[0].split if g is not None), None)
        own = first is None or first not in rest
        first = first if own else None
    adv = [ysplit[t] for t in plan.axes if ysplit[t] is not None]
    if not own and adv and nb:
        first = adv[0]
    bsplit = ([first] + [None] * (nb - 1)) if nb else []
    p = plan.position
    split = rest[:p] + bsplit + rest[p:]
    return DistArray(r, Distribution(r.shape, x.grid.dims, split), x.grid)


def _value(value):
    return np.asarray(value) if isinstance(value, (list, tuple)) else value


@collective_entry
def fancy_getitem(x: DistArray, key) -> DistArray:
    """``x[key]`` for a key with index arrays (module docstring: semantics and layout)."""
    key = as_key_entries(key)
    with agreed(x.grid.cart, "getitem", x=x, key=_key_meta(key)):
        plan = plan_key(key, x.shape)
    if x.grid.size == 1:
        return _one_rank_result(x, key, plan, x.xp.ascontiguousarray(x.local[_local_key(key)]))
    return _gather(_prepare(x, key, plan, write=False))


def _check_value(f: _Fancy, value) -> None:
    vshape = tuple(np.shape(value)) if not isinstance(value, DistArray) else value.shape
    rshape = f.rdist.shape
    try:
        if np.broadcast_shapes(vshape, rshape) != rshape:
            raise ValueError
    except ValueError:
        raise ValueError(f"shape mismatch: value array of shape {shape_str(vshape)} could not "
                         f"be broadcast to indexing result of shape {shape_str(rshape)}") \
            from None


@collective_entry
def fancy_setitem(x: DistArray, key, value) -> None:
    """``x[key] = value`` for a key with index arrays (in place; duplicates: the last in
    row-major index order wins).  ``value``: scalar, NumPy array (replicated) or DistArray,
    broadcast to ``x[key]``'s shape."""
    key, value = as_key_entries(key), _value(value)
    with agreed(x.grid.cart, "setitem", x=x, key=_key_meta(key), value=operand_key(value)):
        plan = plan_key(key, x.shape)
        _check_writable(plan)
        if isinstance(value, DistArray):
            _check_grids(value.grid, x.grid)
    if x.grid.size == 1:
        x.local[_local_key(key)] = value.local if isinstance(value, DistArray) else value
        return
    f = _prepare(x, key, plan, write=True)
    with collective(x.grid.cart):
        _check_value(f, value)
    _scatter(f, value)


@collective_entry
def ufunc_at(ufunc, a: DistArray, indices, b=None) -> None:
    """``ufunc.at(a, indices, b)``: ``a[indices] = ufunc(a[indices], b)`` applied once per
    occurrence of an index (duplicates accumulate), in place; ``b`` broadcasts to
    ``a[indices]``'s shape (``None`` for a unary ufunc)."""
    indices, b = as_key_entries(indices), _value(b)
    with agreed(a.grid.cart, f"{ufunc.__name__}.at", a=a, indices=_key_meta(indices),
                b=operand_key(b)):
        if ufunc.nin == 2 and b is None:
            raise ValueError("second operand needed for ufunc")
        if ufunc.nin == 1 and b is not None:
            raise ValueError("second operand provided when ufunc is unary")
        if ufunc.nin > 2 or ufunc.nout != 1:
            raise ValueError(f"{ufunc.__name__}.at: only unary and binary ufuncs with one "
                             "output are supported")
        plan = plan_key(indices, a.shape)
        _check_writable(plan)
        if isinstance(b, DistArray):
            _check_grids(b.grid, a.grid)
    if a.grid.size == 1:
        args = () if b is None else (b.local if isinstance(b, DistArray) else b,)
        ufunc.at(a.local, _local_key(indices), *args)
        return
    f = _prepare(a, indices, plan, write=True)
    if b is not None:
        with collective(a.grid.cart):
            _check_value(f, b)
    _scatter(f, b, ufunc)


@collective_entry
def put(a: DistArray, ind, v, mode: str = "raise") -> None:
    """``numpy.put``: ``a.flat[ind] = v`` in place (``v`` repeated to ``len(ind)`` as NumPy
    does; duplicates: the last wins).  ``ind``: integers, a NumPy array or a DistArray
    (gathered); ``mode``: ``'raise'``, ``'wrap'`` or ``'clip'``."""
    if not isinstance(a, DistArray):
        raise TypeError(f"put: first argument must be a DistArray, got {type(a).__name__}")
    if isinstance(ind, DistArray):
        ind = ind.to_numpy()
    if isinstance(v, DistArray):
        v = v.to_numpy()
    ind = np.asarray(ind)
    v = np.asarray(v)
    with agreed(a.grid.cart, "put", a=a, ind=canon(ind), v=operand_key(v), mode=mode):
        if mode not in ("raise", "wrap", "clip"):
            raise ValueError("clipmode must be one of 'clip', 'raise', or 'wrap' "
                             f"(got {mode!r})")
        if ind.size and ind.dtype.kind not in "iu":
            raise TypeError(f"Cannot cast array data from {ind.dtype!r} to dtype('int64') "
                            "according to the rule 'safe'")
        n = a.size
        flat = ind.reshape(-1).astype(np.int64)
        if flat.size and v.size and n == 0:
            raise IndexError("cannot replace elements of an empty array")
        if mode == "raise" and flat.size:
            bad = (flat >= n) | (flat < -n)
            if bad.any():
                raise IndexError(f"index {int(flat[np.argmax(bad)])} is out of bounds for "
                                 f"axis 0 with size {n}")
    if flat.size == 0 or v.size == 0:
        return
    if mode == "wrap":
        flat = flat % n
    elif mode == "clip":
        flat = np.clip(flat, 0, n - 1)
    else:
        flat = np.where(flat < 0, flat + n, flat)
    vals = np.resize(v.reshape(-1), flat.size)
    if a.ndim == 0:
        a.local[...] = vals[-1]
        return
    fancy_setitem(a, np.unravel_index(flat, a.shape), vals)
