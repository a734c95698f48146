"""Shaping and utility functions of DistArrays that NumPy and the array API standard add to
the core (:mod:`disttensor.routines.manipulation`, :mod:`disttensor.routines.reductions`).

Every function here is collective over the grid of its DistArray operands; the ranks agree on
the metadata arguments (axes, shapes, repeats, modes) before any data moves.

Output distributions and algorithms
-----------------------------------
* ``expand_dims``: a new length-1 axis, not split; the local block is reshaped (no messages).
* ``squeeze``: the removed length-1 axes are first made unsplit (a redistribution that only
  moves the one row from its owner to the ranks along that grid axis), then dropped locally.
* ``stack``: ``expand_dims`` of every operand then :func:`~disttensor.routines.manipulation.concatenate`
  along the new axis (operands are redistributed to the first one's layout).
* ``unstack``: one integer index per position (:mod:`disttensor.routines.indexing`).
* ``broadcast_to`` / ``broadcast_arrays``: the result layout follows the alignment rule of
  :mod:`disttensor.core.array`; broadcast (new or length-1) axes are replicated, the block is
  materialized (a copy, unlike NumPy's read-only view).
* ``tile``: concatenation of copies per axis (one redistribution per tiled axis).
* ``repeat``: the repeated axis is gathered whole on the ranks along its grid axis (memory
  ``O(n)`` along that axis per rank), repeated locally, and cut again into balanced blocks
  over the same grid axis; ``axis=None`` flattens first (as NumPy).
* ``roll``: along each rolled axis, the concatenation of the two slices ``x[n-s:]`` and
  ``x[:n-s]`` (slicing moves nothing; the concatenation is one redistribution), redistributed
  back to the input's ownership sizes: a shift moves at most two pieces per block, so each rank
  sends to and receives from at most two ranks along that grid axis.  The result has the
  input's distribution.  ``axis=None`` rolls the flattened array.
* ``pad``: the padded axes are gathered whole (as ``repeat``), padded locally with
  ``numpy.pad`` (modes ``constant``, ``edge``, ``reflect``, ``symmetric``, ``wrap``), and cut
  into balanced blocks over their original grid axes.
* ``meshgrid``/``eye``: created in the default layout of the result's shape on the grid given
  (or the first operand's grid); values from global indices, no messages except aligning the
  1-D inputs.
* ``tril``/``triu``: masks from global indices of the last two axes (no messages).
* ``isclose``, ``clip`` (array bounds), ``round``, ``copysign``-like helpers: elementwise with
  the alignment rule; ``allclose``/``array_equal`` return Python ``bool`` (one all-reduce).
* ``diff``: differences of two slices (``x[1:] - x[:-1]``, the alignment rule redistributes
  one of them); ``prepend``/``append`` are concatenated first.
* ``isin``: the test values are gathered on every rank, then each block is tested locally.
* ``take``: the indices are replicated (a DistArray of indices is gathered), the input is made
  whole along ``axis``, taken locally and cut into balanced blocks again.
  ``take_along_axis``: both arrays whole along ``axis`` in the layout of ``indices``, taken
  locally, redistributed back to the layout of ``indices``.
* nan-reductions (``nansum``, ``nanprod``, ``nanmean``, ``nanvar``, ``nanstd``, ``nanmin``,
  ``nanmax``, ``nanargmin``, ``nanargmax``): local partial results that skip NaN, one
  all-reduce over the grid axes that split the reduced axes (as :mod:`disttensor.routines.reductions`);
  ``nanvar`` is two-pass (mean, then squared deviations).  ``nanmin``/``nanmax`` of an
  all-NaN slice give NaN (NumPy also warns); ``nanargmin``/``nanargmax`` raise
  ``ValueError("All-NaN slice encountered")`` on every rank.  Error bounds of the float sums
  are those of :mod:`disttensor.routines.reductions` (a different summation order than NumPy's
  pairwise sum: relative error ``O(n eps)`` in the worst case).
"""
from __future__ import annotations

import builtins
import math
import numbers
import operator

import numpy as np

from ...core.array import DistArray
from ...core.layout import make_distribution
from ...core.entry import agreed, canon, collective_entry, dtype_key, operand_key
from ...core.backend import array_module
from ...core.distribution import Distribution, balanced_sizes

__all__ = ["expand_dims", "squeeze", "stack", "unstack", "broadcast_to", "broadcast_arrays",
           "tile", "repeat", "roll", "pad", "meshgrid", "eye", "tril", "triu", "isclose",
           "allclose", "array_equal", "clip", "round", "diff", "take", "take_along_axis", "isin",
           "nansum", "nanprod", "nanmean", "nanvar", "nanstd", "nanmin", "nanmax",
           "nanargmin", "nanargmax", "elementwise", "HANDLED_FUNCTIONS"]


# -- helpers ------------------------------------------------------------------------------------
def _check(x, name: str = "x") -> None:
    if not isinstance(x, DistArray):
        raise TypeError(f"{name} must be a DistArray, got {type(x).__name__}")


def _axis(a, nd: int) -> int:
    from numpy.lib.array_utils import normalize_axis_index
    return normalize_axis_index(operator.index(a), nd)


def _axes(axis, nd: int) -> tuple[int, ...]:
    from numpy.lib.array_utils import normalize_axis_tuple
    return tuple(normalize_axis_tuple(axis, nd))


