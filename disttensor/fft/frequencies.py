"""Frequencies and their ordering: ``fftfreq``/``rfftfreq`` (the sample frequencies as
distributed 1-D arrays) and ``fftshift``/``ifftshift`` (zero frequency to the centre and back).

All are collective: ``fftfreq``/``rfftfreq`` over the given grid (the ranks agree ``n``, ``d``,
``dtype`` and the layout; each rank then computes its own block, no messages), the shifts over
``x``'s grid (the ranks agree ``axes``).  A shift keeps ``x``'s distribution: along a split axis
it is a roll done by two redistributions of the parts that change owner, along a whole axis a
local ``roll``.
"""
from __future__ import annotations

import numbers

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry
from ..core.redistribute import redistribute_blocks
from ..routines.creation import _grid, layout_args
from .transforms import check_distarray

__all__ = ["fftfreq", "rfftfreq", "fftshift", "ifftshift"]


# -- frequencies -------------------------------------------------------------------------------
def _freq(call, n, d, real, dtype, grid, split, sizes, device):
    from ..routines.creation import empty
    g = _grid(grid)
    with agreed(g.cart, call, n=canon(n), d=d, dtype=dtype,
                **layout_args(None, g, split, sizes, device, ndim=1)):
        if not isinstance(n, numbers.Integral) or isinstance(n, bool):
            raise ValueError(f"n should be an integer, got {n!r}")
        if n < 1:
            raise ValueError(f"n must be positive, got {n}")
    m = n // 2 + 1 if real else n
    x = empty((m,), dtype=np.float64, grid=g, split=split, sizes=sizes)
    sl = x.local_slices[0]
    k = np.arange(sl.start, sl.stop)
    if not real:
        k = np.where(k < (n + 1) // 2, k, k - n)
    val = 1.0 / (n * d)
    x.local[...] = k * val
    if dtype is not None:
        x = x.astype(dtype)
    return x.to_device(device) if device != "cpu" else x


@collective_entry
def fftfreq(n, d=1.0, *, dtype=None, grid=None, split=None, sizes=None, device="cpu"):
    """Sample frequencies of an ``n``-point FFT (``numpy.fft.fftfreq``) as a distributed
    1-D array of length ``n`` laid out by ``grid``/``split``/``sizes`` (each rank computes its
    block; no messages)."""
    return _freq("fftfreq", n, d, False, dtype, grid, split, sizes, device)


@collective_entry
def rfftfreq(n, d=1.0, *, dtype=None, grid=None, split=None, sizes=None, device="cpu"):
    """Sample frequencies of an ``n``-point :func:`rfft` (``numpy.fft.rfftfreq``), length
    ``n // 2 + 1``."""
    return _freq("rfftfreq", n, d, True, dtype, grid, split, sizes, device)


# -- shifts (a roll: one or two redistributions per split axis) --------------------------------
def _roll_axis(x: DistArray, axis: int, k: int) -> DistArray:
    """``np.roll(x, k, axis)`` with ``x``'s distribution: the block ``x[:n-k]`` moves to
    ``[k, n)`` and ``x[n-k:]`` to ``[0, k)``, each by one redistribution of the part each rank
    owns (only the pieces that change owner travel)."""
    n = x.shape[axis]
    k %= max(n, 1)
    xp = x.xp
    if k == 0:
        return x.copy()
    D = x.distribution
    if x.split[axis] is None or D.grid_dims[x.split[axis]] == 1:
        return DistArray(xp.roll(x.local, k, axis=axis), D, x.grid)
    comm = x.grid.cart
    lo, hi = D.block_range(axis, D.axis_coord(axis, x.grid.coords))
    out = xp.empty_like(x.local)

    def part(a, start, stop):
        idx = [slice(None)] * a.ndim
        idx[axis] = slice(max(0, min(hi, start) - lo), max(0, min(hi, stop) - lo))
        return a[tuple(idx)]

    # x[:n-k] -> out[k:], x[n-k:] -> out[:k]
    redistribute_blocks(comm, part(x.local, 0, n - k), D.restrict(axis, 0, n - k),
                        D.restrict(axis, k, n), out=part(out, k, n))
    redistribute_blocks(comm, part(x.local, n - k, n), D.restrict(axis, n - k, n),
                        D.restrict(axis, 0, k), out=part(out, 0, k))
    return DistArray(out, D, x.grid)


@collective_entry
def _shift(call, x, axes, inverse):
    from numpy.lib.array_utils import normalize_axis_tuple
    check_distarray(x)
    with agreed(x.grid.cart, call, x=x, axes=canon(axes)):
        ax = tuple(range(x.ndim)) if axes is None else \
            normalize_axis_tuple(axes, x.ndim, allow_duplicate=True)
    out = x
    for a in ax:
        n = x.shape[a]
        out = _roll_axis(out, a, -(n // 2) if inverse else n // 2)
    return out.copy() if out is x else out


def fftshift(x: DistArray, axes=None) -> DistArray:
    """Zero frequency to the centre (``numpy.fft.fftshift``); output has ``x``'s
    distribution."""
    return _shift("fftshift", x, axes, False)


def ifftshift(x: DistArray, axes=None) -> DistArray:
    """Inverse of :func:`fftshift` (``numpy.fft.ifftshift``)."""
    return _shift("ifftshift", x, axes, True)
