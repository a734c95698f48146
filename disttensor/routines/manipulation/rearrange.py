"""Rearranging elements (NumPy's "Rearranging elements"): ``flip``, ``roll``, ``rot90``.

* ``flip``: along a split axis the block of grid coordinate ``c`` goes to ``p-1-c`` (one
  ``Sendrecv`` with the mirrored rank) and the ownership sizes are reversed; along an unsplit
  axis the block is reversed locally.
* ``roll``: along an axis every rank holds whole (unsplit, or split over one rank), NumPy's
  ``roll`` of the local block (no messages).  Along each rolled split axis, one point-to-point
  exchange on that grid axis's sub-communicator: output position ``i`` takes source position
  ``(i - s) mod n``, so each output block is at most a few contiguous runs of source blocks
  (:func:`roll_pieces`, pure), each run a message from its owner (or a local copy).  Only what
  crosses a block boundary moves: a roll by one row sends one row per rank.  The result has
  the input's distribution.  ``axis=None`` rolls the flattened array.
* ``rot90``: NumPy's composition of ``flip`` and ``transpose``: the two axes swap places
  with their splits (no messages) and one of them is flipped (``k=2``: both), so the block
  at grid coordinate ``c`` of a flipped split axis goes to ``p-1-c``.

All collective over the grid of ``x``; the ranks agree on the axes and shifts.
"""
from __future__ import annotations

import numbers
import operator

import numpy as np

from ...core.array import DistArray
from ...core.entry import agreed, canon, collective_entry
from ...core.backend import array_module, to_host
from .._operands import axis_index, axis_tuple, check_array, held_whole

__all__ = ["flip", "roll", "rot90", "roll_pieces"]


@collective_entry
def flip(x: DistArray, axis) -> DistArray:
    """Reverse ``x`` along ``axis`` (int or tuple).  Along a split axis the block of grid
    coordinate ``c`` goes to ``p-1-c`` and the ownership sizes are reversed."""
    check_array(x, None)
    if isinstance(axis, range):
        axis = tuple(axis)
    with agreed(x.grid.cart, "flip", x=x, axis=canon(axis)):
        axes = axis_tuple(axis, x.ndim)  # AxisError / repeated-axis ValueError as NumPy
    y = x
    for t in axes:
        idx = [slice(None)] * y.ndim
        idx[t] = slice(None, None, -1)
        loc = y.local[tuple(idx)]
        dist = y.distribution
        g = dist.split[t]
        if g is None:
            y = DistArray(loc.copy(), dist, y.grid)
            continue
        sizes = dist.sizes(t)[::-1]
        new = dist.with_sizes(t, sizes)
        p = y.grid.dims[g]
        c = y.grid.coords[g]
        partner = p - 1 - c
        xp = array_module(loc)
        sub = y.grid.sub_comm([g])  # collective on first use: every rank, the middle one too
        if partner == c:
            out = loc.copy()
        else:
            shape = new.block_shape(y.grid.coords)
            send = np.ascontiguousarray(to_host(loc))
            recv = np.empty(shape, dtype=y.dtype)
            sub.Sendrecv(send, dest=partner, sendtag=17, recvbuf=recv, source=partner, recvtag=17)
            out = recv if xp is np else xp.asarray(recv)
        y = DistArray(out, new, y.grid)
    return y


def roll_pieces(sizes, shift) -> list[tuple[int, int, int, int, int]]:
    """The runs that make up a roll by ``shift`` of an axis cut into blocks of ``sizes``
    (empty blocks allowed): ``(src_block, src_start, dst_block, dst_start, length)`` with
    block-local starts, such that ``out[dst_block][dst_start:dst_start+length] =
    in[src_block][src_start:src_start+length]`` for every run gives ``np.roll`` of the whole
    axis.  Pure.  With two or more non-empty blocks no (source, destination) pair repeats."""
    sizes = [int(v) for v in sizes]
    n = sum(sizes)
    if n == 0:
        return []
    s = int(shift) % n
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int).tolist()
    pieces = []
    for d, (d0, dn) in enumerate(zip(starts, sizes)):
        i = d0
        while i < d0 + dn:
            src = (i - s) % n
            sb = int(np.searchsorted(starts, src, side="right")) - 1  # the non-empty owner
            length = min(d0 + dn - i, starts[sb] + sizes[sb] - src)
            pieces.append((sb, src - starts[sb], d, i - d0, length))
            i += length
    return pieces