def _unsplit(x: DistArray, axes) -> DistArray:
    """``x`` with tensor ``axes`` not split (other axes keep split and sizes); ``x`` itself
    when they are not split already (a redistribution otherwise)."""
    d = x.distribution
    if all(d.split[t] is None for t in axes):
        return x
    split = [None if t in axes else g for t, g in enumerate(d.split)]
    sizes = [None if (t in axes or g is None) else d.sizes(t) for t, g in enumerate(d.split)]
    return x.redistribute(distribution=Distribution(d.shape, d.grid_dims, split, sizes))


def _cut(local, shape, d: Distribution, grid, resplit: dict) -> DistArray:
    """Wrap ``local`` (whole along the keys of ``resplit``, otherwise the block of ``d`` with
    shape ``shape``) and cut it into balanced blocks over the grid axes ``resplit[t]`` (free
    grid axes of ``d``), without messages."""
    split = list(d.split)
    sizes = [d.sizes(t) if g is not None else None for t, g in enumerate(d.split)]
    idx = [slice(None)] * len(shape)
    for t, g in resplit.items():
        if g is None:
            continue
        bs = balanced_sizes(shape[t], d.grid_dims[g])
        c = grid.coords[g]
        lo = sum(bs[:c])
        idx[t] = slice(lo, lo + bs[c])
        split[t], sizes[t] = g, None
    nd = Distribution(shape, d.grid_dims, split, sizes)
    loc = local[tuple(idx)] if resplit else local
    return DistArray(array_module(loc).ascontiguousarray(loc), nd, grid)


def _anchor(values):
    return next((v for v in values if isinstance(v, DistArray)), None)


@collective_entry
def elementwise(fn, name: str, operands, /, **kwargs) -> DistArray:
    """``fn(*local operands, **kwargs)`` under the alignment rule of :mod:`disttensor.core.array`:
    the result takes the layout of the first DistArray operand of the full result shape;
    other operands are redistributed, NumPy arrays and scalars are replicated values.
    ``fn`` must be elementwise (its result has the broadcast shape)."""
    from ...core.array import _check_grids
    from ..ufuncs import _device_of_operands, align, operand_shape, result_layout
    ops = [np.asarray(o) if isinstance(o, (list, tuple)) else o for o in operands]
    anchor = _anchor(ops)
    with agreed(None if anchor is None else anchor.grid.cart, name,
                **{f"x{i}": operand_key(o) for i, o in enumerate(ops, 1)},
                **{k: canon(v) if not isinstance(v, DistArray) else v
                   for k, v in kwargs.items()}):
        if anchor is None:
            raise TypeError(f"{name} needs at least one DistArray operand")
        shape = np.broadcast_shapes(*[operand_shape(o) for o in ops])
        grid, dist = result_layout(ops, shape)
        device = _device_of_operands([o for o in ops if isinstance(o, DistArray)])
        for o in ops:
            if isinstance(o, DistArray):
                _check_grids(o.grid, grid)
    locs = [align(o, grid, dist, device) for o in ops]
    r = fn(*locs, **kwargs)
    block = dist.block_shape(grid.coords)
    xp = array_module(r) if hasattr(r, "shape") else np
    r = xp.asarray(r)
    if tuple(r.shape) != block:
        r = xp.broadcast_to(r, block).copy()
    return DistArray(r, dist, grid)


# -- axes -----------------------------------------------------------------------------------------
@collective_entry
def expand_dims(x: DistArray, axis=0) -> DistArray:
    """New length-1 axes at ``axis`` (int or tuple, positions in the result), not split."""
    _check(x)
    with agreed(x.grid.cart, "expand_dims", x=x, axis=canon(axis)):
        n_new = len(axis) if isinstance(axis, (tuple, list)) else 1
        pos = _axes(axis, x.ndim + n_new)
    d = x.distribution
    shape, split, sizes = [], [], []
    it = iter(range(x.ndim))
    for u in range(x.ndim + n_new):
        if u in pos:
            shape.append(1), split.append(None), sizes.append(None)
        else:
            t = next(it)
            shape.append(d.shape[t]), split.append(d.split[t])
            sizes.append(d.sizes(t) if d.split[t] is not None else None)
    nd = Distribution(shape, d.grid_dims, split, sizes)
    return DistArray(x.local.reshape(nd.block_shape(x.grid.coords)).copy(), nd, x.grid)


@collective_entry
def squeeze(x: DistArray, axis=None) -> DistArray:
    """Remove length-1 axes (all of them for ``axis=None``); ``ValueError`` for an axis whose
    length is not 1."""
    _check(x)
    with agreed(x.grid.cart, "squeeze", x=x, axis=canon(axis)):
        if axis is None:
            axes = tuple(t for t, n in enumerate(x.shape) if n == 1)
        else:
            axes = _axes(axis, x.ndim)
            for t in axes:
                if x.shape[t] != 1:
                    raise ValueError("cannot select an axis to squeeze out which has size "
                                     "not equal to one")
    y = _unsplit(x, axes)
    nd = y.distribution.drop_axes(axes)
    loc = y.local.reshape(nd.block_shape(x.grid.coords))
    return DistArray(loc.copy() if y is x else loc, nd, x.grid)


