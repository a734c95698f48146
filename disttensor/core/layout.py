"""Layout arguments of a DistArray: the default split, halo widths, and the
:class:`~disttensor.core.distribution.Distribution` a ``(shape, grid, split, sizes)`` call
describes.  Pure functions of replicated metadata (no communication)."""
from __future__ import annotations

import numbers

from .distribution import Distribution
from .grid import ProcessGrid, get_default_grid

__all__ = ["default_split", "normalize_halo", "make_distribution"]


def default_split(ndim: int, grid: ProcessGrid) -> tuple[int | None, ...]:
    """Split used when none is given: tensor axis ``i`` over grid axis ``i`` for the first
    ``min(ndim, grid.ndim)`` axes (on the default 1-D grid: axis 0 over all ranks)."""
    k = min(ndim, grid.ndim)
    return tuple(range(k)) + (None,) * (ndim - k)


def normalize_halo(halo, ndim: int) -> tuple[tuple[int, int], ...]:
    """``int`` (all axes, both sides), per-axis ints, or per-axis ``(lo, hi)`` pairs."""
    if halo is None:
        return ((0, 0),) * ndim
    if isinstance(halo, numbers.Integral):
        h = ((int(halo), int(halo)),) * ndim
    else:
        halo = tuple(halo)
        if len(halo) != ndim:
            raise ValueError(f"halo {halo} needs one entry per axis ({ndim})")
        h = []
        for e in halo:
            if isinstance(e, numbers.Integral):
                h.append((int(e), int(e)))
            else:
                lo, hi = e
                h.append((int(lo), int(hi)))
        h = tuple(h)
    if any(a < 0 or b < 0 for a, b in h):
        raise ValueError(f"halo widths must be >= 0, got {h}")
    return h


def make_distribution(shape, grid: ProcessGrid | None, split, sizes=None):
    """Resolve ``grid``/``split`` defaults and build a :class:`Distribution`."""
    grid = get_default_grid() if grid is None else grid
    if not isinstance(grid, ProcessGrid):
        raise TypeError(f"grid must be a ProcessGrid, got {type(grid).__name__}")
    if isinstance(shape, numbers.Integral):
        shape = (int(shape),)
    shape = tuple(shape)
    if split is None:
        split = default_split(len(shape), grid)
    elif isinstance(split, numbers.Integral):
        # a single int: tensor axis `split` over grid axis 0
        s = [None] * len(shape)
        if not -len(shape) <= split < len(shape):
            raise ValueError(f"split axis {split} is out of range for a {len(shape)}-d array")
        s[split] = 0
        split = tuple(s)
    return grid, Distribution(shape, grid.dims, split, sizes)
