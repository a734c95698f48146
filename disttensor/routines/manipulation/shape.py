"""Changing array shape (NumPy's "Changing array shape"): ``reshape``, ``ravel``.

``reshape`` works locally whenever every group of merged/split axes holds at most one split
axis, which is the group's leading axis, and the block boundaries fall on whole rows of the
new leading axis; otherwise the offending groups are first made whole on every rank along
their grid axes (a redistribution that gathers those axes), reshaped, and split again
(balanced) on the group's new leading axis.  The result never aliases the input.  Collective
over the grid of ``x``; the ranks agree on the shape.  :func:`reshape_groups` (pure) pairs
the runs of old and new axes.  ``ravel`` is ``reshape(x, -1)`` (``order='F'``: of the
transpose, which moves no data); the 1-D result is split over the grid axis of ``x``'s leading
split axis when the blocks allow it (see above), else balanced over it.
"""
from __future__ import annotations

import math
import numbers

from ...core.array import DistArray
from ...core.entry import agreed, canon, collective_entry
from ...core.distribution import Distribution, balanced_sizes, offsets_from_sizes
from .._operands import check_array, unsplit
from ..creation import empty

__all__ = ["reshape", "reshape_groups", "ravel"]


def reshape_groups(old, new) -> list[tuple[list[int], list[int]]]:
    """Pair runs of old and new axes with equal products (pure; both sizes non-zero)."""
    i = j = 0
    groups = []
    while i < len(old) or j < len(new):
        oa, na, po, pn = [], [], 1, 1
        if i < len(old):
            oa.append(i); po *= old[i]; i += 1
        if j < len(new):
            na.append(j); pn *= new[j]; j += 1
        while po != pn:
            if po < pn and i < len(old):
                oa.append(i); po *= old[i]; i += 1
            elif pn < po and j < len(new):
                na.append(j); pn *= new[j]; j += 1
            else:
                raise ValueError(f"cannot reshape array of shape {tuple(old)} into shape "
                                 f"{tuple(new)}")
        # absorb trailing length-1 axes into this group
        groups.append((oa, na))
    return groups


def _normalize_shape(shape, size) -> tuple[int, ...]:
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    shape = [int(s) for s in shape]
    if shape.count(-1) > 1:
        raise ValueError("can only specify one unknown dimension")
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        if rest == 0 or size % rest:
            raise ValueError(f"cannot reshape array of size {size} into shape {tuple(shape)}")
        shape[shape.index(-1)] = size // rest
    if any(s < 0 for s in shape) or math.prod(shape) != size:
        raise ValueError(f"cannot reshape array of size {size} into shape {tuple(shape)}")
    return tuple(shape)


def _shape_key(shape):
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        return (int(shape),)
    return canon(shape)


@collective_entry
def reshape(x: DistArray, shape) -> DistArray:
    """``x`` in a new ``shape`` (an int or a sequence, one ``-1`` inferred; row-major order
    as NumPy), laid out as the module docstring says."""
    check_array(x, None)
    with agreed(x.grid.cart, "reshape", x=x, shape=_shape_key(shape)):
        new = _normalize_shape(shape, x.size)
        if x.size:
            reshape_groups(x.shape, new)  # ValueError for shapes that do not pair up
    old = x.shape
    if new == old:
        return x.copy()
    d = x.distribution
    if x.size == 0:
        split = [None] * len(new)
        return empty(new, dtype=x.dtype, grid=x.grid, split=split, device=x.device)
    groups = reshape_groups(old, new)
    new_split: list = [None] * len(new)
    new_sizes: list = [None] * len(new)
    gather_axes: list[int] = []   # tensor axes to make whole first
    resplit: list[tuple[int, int]] = []  # (new axis, grid axis) to split again after
    for oa, na in groups:
        split_axes = [t for t in oa if d.split[t] is not None]
        if not split_axes:
            continue
        lead_new = next((u for u in na if new[u] > 1), None)
        ok = False
        if len(split_axes) == 1 and lead_new is not None:
            t = split_axes[0]
            if all(old[s] == 1 for s in oa if s < t):
                r_old = math.prod(old[s] for s in oa if s > t)
                r_new = math.prod(new[u] for u in na if u > lead_new)
                offs = d.offsets[t]
                if all((o * r_old) % r_new == 0 for o in offs):
                    ok = True
                    new_split[lead_new] = d.split[t]
                    new_sizes[lead_new] = [(b - a) * r_old // r_new
                                           for a, b in zip(offs[:-1], offs[1:])]
        if not ok:
            gather_axes += split_axes
            if lead_new is not None:
                resplit.append((lead_new, d.split[split_axes[0]]))
    y = unsplit(x, gather_axes)
    for u, g in resplit:
        new_split[u] = g
    nd = Distribution(new, d.grid_dims, new_split, new_sizes)
    # local shape with re-split axes still whole, then cut them
    whole = list(nd.block_shape(x.grid.coords))
    for u, _ in resplit:
        whole[u] = new[u]
    loc = y.local.reshape(tuple(whole))
    if resplit:
        idx = [slice(None)] * len(new)
        for u, g in resplit:
            offs = offsets_from_sizes(balanced_sizes(new[u], x.grid.dims[g]))
            c = x.grid.coords[g]
            idx[u] = slice(offs[c], offs[c + 1])
        loc = loc[tuple(idx)]
    if y is x:  # never alias the input's memory
        loc = loc.copy()
    return DistArray(loc, nd, x.grid)



@collective_entry
def ravel(a: DistArray, order="C") -> DistArray:
    """``numpy.ravel``: the elements as a 1-D DistArray in row-major order (``'C'``, and
    ``'A'``/``'K'``, which read a DistArray as C-ordered) or column-major (``'F'``); always a
    copy (NumPy returns a view where it can)."""
    from .transpose import transpose
    check_array(a, None)
    with agreed(a.grid.cart, "ravel", x=a, order=order):
        if order not in ("C", "F", "A", "K"):
            raise ValueError("order must be one of 'C', 'F', 'A', or 'K' "
                             f"(got {order!r})")
    return reshape(transpose(a) if order == "F" else a, -1)