@collective_entry
def stack(arrays, axis=0) -> DistArray:
    """Join arrays of one shape along a new axis (the layout of the first one)."""
    from . import concatenate
    arrays = list(arrays)
    anchor = _anchor(arrays)
    with agreed(None if anchor is None else anchor.grid.cart, "stack",
                arrays=tuple(operand_key(a) for a in arrays), axis=canon(axis)):
        if not arrays:
            raise ValueError("need at least one array to stack")
        for a in arrays:
            _check(a, "every operand")
        if len({a.shape for a in arrays}) != 1:
            raise ValueError("all input arrays must have the same shape")
        ax = _axis(axis, arrays[0].ndim + 1)
    return concatenate([expand_dims(a, ax) for a in arrays], axis=ax)


@collective_entry
def unstack(x: DistArray, axis=0) -> tuple:
    """The slices of ``x`` along ``axis``, as a tuple of DistArrays."""
    _check(x)
    with agreed(x.grid.cart, "unstack", x=x, axis=canon(axis)):
        if x.ndim == 0:
            raise ValueError("Input array must be at least 1-d.")
        ax = _axis(axis, x.ndim)
    pre = (slice(None),) * ax
    return tuple(x[pre + (i,)] for i in range(x.shape[ax]))


# -- broadcasting ---------------------------------------------------------------------------------
@collective_entry
def broadcast_to(x: DistArray, shape) -> DistArray:
    """``x`` broadcast to ``shape`` (a materialized copy): axes of ``x`` that keep their
    length keep their split; new and stretched axes are replicated."""
    from ..ufuncs import align
    _check(x)
    with agreed(x.grid.cart, "broadcast_to", x=x, shape=canon(shape)):
        shape = (int(shape),) if isinstance(shape, numbers.Integral) else tuple(shape)
        np.broadcast_shapes(x.shape, shape)
        if np.broadcast_shapes(x.shape, shape) != shape:
            raise ValueError(f"cannot broadcast a array of shape {x.shape} to shape {shape}")
    d = x.distribution
    off = len(shape) - x.ndim
    split = [None] * len(shape)
    sizes = [None] * len(shape)
    for t in range(x.ndim):
        if x.shape[t] == shape[t + off] and d.split[t] is not None:
            split[t + off], sizes[t + off] = d.split[t], d.sizes(t)
    nd = Distribution(shape, d.grid_dims, split, sizes)
    loc = align(x, x.grid, nd, x.device)
    return DistArray(x.xp.broadcast_to(loc, nd.block_shape(x.grid.coords)).copy(), nd, x.grid)


@collective_entry
def broadcast_arrays(*arrays) -> tuple:
    """The operands broadcast against each other, all in one layout (the alignment rule)."""
    from ..ufuncs import align, operand_shape, result_layout
    anchor = _anchor(arrays)
    with agreed(None if anchor is None else anchor.grid.cart, "broadcast_arrays",
                arrays=tuple(operand_key(a) for a in arrays)):
        if anchor is None:
            raise TypeError("broadcast_arrays needs at least one DistArray")
        shape = np.broadcast_shapes(*[operand_shape(a) for a in arrays])
        grid, dist = result_layout(list(arrays), shape)
    block = dist.block_shape(grid.coords)
    out = []
    for a in arrays:
        loc = align(a, grid, dist, anchor.device)
        xp = array_module(loc) if hasattr(loc, "shape") else np
        out.append(DistArray(xp.broadcast_to(xp.asarray(loc), block).copy(), dist, grid))
    return tuple(out)


# -- repetition -----------------------------------------------------------------------------------
@collective_entry
def tile(x: DistArray, reps) -> DistArray:
    """``x`` repeated ``reps[i]`` times along axis ``i`` (NumPy's rule for ``len(reps)``
    different from ``x.ndim``)."""
    from . import concatenate
    _check(x)
    with agreed(x.grid.cart, "tile", x=x, reps=canon(reps)):
        reps = (reps,) if isinstance(reps, numbers.Integral) else tuple(reps)
        reps = tuple(operator.index(r) for r in reps)
        if any(r < 0 for r in reps):
            raise ValueError("negative dimensions are not allowed")
    y = x
    if len(reps) > x.ndim:
        y = expand_dims(x, tuple(range(len(reps) - x.ndim)))
    reps = (1,) * (y.ndim - len(reps)) + reps
    for t, r in enumerate(reps):
        if r == 0:
            y = y[(slice(None),) * t + (slice(0, 0),)]
        elif r > 1:
            y = concatenate([y] * r, axis=t)
    return y.copy() if y is x else y


