"""Splitting arrays (NumPy's "Splitting arrays"): ``split``, ``array_split``, ``hsplit``,
``vsplit``, ``dsplit``.

Each piece is the slice ``x[..., start:stop, ...]`` along ``axis``
(:func:`disttensor.routines.indexing.getitem`): it keeps ``x``'s grid and split, and every
rank owns the part of its own block that falls inside the piece, so no data moves; a piece's
blocks are uneven or empty where the cut falls inside or outside a rank's block (a piece
that lies within one rank's rows is owned by that rank alone along the split grid axis).
Pieces are copies (NumPy returns views).  The result is a Python list of DistArrays, as
NumPy's.  Collective over the grid of ``x``; the ranks agree on the sections and the axis.
"""
from __future__ import annotations

import numbers
import operator

import numpy as np

from ...core.array import DistArray
from ...core.entry import agreed, canon, collective_entry
from .._operands import axis_index, check_array

__all__ = ["split", "array_split", "hsplit", "vsplit", "dsplit"]


def section_bounds(n: int, indices_or_sections) -> list[tuple[int, int]]:
    """NumPy's ``(start, stop)`` of each piece of an axis of length ``n`` (pure): ``k``
    sections of sizes ``n // k + 1`` (the first ``n % k``) and ``n // k``, or the pieces
    between sorted-or-not split ``indices`` (Python slice semantics, as NumPy)."""
    if isinstance(indices_or_sections, numbers.Integral) or np.ndim(indices_or_sections) == 0:
        k = operator.index(indices_or_sections)
        if k <= 0:
            raise ValueError("number sections must be larger than 0.")
        each, extra = divmod(n, k)
        sizes = [each + 1] * extra + [each] * (k - extra)
        starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        return list(zip(starts[:-1], starts[1:]))
    cuts = [operator.index(i) for i in indices_or_sections]
    points = [0] + cuts + [n]
    return [slice(a, b).indices(n)[:2] for a, b in zip(points[:-1], points[1:])]


def _pieces(x: DistArray, bounds, axis: int) -> list[DistArray]:
    pre = (slice(None),) * axis
    return [x[pre + (slice(a, max(a, b)),)] for a, b in bounds]


def _sections_key(s):
    return canon(np.asarray(s)) if not isinstance(s, numbers.Integral) else int(s)


@collective_entry
def array_split(ary: DistArray, indices_or_sections, axis=0) -> list[DistArray]:
    """``numpy.array_split``: ``indices_or_sections`` an int ``k`` (``k`` pieces, the first
    ``n % k`` one longer) or a sequence of split indices; pieces laid out as the module
    docstring says."""
    check_array(ary, None)
    with agreed(ary.grid.cart, "array_split", x=ary, sections=_sections_key(indices_or_sections),
                axis=canon(axis)):
        ax = axis_index(axis, ary.ndim)
        bounds = section_bounds(ary.shape[ax], indices_or_sections)
    return _pieces(ary, bounds, ax)


@collective_entry
def split(ary: DistArray, indices_or_sections, axis=0) -> list[DistArray]:
    """``numpy.split``: as :func:`array_split`, but an int ``k`` must divide the axis
    (``ValueError: array split does not result in an equal division`` otherwise)."""
    check_array(ary, None)
    with agreed(ary.grid.cart, "split", x=ary, sections=_sections_key(indices_or_sections),
                axis=canon(axis)):
        ax = axis_index(axis, ary.ndim)
        n = ary.shape[ax]
        if isinstance(indices_or_sections, numbers.Integral) and indices_or_sections > 0 \
                and n % indices_or_sections:
            raise ValueError("array split does not result in an equal division")
        bounds = section_bounds(n, indices_or_sections)
    return _pieces(ary, bounds, ax)


def _split_along(ary, indices_or_sections, call: str, min_ndim: int, axis_of) -> list:
    check_array(ary, None)
    with agreed(ary.grid.cart, call, x=ary, sections=_sections_key(indices_or_sections)):
        if ary.ndim < min_ndim:
            raise ValueError(f"{call} only works on arrays of {min_ndim} or more dimensions")
    return split(ary, indices_or_sections, axis_of(ary.ndim))


@collective_entry
def hsplit(ary: DistArray, indices_or_sections) -> list[DistArray]:
    """``numpy.hsplit``: :func:`split` along axis 1 (axis 0 of a 1-D array)."""
    return _split_along(ary, indices_or_sections, "hsplit", 1, lambda nd: 1 if nd > 1 else 0)


@collective_entry
def vsplit(ary: DistArray, indices_or_sections) -> list[DistArray]:
    """``numpy.vsplit``: :func:`split` along axis 0 (at least 2-D)."""
    return _split_along(ary, indices_or_sections, "vsplit", 2, lambda nd: 0)


@collective_entry
def dsplit(ary: DistArray, indices_or_sections) -> list[DistArray]:
    """``numpy.dsplit``: :func:`split` along axis 2 (at least 3-D)."""
    return _split_along(ary, indices_or_sections, "dsplit", 3, lambda nd: 2)
