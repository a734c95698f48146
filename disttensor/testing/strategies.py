"""Hypothesis strategies for distributed arrays: process grids, splits, block sizes (uneven and
empty blocks), distributions, layouts and DistArrays with their global NumPy twins.

Every strategy here is a pure function of its arguments: it draws nothing from the rank, the
clock or the environment.  Under the derandomized MPI profile
(:func:`disttensor.testing.profile.load_mpi_profile`) every rank therefore draws the same
examples in the same order, which is what lets a test build a DistArray collectively from a
drawn layout.  Pass the communicator size in explicitly (``grids(comm.size, 3)``), and never
draw anything rank-dependent.

Bad arguments (an impossible layout, a negative extent, ``nranks < 1`` ...) raise
``ValueError`` when the strategy is *defined*, never in the middle of a draw, so every rank
fails the same way before any communication.

Shrinking goes towards the simple cases: 1-D grids, undistributed axes, balanced sizes and
small shapes.  Like ``hypothesis.extra.numpy``, ``dtype`` and ``shape`` arguments may be
strategies where noted.

Requires ``hypothesis`` (``pip install disttensor[test]``); only :func:`dist_arrays` needs MPI.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from hypothesis import reject
from hypothesis import strategies as st

from ..core.distribution import Distribution
from ..core.grid import ProcessGrid

__all__ = ["Layout", "all_grid_dims", "grids", "splits", "shapes", "explicit_sizes",
           "split_sizes", "distributions", "layouts", "dist_arrays"]


# -- validation (at definition time) ---------------------------------------------------------
def _check_int(v, what: str, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) and not hasattr(v, "__index__"):
        raise ValueError(f"{what} must be an integer, got {v!r}")
    v = int(v)
    if v < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {v}")
    return v


def _check_shape(shape, what: str = "shape") -> tuple[int, ...]:
    try:
        items = tuple(shape)
    except TypeError:
        raise ValueError(f"{what} must be a tuple of non-negative integers, got {shape!r}") \
            from None
    return tuple(_check_int(n, f"{what} extent", 0) for n in items)


def _check_dims(dims, what: str = "grid dims") -> tuple[int, ...]:
    dims = _check_shape(dims, what)
    if not dims or any(d < 1 for d in dims):
        raise ValueError(f"{what} must be one or more positive integers, got {dims}")
    return dims


def _grid_dims_of(grid) -> tuple[int, ...]:
    """The grid shape of ``grid``: a ProcessGrid or a tuple of positive extents."""
    if isinstance(grid, ProcessGrid):
        return tuple(grid.dims)
    if isinstance(grid, int) and not isinstance(grid, bool):
        raise ValueError(f"grid must be a dims tuple or a ProcessGrid, got the int {grid} "
                         "(write (n,) for a 1-D grid of n ranks)")
    return _check_dims(grid)


# -- grids -----------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def all_grid_dims(nranks: int, max_ndim: int = 3) -> tuple[tuple[int, ...], ...]:
    """All ordered factorizations of ``nranks`` into 1..``max_ndim`` positive factors (factors
    of 1 included, order matters): for 4 and 2, ``(4,), (1, 4), (2, 2), (4, 1)``.  Shortest
    first, so Hypothesis shrinks towards low-dimensional grids."""
    nranks = _check_int(nranks, "nranks", 1)
    max_ndim = _check_int(max_ndim, "max_ndim", 1)

    def rec(n: int, k: int):
        if k == 1:
            yield (n,)
            return
        for d in range(1, n + 1):
            if n % d == 0:
                for rest in rec(n // d, k - 1):
                    yield (d, *rest)

    return tuple(dims for k in range(1, max_ndim + 1) for dims in rec(nranks, k))


def grids(nranks: int, max_ndim: int = 3) -> st.SearchStrategy[tuple[int, ...]]:
    """A process-grid shape (tuple) with product ``nranks`` and 1..``max_ndim`` axes: any of
    :func:`all_grid_dims`, shrinking towards ``(nranks,)``.  Create the grid from it with
    ``disttensor.ProcessGrid(dims)`` (collective)."""
    return st.sampled_from(all_grid_dims(nranks, max_ndim))


# -- splits and sizes ------------------------------------------------------------------------
def _draw_split(draw, ndim: int, grid_ndim: int, cover: bool, allowed=None):
    """Tensor axis by tensor axis, ``None`` or a grid axis still free (``allowed(t, g)`` may
    forbid pairs).  With ``cover`` the last axes are forced onto the grid axes left."""
    free = list(range(grid_ndim))
    out: list[int | None] = []
    for t in range(ndim):
        axes_left = ndim - t
        choices: list[int | None] = [g for g in free if allowed is None or allowed(t, g)]
        if not (cover and len(free) >= axes_left):  # must place a grid axis on every axis left
            choices = [None] + choices
        if not choices:
            choices = [None]
        c = draw(st.sampled_from(choices))
        if c is not None:
            free.remove(c)
        out.append(c)
    return tuple(out)


@st.composite
def _splits(draw, ndim: int, grid_ndim: int, cover: bool):
    return _draw_split(draw, ndim, grid_ndim, cover)


def splits(ndim: int, grid, *, cover: bool = False) -> st.SearchStrategy[tuple]:
    """A ``split`` tuple for an ``ndim``-d array on a grid (``grid``: the number of grid axes,
    a dims tuple or a ProcessGrid): tensor axis ``i`` is distributed over grid axis
    ``split[i]`` (each grid axis used at most once) or not at all (``None``).  With
    ``cover=True`` every grid axis is used (needs ``ndim >= grid ndim``); otherwise unused grid
    axes mean replication.  Shrinks towards ``None`` (undistributed)."""
    ndim = _check_int(ndim, "ndim", 0)
    if isinstance(grid, int) and not isinstance(grid, bool):
        grid_ndim = _check_int(grid, "grid ndim", 0)
    else:
        grid_ndim = len(_grid_dims_of(grid))
    if cover and grid_ndim > ndim:
        raise ValueError(f"cannot cover {grid_ndim} grid axes with {ndim} tensor axes")
    return _splits(ndim, grid_ndim, cover)


@st.composite
def _explicit_sizes(draw, n: int, p: int, empty: bool):
    if empty:
        cuts = sorted(draw(st.lists(st.integers(0, n), min_size=p - 1, max_size=p - 1)))
    else:  # p - 1 distinct inner cuts: every part >= 1
        cuts = sorted(draw(st.lists(st.integers(1, n - 1), min_size=p - 1, max_size=p - 1,
                                    unique=True)))
    bounds = [0, *cuts, n]
    return tuple(b - a for a, b in zip(bounds[:-1], bounds[1:]))


def explicit_sizes(n: int, p: int, *, empty: bool = True) -> st.SearchStrategy[tuple]:
    """Explicit block sizes along one axis: ``p`` non-negative integers summing to ``n`` (a
    composition), uneven and -- unless ``empty=False`` -- zero parts included.  ``empty=False``
    needs ``n >= p``."""
    n = _check_int(n, "n", 0)
    p = _check_int(p, "p", 1)
    if not empty and n < p:
        raise ValueError(f"cannot split {n} elements into {p} non-empty blocks")
    if p == 1:
        return st.just((n,))
    return _explicit_sizes(n, p, empty)


def _draw_sizes(draw, shape, dims, split, uneven: bool, empty: bool) -> tuple:
    sizes = []
    for t, g in enumerate(split):
        if g is None or not uneven or not draw(st.booleans()):
            sizes.append(None)
        else:
            sizes.append(draw(explicit_sizes(shape[t], dims[g], empty=empty)))
    return tuple(sizes)


@st.composite
def _split_sizes(draw, shape, dims, split, uneven, empty):
    return _draw_sizes(draw, shape, dims, split, uneven, empty)


def split_sizes(shape, grid, split, *, uneven: bool = True, empty: bool = True) \
        -> st.SearchStrategy[tuple]:
    """The ``sizes`` argument for ``split`` of an array of ``shape`` over ``grid`` (dims tuple
    or ProcessGrid): per split axis ``None`` (balanced) or explicit sizes from
    :func:`explicit_sizes`; ``None`` for axes not split.  ``uneven=False`` draws balanced sizes
    only; ``empty=False`` draws explicit sizes without zero blocks (then a split axis must be
    at least as long as its grid axis)."""
    shape, dims = _check_shape(shape), _grid_dims_of(grid)
    split = tuple(Distribution(shape, dims, split).split)  # validates the split
    if not empty:
        _check_no_empty(shape, dims, split)
    return _split_sizes(shape, dims, split, bool(uneven), bool(empty))


def _check_no_empty(shape, dims, split) -> None:
    for t, g in enumerate(split):
        if g is not None and shape[t] < dims[g]:
            raise ValueError(f"empty=False: axis {t} of extent {shape[t]} cannot be split over "
                             f"grid axis {g} of {dims[g]} ranks without empty blocks")


# -- distributions and layouts ---------------------------------------------------------------
def _shape_strategy(shape):
    if isinstance(shape, st.SearchStrategy):
        return shape
    return st.just(_check_shape(shape))


@st.composite
def _distributions(draw, shape_st, dims, uneven, empty):
    shape = draw(shape_st)
    allowed = None if empty else (lambda t, g: shape[t] >= dims[g])
    split = _draw_split(draw, len(shape), len(dims), False, allowed)
    return Distribution(shape, dims, split, _draw_sizes(draw, shape, dims, split, uneven, empty))


def distributions(shape, grid, *, uneven: bool = True, empty: bool = True) \
        -> st.SearchStrategy[Distribution]:
    """A :class:`disttensor.Distribution` of an array of ``shape`` (a tuple or a strategy of
    tuples) over ``grid`` (dims tuple or ProcessGrid): a drawn split (grid axes left over mean
    replication) and, per split axis, balanced or explicit sizes.  ``uneven=False``: balanced
    sizes only (blocks differ by at most one element).  ``empty=False``: no rank holds an empty
    block along a split axis (axes shorter than their grid axis stay unsplit; an array of size
    0 is of course empty everywhere)."""
    return _distributions(_shape_strategy(shape), _grid_dims_of(grid), bool(uneven), bool(empty))


class Layout(NamedTuple):
    """A block layout without its shape: ``(dims, split, sizes)``, the grid shape and the
    ``split`` and ``sizes`` arguments of ``disttensor.from_global`` & co."""
    dims: tuple[int, ...]
    split: tuple
    sizes: tuple

    def distribution(self, shape) -> Distribution:
        """The :class:`disttensor.Distribution` of an array of ``shape`` in this layout."""
        return Distribution(shape, self.dims, self.split, self.sizes)


@st.composite
def _layouts(draw, shape_st, nranks: int, max_grid_ndim: int, with_shape: bool):
    shape = draw(shape_st)
    dims = draw(grids(nranks, max_grid_ndim))
    split = _draw_split(draw, len(shape), len(dims), False)
    layout = Layout(dims, split, _draw_sizes(draw, shape, dims, split, True, True))
    return (shape, layout) if with_shape else layout


def layouts(shape, nranks: int, max_grid_ndim: int = 3) -> st.SearchStrategy:
    """A whole block layout for an array of ``shape`` on ``nranks`` ranks: a grid shape from
    :func:`grids`, a split and per split axis balanced (``None``) or explicit uneven/empty
    sizes.  Shrinks towards a 1-D grid, no split and balanced sizes.

    ``shape`` a tuple: draws a :class:`Layout` ``(dims, split, sizes)`` (a named tuple, so
    ``dims, split, sizes = layout`` works).  ``shape`` a strategy or ``None`` (for
    :func:`shapes` with its defaults): draws ``(shape, Layout)`` pairs, since the caller needs
    the drawn shape too.  For a grid fixed in advance use :func:`distributions`."""
    nranks = _check_int(nranks, "nranks", 1)
    max_grid_ndim = _check_int(max_grid_ndim, "max_grid_ndim", 1)
    if shape is None:
        return _layouts(shapes(), nranks, max_grid_ndim, True)
    if isinstance(shape, st.SearchStrategy):
        return _layouts(shape, nranks, max_grid_ndim, True)
    return _layouts(st.just(_check_shape(shape)), nranks, max_grid_ndim, False)


def shapes(min_ndim: int = 1, max_ndim: int = 4, max_side: int = 6, *, min_side: int = 0) \
        -> st.SearchStrategy[tuple[int, ...]]:
    """Small global shapes (tuples): ``min_ndim..max_ndim`` axes with sides in
    ``[min_side, max_side]``, so 0 and 1 -- the extents that make empty and single-element
    blocks -- are drawn often, and Hypothesis shrinks towards them.  Unlike
    ``hypothesis.extra.numpy.array_shapes``, ``min_side`` defaults to 0."""
    min_ndim = _check_int(min_ndim, "min_ndim", 0)
    max_ndim = _check_int(max_ndim, "max_ndim", min_ndim)
    min_side = _check_int(min_side, "min_side", 0)
    max_side = _check_int(max_side, "max_side", min_side)
    return st.lists(st.integers(min_side, max_side), min_size=min_ndim,
                    max_size=max_ndim).map(tuple)


# -- DistArrays ------------------------------------------------------------------------------
_GRIDS: dict[tuple[int, ...], ProcessGrid] = {}


def _grid_on_world(dims: tuple[int, ...]) -> ProcessGrid:
    """One ProcessGrid over COMM_WORLD per grid shape (collective the first time: all ranks
    draw the same examples, so they create the grids in the same order)."""
    if dims not in _GRIDS:
        _GRIDS[dims] = ProcessGrid(dims)
    return _GRIDS[dims]


@st.composite
def _dist_arrays(draw, dtype, shape_st, grid, dims_st, split, elements, uneven, empty):
    from hypothesis.extra import numpy as hnp

    import numpy as np

    from ..routines.creation import from_global
    shape = draw(shape_st)
    if grid is None:
        grid = _grid_on_world(draw(dims_st))
    dims = tuple(grid.dims)
    if split is None:
        allowed = None if empty else (lambda t, g: shape[t] >= dims[g])
        split_ = _draw_split(draw, len(shape), len(dims), False, allowed)
    else:
        split_ = Distribution(shape, dims, split).split
        if not empty and any(g is not None and shape[t] < dims[g] for t, g in enumerate(split_)):
            reject()  # a drawn shape too short for the requested split without empty blocks
    sizes = _draw_sizes(draw, shape, dims, split_, uneven, empty)
    a = draw(hnp.arrays(dtype, shape, elements=elements))
    x = from_global(np.asarray(a), grid=grid, split=split_, sizes=sizes)
    return x, a


def dist_arrays(dtype, shape, *, grid=None, split=None, elements=None, uneven: bool = True,
                empty: bool = True) -> st.SearchStrategy:
    """``(x, a)``: a DistArray ``x`` and its global NumPy twin ``a`` (``x.to_numpy()`` equals
    ``a`` on every rank).  Collective: ``x`` is built with ``disttensor.from_global`` over
    COMM_WORLD (or ``grid``'s communicator), which is safe because every rank draws the same
    example.

    * ``dtype``, ``shape``, ``elements``: as in ``hypothesis.extra.numpy.arrays`` (``dtype`` and
      ``shape`` may be strategies; ``elements`` a strategy of scalars, default by dtype).
    * ``grid``: ``None`` draws a grid shape of 1-3 axes over COMM_WORLD; a dims tuple (its
      product must be COMM_WORLD's size) or a ProcessGrid fixes it.
    * ``split``: ``None`` draws one; a tuple fixes it (must fit the shape and grid).
    * ``uneven``, ``empty``: as in :func:`distributions`.
    """
    from mpi4py import MPI
    nworld = MPI.COMM_WORLD.Get_size()
    if isinstance(shape, st.SearchStrategy):
        shape_st, ndim = shape, None
    else:
        fixed = _check_shape(shape)
        shape_st, ndim = st.just(fixed), len(fixed)
    dims_st, fixed_dims = None, None
    if grid is None:
        dims_st = grids(nworld, 3)
    elif isinstance(grid, ProcessGrid):
        fixed_dims = tuple(grid.dims)
    else:
        fixed_dims = _grid_dims_of(grid)
        if math.prod(fixed_dims) != nworld:
            raise ValueError(f"grid dims {fixed_dims} hold {math.prod(fixed_dims)} ranks but "
                             f"COMM_WORLD has {nworld}; pass a ProcessGrid for another "
                             "communicator")
        dims_st, grid = st.just(fixed_dims), None
    if split is not None:
        split = tuple(split)
        if ndim is not None and len(split) > ndim:
            raise ValueError(f"split {split} has more entries than the array has axes ({ndim})")
        if fixed_dims is not None and ndim is not None:  # everything fixed: check it now
            full = Distribution(fixed, fixed_dims, split).split
            if not empty:
                _check_no_empty(fixed, fixed_dims, full)
    return _dist_arrays(dtype, shape_st, grid, dims_st, split, elements, bool(uneven),
                        bool(empty))