@collective_entry
def repeat(x: DistArray, repeats, axis=None) -> DistArray:
    """Repeat each element ``repeats`` times (an int, or one count per element along
    ``axis``: a sequence, NumPy array or DistArray, gathered on every rank)."""
    _check(x)
    if isinstance(repeats, DistArray):
        repeats = repeats.to_numpy()
    rep = np.asarray(repeats)
    if rep.size == 0 and rep.dtype.kind == "f":  # an empty list: NumPy's float64 default
        rep = rep.astype(np.int64)
    with agreed(x.grid.cart, "repeat", x=x, repeats=canon(rep), axis=canon(axis)):
        if rep.dtype.kind not in "iu" and not (rep.dtype.kind == "b" and rep.ndim == 0):
            raise TypeError("repeats must be integers")
        if rep.ndim > 1:
            raise ValueError("repeats must be an integer or a 1-d array")
        if np.any(rep < 0):
            raise ValueError("repeats may not contain negative values.")
        ax = None if axis is None else _axis(axis, x.ndim)
        n = x.size if ax is None else x.shape[ax]
        if rep.ndim == 1 and rep.shape[0] not in (1, n):
            raise ValueError(f"operands could not be broadcast together with shape ({n},) "
                             f"({rep.shape[0]},)")
    if ax is None:
        return repeat(x.reshape(-1), rep, 0)
    g = x.split[ax]
    y = _unsplit(x, (ax,))
    loc = y.xp.repeat(y.local, y.xp.asarray(rep), axis=ax)
    shape = list(y.shape)
    shape[ax] = loc.shape[ax]
    d = y.distribution
    sizes = [d.sizes(t) if s is not None else None for t, s in enumerate(d.split)]
    base = Distribution(shape, d.grid_dims, d.split, sizes)
    return _cut(loc, tuple(shape), base, x.grid, {ax: g})


@collective_entry
def roll(x: DistArray, shift, axis=None) -> DistArray:
    """Elements shifted by ``shift`` along ``axis`` (ints or tuples, wrapping around); the
    result has ``x``'s distribution.  ``axis=None`` rolls the flattened array."""
    from . import concatenate
    _check(x)
    with agreed(x.grid.cart, "roll", x=x, shift=canon(shift), axis=canon(axis)):
        if axis is None:
            if not isinstance(shift, numbers.Integral):
                raise TypeError("roll with axis=None needs an integer shift")
            axes = shifts = None
        else:
            axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
            axes = tuple(_axis(a, x.ndim) for a in axes)
            shifts = (shift,) if isinstance(shift, numbers.Integral) else tuple(shift)
            shifts = tuple(operator.index(s) for s in shifts)
            if len(shifts) == 1:
                shifts = shifts * len(axes)
            elif len(axes) == 1:
                axes = axes * len(shifts)
            if len(shifts) != len(axes):
                raise ValueError("'shift' and 'axis' should be scalars or 1D sequences")
    if axes is None:
        flat = x.reshape(-1)
        return roll(flat, shift, 0).reshape(x.shape)
    total: dict[int, int] = {}
    for a, s in zip(axes, shifts):
        total[a] = total.get(a, 0) + s
    y = x
    for a, s in total.items():
        n = x.shape[a]
        s = s % n if n else 0
        if s == 0:
            continue
        pre = (slice(None),) * a
        y = concatenate([y[pre + (slice(n - s, n),)], y[pre + (slice(0, n - s),)]], axis=a)
        if y.distribution != x.distribution:
            y = y.redistribute(distribution=x.distribution)
    return y.copy() if y is x else y


@collective_entry
def pad(x: DistArray, pad_width, mode="constant", constant_values=0) -> DistArray:
    """``numpy.pad`` for the modes ``constant``, ``edge``, ``reflect``, ``symmetric`` and
    ``wrap`` (``pad_width`` as NumPy: an int, a pair, or one pair per axis)."""
    _check(x)
    modes = ("constant", "edge", "reflect", "symmetric", "wrap")
    with agreed(x.grid.cart, "pad", x=x, pad_width=canon(pad_width), mode=mode,
                constant_values=np.asarray(constant_values)):
        if mode not in modes:
            raise ValueError(f"mode {mode!r} is not supported (one of {modes})")
        pw = np.broadcast_to(np.asarray(pad_width), (x.ndim, 2))
        if pw.dtype.kind not in "iu":
            raise TypeError("`pad_width` must be of integral type.")
        if np.any(pw < 0):
            raise ValueError("index can't contain negative values")
        pw = [(int(a), int(b)) for a, b in pw]
        for t, (a, b) in enumerate(pw):
            if (a or b) and x.shape[t] == 0 and mode != "constant":
                raise ValueError(f"can't extend empty axis {t} using modes other than "
                                 "'constant' or 'empty'")
    axes = tuple(t for t, (a, b) in enumerate(pw) if a or b)
    y = _unsplit(x, axes)
    kw = {"constant_values": constant_values} if mode == "constant" else {}
    loc = y.xp.pad(y.local, pw, mode=mode, **kw)
    shape = tuple(n + a + b for n, (a, b) in zip(x.shape, pw))
    d = y.distribution
    base = Distribution(shape, d.grid_dims, d.split,
                        [d.sizes(t) if g is not None else None for t, g in enumerate(d.split)])
    return _cut(loc, shape, base, x.grid, {t: x.split[t] for t in axes})


# -- creation from indices --------------------------------------------------------------------------
@collective_entry
def meshgrid(*arrays, indexing="xy", grid=None, split=None) -> tuple:
    """Coordinate matrices from 1-D DistArrays (``indexing`` ``'xy'`` or ``'ij'``).  Every
    output has the result shape in the default layout of ``grid`` (default: the first
    operand's grid; ``split`` as in :func:`disttensor.zeros`)."""
    from ..ufuncs import align
    anchor = _anchor(arrays)
    with agreed(None if anchor is None else anchor.grid.cart, "meshgrid",
                arrays=tuple(operand_key(a) for a in arrays), indexing=indexing,
                grid=grid, split=canon(split)):
        for a in arrays:
            _check(a, "every operand")
            if a.ndim != 1:
                raise ValueError("meshgrid needs 1-D arrays")
        if indexing not in ("xy", "ij"):
            raise ValueError("Valid values for `indexing` are 'xy' and 'ij'.")
        g = anchor.grid if (grid is None and anchor is not None) else grid
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


