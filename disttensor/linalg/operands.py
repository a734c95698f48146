"""Operand checks and layout helpers shared by the :mod:`disttensor.linalg` modules.

Operands: every linalg entry point takes its grid from its first DistArray operand
(:func:`first_grid`, :func:`comm_of`); other operands on a grid over the same ranks are used
as they are, NumPy arrays, scalars and lists become replicated DistArrays on that grid
(:func:`as_operand`, :func:`operand_pair`; every rank must pass the same value).  The
``check_*`` functions raise NumPy's exception types and messages; they read only agreed
metadata, so they raise on every rank alike when called inside ``agreed(...)``.

Layouts: :func:`distribution_on` builds a :class:`Distribution` from a partial split,
:func:`laid_out` redistributes an array to a layout (collective unless it is already there),
:func:`insert_axis`/:func:`remove_axis` add or drop a whole length-1 axis without moving data,
:func:`replicated`/:func:`block_of` turn a replicated NumPy result into a DistArray (each rank
keeps its block, no messages) and :func:`batch_layout` is the layout of a result that keeps an
operand's batch axes.  Only :func:`flat_grid` (on first use of a grid) and :func:`laid_out`
communicate.
"""
from __future__ import annotations

import numbers
import weakref

import numpy as np

from ..core.array import DistArray
from ..core.distribution import Distribution
from ..core.grid import ProcessGrid

__all__ = ["first_grid", "comm_of", "as_operand", "operand_pair", "check_distarray",
           "check_matrix", "check_square", "as_float", "flat_grid", "distribution_on",
           "split_sizes_of", "laid_out", "insert_axis", "remove_axis", "replicated", "block_of",
           "batch_layout"]


# -- operands ----------------------------------------------------------------------------------
def first_grid(*xs) -> ProcessGrid | None:
    """The grid of the first DistArray among ``xs`` (``None`` when there is none)."""
    for x in xs:
        if isinstance(x, DistArray):
            return x.grid
    return None


def comm_of(*xs):
    """The Cartesian communicator of the first DistArray among ``xs`` (``TypeError`` if none)."""
    g = first_grid(*xs)
    if g is None:
        raise TypeError("expected at least one DistArray operand")
    return g.cart


def as_operand(x, grid: ProcessGrid, what: str) -> DistArray:
    """``x`` as a DistArray next to operands on ``grid``: a DistArray on a grid over the same
    ranks as it is, a NumPy value replicated on ``grid``."""
    if isinstance(x, DistArray):
        if not x.grid.compatible(grid):
            raise ValueError(f"{what}: the operands live on grids over different communicators")
        return x
    if isinstance(x, (numbers.Number, np.ndarray, np.generic, list, tuple)):
        return replicated(x, grid)
    raise TypeError(f"{what}: unsupported operand type {type(x).__name__}")


def operand_pair(x1, x2, what: str):
    """``(grid, a, b)``: the grid of the first DistArray of ``x1, x2`` and both as operands
    on it (:func:`as_operand`)."""
    grid = first_grid(x1, x2)
    return grid, as_operand(x1, grid, what), as_operand(x2, grid, what)


def check_distarray(x, what: str) -> None:
    if not isinstance(x, DistArray):
        raise TypeError(f"{what}: expected a DistArray, got {type(x).__name__}")


def check_matrix(x, what: str) -> None:
    """``x`` is a DistArray of at least two dimensions (``LinAlgError`` otherwise)."""
    check_distarray(x, what)
    if x.ndim < 2:
        raise np.linalg.LinAlgError(f"{x.ndim}-dimensional array given. Array must be at "
                                    "least two-dimensional")


def check_square(a: DistArray) -> None:
    """The last two axes of ``a`` have the same length (``LinAlgError`` otherwise)."""
    if a.shape[-1] != a.shape[-2]:
        raise np.linalg.LinAlgError("Last 2 dimensions of the array must be square")


