"""A user's distributed stencil, written on disttensor's halo exchange: forward differences
along one axis and their adjoint.  ``test_stencil.py`` next to it tests both with
``disttensor.testing`` on every layout of 1-4 ranks.

``forward_difference(x, axis)[i] = x[i + 1] - x[i]`` along ``axis``, with ``x[n] = 0`` past
the end (a zero boundary).  Each rank needs one cell past the high end of its block: a halo of
width ``(0, 1)`` along ``axis``, filled from the next non-empty block (the halo exchange skips
empty blocks).  Its adjoint, ``y[i - 1] - y[i]`` with ``y[-1] = 0``, needs one cell below the
block instead.  Both are collective over ``x``'s grid and return an array laid out like ``x``.
"""
from __future__ import annotations

import disttensor as dt


def _shifted(x: dt.DistArray, axis: int, halo: tuple[int, int]):
    """``x``'s block with ``halo`` cells along ``axis`` filled by the neighbours (collective),
    and the two views of it that a one-cell difference subtracts.  An axis of extent 0 has no
    neighbour to ask (a halo may not be wider than the axis): nothing to exchange."""
    if x.shape[axis] == 0:
        return x.local, x.local
    widths = [(0, 0)] * x.ndim
    widths[axis] = halo
    buf = x.with_halo(widths).exchange_halo("zero").buffer
    lower = [slice(None)] * x.ndim
    upper = [slice(None)] * x.ndim
    lower[axis] = slice(0, -1)
    upper[axis] = slice(1, None)
    return buf[tuple(lower)], buf[tuple(upper)]


def forward_difference(x: dt.DistArray, axis: int = 0) -> dt.DistArray:
    """``x[i + 1] - x[i]`` along ``axis`` (zero past the end); collective."""
    this, following = _shifted(x, axis, (0, 1))
    return dt.from_local(following - this, grid=x.grid, distribution=x.distribution)


def forward_difference_adjoint(y: dt.DistArray, axis: int = 0) -> dt.DistArray:
    """The adjoint of :func:`forward_difference`: ``y[i - 1] - y[i]`` (zero before the start);
    collective."""
    previous, this = _shifted(y, axis, (1, 0))
    return dt.from_local(previous - this, grid=y.grid, distribution=y.distribution)