@collective_entry
def eye(n_rows, n_cols=None, k=0, dtype=None, grid=None, split=None, sizes=None,
        device="cpu") -> DistArray:
    """The 2-D array with ones on diagonal ``k`` (``n_rows x n_cols``), in the given layout."""
    from ..creation import layout_args, local_index_grid, zeros, _grid
    g = _grid(grid)
    m = n_rows if n_cols is None else n_cols
    with agreed(g.cart, "eye", n_rows=canon(n_rows), n_cols=canon(m), k=canon(k),
                dtype=dtype_key(dtype, float), **layout_args((n_rows, m), g, split, sizes, device)):
        n_rows, m, k = operator.index(n_rows), operator.index(m), operator.index(k)
        if n_rows < 0 or m < 0:
            raise ValueError("negative dimensions are not allowed")
    x = zeros((n_rows, m), dtype=dtype, grid=g, split=split, sizes=sizes, device="cpu")
    i, j = local_index_grid(x)
    x.local[...] = (j - i == k)
    return x.to_device(device) if device != "cpu" else x


def _tri(call, x, k, lower: bool):
    from ..creation import local_index_grid
    _check(x)
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


# -- comparisons and elementwise ------------------------------------------------------------------
@collective_entry
def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False) -> DistArray:
    """Elementwise ``numpy.isclose`` (alignment rule)."""
    return elementwise(lambda u, v, **kw: array_module(u).isclose(u, v, **kw), "isclose",
                       (a, b), rtol=float(rtol), atol=float(atol), equal_nan=bool(equal_nan))


@collective_entry
def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
    """Whether every element is close (``bool``, the same on every rank)."""
    from .. import reductions
    return bool(reductions.all(isclose(a, b, rtol, atol, equal_nan)).item())


@collective_entry
def array_equal(a, b, equal_nan=False) -> bool:
    """Same shape and equal elements (``bool``, the same on every rank)."""
    from .. import reductions
    from ..ufuncs import operand_shape
    anchor = _anchor((a, b))
    with agreed(None if anchor is None else anchor.grid.cart, "array_equal",
                a=operand_key(a), b=operand_key(b), equal_nan=bool(equal_nan)):
        if anchor is None:
            raise TypeError("array_equal needs a DistArray operand")
        same = operand_shape(a) == operand_shape(b)
    if not same:
        return False

    def eq(u, v):
        xp = array_module(u) if hasattr(u, "shape") else np
        r = xp.equal(u, v)
        if equal_nan:
            r = r | (xp.isnan(u) & xp.isnan(v))
        return r
    return bool(reductions.all(elementwise(eq, "equal", (a, b))).item())


@collective_entry
def clip(x: DistArray, min=None, max=None) -> DistArray:
    """``x`` limited to ``[min, max]`` (scalars, NumPy arrays or DistArrays, broadcast;
    ``None`` means no bound); the dtype is ``x``'s (the array API rule)."""
    _check(x)
    if x.dtype.kind in "iu":  # a Python int bound outside the dtype's range bounds nothing
        info = np.iinfo(x.dtype)
        min, max = (v if not isinstance(v, int) or isinstance(v, bool)
                    else builtins.min(builtins.max(v, int(info.min)), int(info.max))
                    for v in (min, max))
    ops = [x] + [v for v in (min, max) if v is not None]
    has_lo, has_hi = min is not None, max is not None

    def fn(u, *b, **_):
        xp = array_module(u)
        r = u
        if has_lo:
            r = xp.maximum(r, b[0])
        if has_hi:
            r = xp.minimum(r, b[-1])
        return xp.asarray(r).astype(u.dtype, copy=False)
    return elementwise(fn, "clip", ops, has_min=has_lo, has_max=has_hi)


@collective_entry
def round(x: DistArray, decimals=0) -> DistArray:
    """Round half to even to ``decimals`` decimals (elementwise, the dtype of ``x``)."""
    _check(x)
    return elementwise(lambda u, decimals: array_module(u).round(u, decimals), "round", (x,),
                       decimals=operator.index(decimals))


@collective_entry
def diff(x: DistArray, n=1, axis=-1, prepend=None, append=None) -> DistArray:
    """``n``-th differences along ``axis`` (NumPy's ``diff``; the array API's ``diff(x, /, *,
    axis=-1, n=1, prepend=None, append=None)`` is the same call with keywords)."""
    from . import concatenate
    _check(x)
    with agreed(x.grid.cart, "diff", x=x, n=canon(n), axis=canon(axis),
                prepend=operand_key(prepend), append=operand_key(append)):
        n = operator.index(n)
        if n < 0:
            raise ValueError(f"order must be non-negative but got {n}")
        if x.ndim == 0:
            raise ValueError("diff requires input that is at least one dimensional")
        ax = _axis(axis, x.ndim)
        for v in (prepend, append):
            if v is not None and not isinstance(v, DistArray):
                raise TypeError("prepend/append must be DistArrays")
    y = x
    parts = [p for p in (prepend, x, append) if p is not None]
    if len(parts) > 1:
        y = concatenate(parts, axis=ax)
    pre = (slice(None),) * ax
    for _ in range(n):
        a, b = y[pre + (slice(1, None),)], y[pre + (slice(None, -1),)]
        y = np.not_equal(a, b) if y.dtype == np.bool_ else a - b
    return y.copy() if y is x else y