def as_float(x: DistArray) -> DistArray:
    """``x`` as float64 when it is boolean or integer (no data moves), else ``x``."""
    return x.astype(np.float64) if x.dtype.kind in "biu" else x


# -- layouts -----------------------------------------------------------------------------------
_FLAT_GRIDS: "weakref.WeakKeyDictionary[ProcessGrid, ProcessGrid]" = weakref.WeakKeyDictionary()


def flat_grid(grid: ProcessGrid) -> ProcessGrid:
    """A 1-D grid over the same ranks (collective on first use for ``grid``; cached)."""
    if grid.ndim == 1:
        return grid
    g = _FLAT_GRIDS.get(grid)
    if g is None:
        g = ProcessGrid((grid.size,), comm=grid.comm)
        _FLAT_GRIDS[grid] = g
    return g


def distribution_on(shape, grid: ProcessGrid, split, sizes=None) -> Distribution:
    """The distribution of ``shape`` on ``grid`` with ``split`` (missing trailing entries:
    whole axes) and block ``sizes`` (ignored on whole axes; ``None``: balanced)."""
    split = list(split) + [None] * (len(shape) - len(split))
    if sizes is None:
        sizes = [None] * len(shape)
    sizes = [s if g is not None else None for s, g in zip(sizes, split)]
    return Distribution(shape, grid.dims, split, sizes)


def split_sizes_of(x: DistArray, t: int):
    """The block sizes of ``x`` along axis ``t`` (``None`` when ``t`` is whole)."""
    return x.distribution.sizes(t) if x.split[t] is not None else None


def laid_out(x: DistArray, grid: ProcessGrid, d: Distribution) -> DistArray:
    """``x`` laid out as ``d`` on ``grid`` (collective: a redistribution unless ``x`` already
    has that layout on a grid of the same shape)."""
    if x.distribution == d and x.grid.dims == grid.dims:
        return x if x.grid is grid else DistArray(x.local, d, grid)
    return x.redistribute(grid=grid, distribution=d)


def insert_axis(x: DistArray, axis: int) -> DistArray:
    """``x`` with a whole length-1 axis inserted at ``axis`` (no data moves)."""
    d = x.distribution
    split, sizes, shape = list(d.split), list(d.split_sizes), list(d.shape)
    split.insert(axis, None)
    sizes.insert(axis, None)
    shape.insert(axis, 1)
    return DistArray(x.xp.expand_dims(x.local, axis),
                     Distribution(shape, d.grid_dims, split, sizes), x.grid)


def remove_axis(x: DistArray, axis: int) -> DistArray:
    """``x`` without its whole length-1 axis ``axis`` (no data moves)."""
    assert x.shape[axis] == 1 and x.split[axis] is None
    return DistArray(x.xp.squeeze(x.local, axis), x.distribution.drop_axes([axis]), x.grid)


def replicated(a, grid: ProcessGrid) -> DistArray:
    """A NumPy array (the same on every rank) as a replicated DistArray on ``grid``."""
    a = np.asarray(a)
    return DistArray(a, Distribution(a.shape, grid.dims, None), grid)


def block_of(full, grid: ProcessGrid, d: Distribution, xp=np) -> DistArray:
    """This rank's block of the replicated global array ``full`` laid out as ``d``."""
    full = np.asarray(full)
    block = full[d.block_slices(grid.coords)] if full.ndim else full
    block = np.array(block, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
    return DistArray(block if xp is np else xp.asarray(block), d, grid)


def batch_layout(x: DistArray, shape) -> Distribution:
    """The layout of a result of ``shape`` computed from the matrices of ``x``: the batch axes
    (all but ``x``'s last two) laid out like ``x``'s, the result's other axes whole."""
    d = x.distribution
    k = len(shape) - (x.ndim - 2)
    return Distribution(shape, d.grid_dims, d.split[:-2] + (None,) * k,
                        d.split_sizes[:-2] + (None,) * k)