def _roll_split_axis(y: DistArray, a: int, s: int) -> DistArray:
    """``y`` rolled by ``s`` along its split axis ``a``: one exchange on the grid axis's
    sub-communicator (ranks there are ordered by their coordinate along it)."""
    from ...core.comm import PieceExchange, private_comm
    g = y.split[a]
    me = y.grid.coords[g]
    comm = private_comm(y.grid.sub_comm([g]), "roll")
    src_local = y.local
    out = y.xp.empty_like(src_local)
    pre = (slice(None),) * a
    sends, recvs = [], []
    for sb, s0, db, d0, ln in roll_pieces(y.distribution.sizes(a), s):
        if sb == me and db == me:
            out[pre + (slice(d0, d0 + ln),)] = src_local[pre + (slice(s0, s0 + ln),)]
        elif sb == me:
            sends.append((db, 0, src_local[pre + (slice(s0, s0 + ln),)]))
        elif db == me:
            recvs.append((sb, 0, out[pre + (slice(d0, d0 + ln),)]))
    ex = PieceExchange(comm, sends, recvs, persistent=False)
    ex.start()
    ex.finish()
    return DistArray(out, y.distribution, y.grid)


@collective_entry
def roll(x: DistArray, shift, axis=None) -> DistArray:
    """Elements shifted by ``shift`` along ``axis`` (ints or tuples, wrapping around); the
    result has ``x``'s distribution.  ``axis=None`` rolls the flattened array."""
    check_array(x)
    with agreed(x.grid.cart, "roll", x=x, shift=canon(shift), axis=canon(axis)):
        if axis is None:
            if not isinstance(shift, numbers.Integral):
                raise TypeError("roll with axis=None needs an integer shift")
            axes = shifts = None
        else:
            axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
            axes = tuple(axis_index(a, x.ndim) for a in axes)
            shifts = (shift,) if isinstance(shift, numbers.Integral) else tuple(shift)
            shifts = tuple(operator.index(s) for s in shifts)
            if len(shifts) == 1:
                shifts = shifts * len(axes)
            elif len(axes) == 1:
                axes = axes * len(shifts)
            if len(shifts) != len(axes):
                raise ValueError("'shift' and 'axis' should be scalars or 1D sequences")
    if axes is None:
        if held_whole(x, range(x.ndim)):
            return DistArray(x.xp.roll(x.local, shift), x.distribution, x.grid)
        r = roll(x.reshape(-1), shift, 0).reshape(x.shape)
        return r if r.distribution == x.distribution else \
            r.redistribute(distribution=x.distribution)
    total: dict[int, int] = {}
    for a, s in zip(axes, shifts):
        total[a] = total.get(a, 0) + s
    local = {a: s for a, s in total.items() if held_whole(x, (a,))}
    y = x
    if local:  # axes every rank holds whole: NumPy's roll of the block, no messages
        y = DistArray(x.xp.roll(x.local, tuple(local.values()), axis=tuple(local)),
                      x.distribution, x.grid)
    for a, s in total.items():
        n = x.shape[a]
        s = s % n if n else 0
        if s == 0 or a in local:
            continue
        y = _roll_split_axis(y, a, s)
    return y.copy() if y is x else y



@collective_entry
def rot90(m: DistArray, k=1, axes=(0, 1)) -> DistArray:
    """``numpy.rot90``: rotate by 90 degrees ``k`` times in the plane of ``axes`` (from the
    first towards the second); ``k % 4 == 0`` gives a copy.  Layout: module docstring."""
    from .transpose import transpose
    check_array(m, None)
    with agreed(m.grid.cart, "rot90", x=m, k=canon(k), axes=canon(axes)):
        axes = tuple(axes)
        if len(axes) != 2:
            raise ValueError("len(axes) must be 2.")
        if axes[0] == axes[1] or abs(axes[0] - axes[1]) == m.ndim:
            raise ValueError("Axes must be different.")
        if not all(-m.ndim <= a < m.ndim for a in axes):
            raise ValueError(f"Axes={axes} out of range for array of ndim={m.ndim}.")
        k = operator.index(k) % 4
    if k == 0:
        return m.copy()
    if k == 2:
        return flip(m, (axes[0] % m.ndim, axes[1] % m.ndim))
    order = list(range(m.ndim))
    order[axes[0]], order[axes[1]] = order[axes[1]], order[axes[0]]
    if k == 1:
        return transpose(flip(m, axes[1]), order)
    return flip(transpose(m, order), axes[1])