# -- indexing -------------------------------------------------------------------------------------
@collective_entry
def take(x: DistArray, indices, axis=None) -> DistArray:
    """Elements of ``x`` at integer ``indices`` (replicated; a DistArray is gathered) along
    ``axis`` (``None``: of the flattened array).  Negative indices count from the end."""
    _check(x)
    if isinstance(indices, DistArray):
        indices = indices.to_numpy()
    idx = np.asarray(indices)
    with agreed(x.grid.cart, "take", x=x, indices=canon(idx), axis=canon(axis)):
        if idx.dtype.kind not in "iu":
            raise IndexError("arrays used as indices must be of integer type")
        ax = None if axis is None else _axis(axis, x.ndim)
        n = x.size if ax is None else x.shape[ax]
        if idx.size and (idx.max() >= n or idx.min() < -n):
            raise IndexError(f"index out of range for axis of size {n}")
    if ax is None:
        return take(x.reshape(-1), idx, 0)
    g = x.split[ax]
    y = _unsplit(x, (ax,))
    xp = y.xp
    loc = xp.take(y.local, xp.asarray(idx.reshape(-1)), axis=ax)
    loc = loc.reshape(y.local.shape[:ax] + idx.shape + y.local.shape[ax + 1:])
    d = y.distribution
    shape = d.shape[:ax] + idx.shape + d.shape[ax + 1:]
    split = d.split[:ax] + (None,) * idx.ndim + d.split[ax + 1:]
    sz = [d.sizes(t) if s is not None else None for t, s in enumerate(d.split)]
    sizes = sz[:ax] + [None] * idx.ndim + sz[ax + 1:]
    base = Distribution(shape, d.grid_dims, split, sizes)
    return _cut(loc, shape, base, x.grid, {ax: g} if idx.ndim == 1 else {})


@collective_entry
def take_along_axis(x: DistArray, indices: DistArray, axis=-1) -> DistArray:
    """``numpy.take_along_axis``: ``indices`` has ``x``'s number of axes and broadcasts
    against it off ``axis``; the result has the layout of ``indices``."""
    from ..ufuncs import align
    _check(x)
    _check(indices, "indices")
    with agreed(x.grid.cart, "take_along_axis", x=x, indices=indices, axis=canon(axis)):
        if indices.dtype.kind not in "iu":
            raise IndexError("`indices` must be an integer array")
        if indices.ndim != x.ndim:
            raise ValueError("`indices` and `arr` must have the same number of dimensions")
        ax = _axis(axis, x.ndim)
        for t in range(x.ndim):
            if t != ax and x.shape[t] != indices.shape[t]:
                raise ValueError("`indices` and `arr` must have the same shape off `axis`")
    iw = _unsplit(indices, (ax,))
    d = iw.distribution
    shape = list(d.shape)
    shape[ax] = x.shape[ax]
    xd = Distribution(shape, d.grid_dims, d.split,
                      [d.sizes(t) if g is not None else None for t, g in enumerate(d.split)])
    xl = align(x, indices.grid, xd, x.device)
    il = iw.local
    n = x.shape[ax]
    bad = bool(il.size and (il.max() >= n or il.min() < -n))
    from ...core.comm import collective
    with collective(x.grid.cart):
        if bad:
            raise IndexError(f"index out of range for axis of size {n}")
    loc = x.xp.take_along_axis(xl, il % n if n else il, axis=ax)
    r = DistArray(loc, d, indices.grid)
    return r if d == indices.distribution else r.redistribute(distribution=indices.distribution)


@collective_entry
def isin(x1, x2, invert=False) -> DistArray:
    """Elementwise whether each element of ``x1`` (a DistArray) is in ``x2`` (a DistArray,
    gathered on every rank, a NumPy array or a scalar): the result has ``x1``'s layout;
    memory ``O(x2.size)`` per rank, no other messages."""
    _check(x1, "x1")
    with agreed(x1.grid.cart, "isin", x1=x1, x2=operand_key(x2), invert=bool(invert)):
        if isinstance(x2, DistArray) and not x2.grid.compatible(x1.grid):
            raise ValueError("the two grids are over different communicators")
    vals = x2.to_numpy() if isinstance(x2, DistArray) else np.asarray(x2)
    xp = x1.xp
    loc = xp.isin(x1.local, xp.asarray(vals.reshape(-1)), invert=bool(invert))
    return DistArray(loc, x1.distribution, x1.grid)


# -- nan-reductions ------------------------------------------------------------------------------
def _nan_prep(call, x, axis, keepdims, **more):
    from .. import reductions
    _check(x)
    with agreed(x.grid.cart, call, x=x, axis=canon(axis), keepdims=bool(keepdims),
                **{k: canon(v) for k, v in more.items()}):
        axes = reductions._axes(x, axis)
    return axes


def _nancount(x, axes):
    from .. import reductions
    xp = x.xp
    part = (~xp.isnan(x.local)).sum(axis=axes, keepdims=True, dtype=np.int64)
    return reductions._reduce(x, axes, "sum", part, True)


def _finish_keep(x, r: DistArray, axes, keepdims):
    from .. import reductions
    return reductions._finish(x, r.local, axes, keepdims)


@collective_entry
def nansum(x: DistArray, axis=None, dtype=None, keepdims=False) -> DistArray:
    """Sum treating NaN as zero."""
    from .. import reductions
    axes = _nan_prep("nansum", x, axis, keepdims, dtype=dtype_key(dtype))
    if x.dtype.kind not in "fc":
        return reductions.sum(x, axes, dtype, keepdims)
    part = x.xp.nansum(x.local, axis=axes, dtype=dtype, keepdims=True)
    return reductions._reduce(x, axes, "sum", part, keepdims)


@collective_entry
def nanprod(x: DistArray, axis=None, dtype=None, keepdims=False) -> DistArray:
    """Product treating NaN as one."""
    from .. import reductions
    axes = _nan_prep("nanprod", x, axis, keepdims, dtype=dtype_key(dtype))
    if x.dtype.kind not in "fc":
        return reductions.prod(x, axes, dtype, keepdims)
    part = x.xp.nanprod(x.local, axis=axes, dtype=dtype, keepdims=True)
    return reductions._reduce(x, axes, "prod", part, keepdims)


@collective_entry
def nanmean(x: DistArray, axis=None, dtype=None, keepdims=False) -> DistArray:
    """Mean of the non-NaN elements (NaN where there are none)."""
    from .. import reductions
    axes = _nan_prep("nanmean", x, axis, keepdims, dtype=dtype_key(dtype))
    if x.dtype.kind not in "fc":
        return reductions.mean(x, axes, dtype, keepdims)
    s = nansum(x, axes, dtype, True)
    c = _nancount(x, axes)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = s.local / c.local
    return reductions._finish(x, m.astype(s.dtype, copy=False), axes, keepdims)


@collective_entry
def nanvar(x: DistArray, axis=None, dtype=None, ddof=0, keepdims=False) -> DistArray:
    """Variance of the non-NaN elements (two-pass), divided by ``count - ddof``."""
    from .. import reductions
    axes = _nan_prep("nanvar", x, axis, keepdims, dtype=dtype_key(dtype), ddof=ddof)
    if x.dtype.kind not in "fc":
        return reductions.var(x, axes, dtype, ddof, keepdims)
    m = nanmean(x, axes, dtype, True)
    xp = x.xp
    dev = x.local.astype(m.dtype, copy=False) - m.local
    sq = (dev * xp.conj(dev)).real if xp.iscomplexobj(dev) else dev * dev
    part = xp.nansum(sq, axis=axes, keepdims=True)
    s = reductions._reduce(x, axes, "sum", part, True)
    c = _nancount(x, axes)
    with np.errstate(invalid="ignore", divide="ignore"):
        v = s.local / xp.maximum(c.local - ddof, 0)
    return reductions._finish(x, v.astype(part.dtype, copy=False), axes, keepdims)


@collective_entry
def nanstd(x: DistArray, axis=None, dtype=None, ddof=0, keepdims=False) -> DistArray:
    """Square root of :func:`nanvar`."""
    _nan_prep("nanstd", x, axis, keepdims, dtype=dtype_key(dtype), ddof=ddof)
    v = nanvar(x, axis, dtype, ddof, keepdims)
    v.local[...] = v.xp.sqrt(v.local)
    return v


def _nanminmax(call, x, axis, keepdims, op):
    from .. import reductions
    axes = _nan_prep(call, x, axis, keepdims)
    if x.dtype.kind not in "fc":
        return getattr(reductions, op)(x, axes, keepdims)
    xp = x.xp
    fill = np.inf if op == "min" else -np.inf
    y = DistArray(xp.where(xp.isnan(x.local), fill, x.local).astype(x.dtype), x.distribution,
                  x.grid)
    r = getattr(reductions, op)(y, axes, True)
    c = _nancount(x, axes)
    loc = xp.where(c.local == 0, np.nan, r.local).astype(x.dtype)
    return reductions._finish(x, loc, axes, keepdims)


@collective_entry
def nanmin(x: DistArray, axis=None, keepdims=False) -> DistArray:
    """Minimum ignoring NaN (NaN for an all-NaN slice)."""
    return _nanminmax("nanmin", x, axis, keepdims, "min")


@collective_entry
def nanmax(x: DistArray, axis=None, keepdims=False) -> DistArray:
    """Maximum ignoring NaN (NaN for an all-NaN slice)."""
    return _nanminmax("nanmax", x, axis, keepdims, "max")


def _nanarg(call, x, axis, keepdims, op):
    from .. import reductions
    from ...core.comm import allreduce
    _nan_prep(call, x, None if axis is None else axis, keepdims)
    if x.dtype.kind not in "fc":
        return getattr(reductions, "arg" + op)(x, axis, keepdims)
    xp = x.xp
    axes = tuple(range(x.ndim)) if axis is None else (_axis(axis, x.ndim),)
    if x.size and all(x.shape[t] for t in axes):
        c = _nancount(x, axes)
        bad = np.asarray(bool((c.local == 0).any()))
        if x.grid.size > 1:
            bad = allreduce(x.grid.cart, bad, "lor")
        if bool(bad):
            raise ValueError("All-NaN slice encountered")
    fill = np.inf if op == "min" else -np.inf
    y = DistArray(xp.where(xp.isnan(x.local), fill, x.local).astype(x.dtype), x.distribution,
                  x.grid)
    return getattr(reductions, "arg" + op)(y, axis, keepdims)


@collective_entry
def nanargmin(x: DistArray, axis=None, keepdims=False) -> DistArray:
    """Index of the minimum ignoring NaN; ``ValueError`` on every rank for an all-NaN slice."""
    return _nanarg("nanargmin", x, axis, keepdims, "min")


@collective_entry
def nanargmax(x: DistArray, axis=None, keepdims=False) -> DistArray:
    """Index of the maximum ignoring NaN; ``ValueError`` on every rank for an all-NaN slice."""
    return _nanarg("nanargmax", x, axis, keepdims, "max")


# -- NumPy interop --------------------------------------------------------------------------------
def _np_red(fn, params):
    """``np.nan<reduction>`` for DistArrays: NumPy's positional ``params`` after ``a``;
    ``out=``, ``where=`` and ``initial=`` raise ``TypeError`` instead of being ignored."""
    def impl(a, *args, **kwargs):
        if len(args) > len(params):
            raise TypeError(f"{fn.__name__}() takes at most {len(params) + 1} positional "
                            "arguments")
        for name, v in zip(params, args):
            kwargs[name] = v
        novalue = getattr(np, "_NoValue", object())
        kwargs = {k: v for k, v in kwargs.items() if v is not novalue}
        if kwargs.pop("out", None) is not None:
            raise TypeError("out= is not supported for DistArray reductions")
        if kwargs.pop("where", True) is not True or "initial" in kwargs:
            raise TypeError("where= and initial= are not supported for DistArray reductions")
        unknown = set(kwargs) - {"axis", "keepdims", "dtype", "ddof"}
        if unknown:
            raise TypeError(f"{fn.__name__}() got unexpected keyword argument(s) "
                            f"{sorted(unknown)}")
        return fn(a, **kwargs)
    return impl


def _np_clip(a, a_min=None, a_max=None, out=None, *, min=None, max=None, **kw):
    if out is not None or kw:
        raise TypeError("out= and ufunc keywords are not supported by clip of DistArrays")
    lo = a_min if a_min is not None else min
    hi = a_max if a_max is not None else max
    return clip(a, lo, hi)


def _np_round(a, decimals=0, out=None):
    if out is not None:
        raise TypeError("out= is not supported for DistArray")
    return round(a, decimals)


def _handled():
    s, v, m, ar = (("axis", "dtype", "out", "keepdims"),
                   ("axis", "dtype", "out", "ddof", "keepdims"),
                   ("axis", "out", "keepdims"), ("axis", "out"))
    return {
        np.expand_dims: expand_dims,
        np.squeeze: squeeze,
        np.stack: lambda arrays, axis=0, out=None, **kw: stack(arrays, axis),
        np.broadcast_to: lambda array, shape, subok=False: broadcast_to(array, shape),
        np.broadcast_arrays: lambda *args, subok=False: list(broadcast_arrays(*args)),
        np.tile: tile,
        np.repeat: repeat,
        np.roll: roll,
        np.pad: lambda array, pad_width, mode="constant", **kw: pad(array, pad_width, mode, **kw),
        np.meshgrid: lambda *xi, copy=True, sparse=False, indexing="xy": list(
            meshgrid(*xi, indexing=indexing)),
        np.tril: tril,
        np.triu: triu,
        np.isclose: isclose,
        np.allclose: allclose,
        np.array_equal: array_equal,
        np.clip: _np_clip,
        np.round: _np_round,
        np.around: _np_round,
        np.diff: lambda a, n=1, axis=-1, prepend=None, append=None: diff(a, n, axis, prepend,
                                                                         append),
        np.take: lambda a, indices, axis=None, out=None, mode="raise": take(a, indices, axis),
        np.take_along_axis: lambda arr, indices, axis=-1: take_along_axis(arr, indices, axis),
        np.unstack: lambda x, *, axis=0: unstack(x, axis),
        np.astype: lambda x, dtype, *, copy=True, device=None: x.astype(dtype, copy=copy),
        np.real: lambda val: elementwise(lambda u: u.real.copy(), "real", (val,)),
        np.imag: lambda val: elementwise(lambda u: u.imag.copy() if u.dtype.kind == "c"
                                         else array_module(u).zeros_like(u), "imag", (val,)),
        np.isin: lambda element, test_elements, assume_unique=False, invert=False, **kw:
            isin(element, test_elements, invert),
        np.nansum: _np_red(nansum, s + ("initial", "where")),
        np.nanprod: _np_red(nanprod, s + ("initial", "where")),
        np.nanmean: _np_red(nanmean, s + ("where",)),
        np.nanvar: _np_red(nanvar, v + ("where",)),
        np.nanstd: _np_red(nanstd, v + ("where",)),
        np.nanmin: _np_red(nanmin, m + ("initial", "where")),
        np.nanmax: _np_red(nanmax, m + ("initial", "where")),
        np.nanargmin: _np_red(nanargmin, ar + ("keepdims",)),
        np.nanargmax: _np_red(nanargmax, ar + ("keepdims",)),
    }


HANDLED_FUNCTIONS = _handled()
