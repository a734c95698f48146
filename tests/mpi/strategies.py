"""Hypothesis strategies for distributed-array tests.

Every strategy here is a pure function of its arguments, so with the derandomized profile of
``conftest.py`` all ranks draw the same examples.  Pass the communicator size in explicitly
(``grid_dims(comm.size, 3)``), never draw anything rank-dependent.
"""
from __future__ import annotations

from functools import lru_cache

from hypothesis import strategies as st

__all__ = ["all_grid_dims", "grid_dims", "splits", "shapes", "explicit_sizes", "layouts"]


@lru_cache(maxsize=None)
def all_grid_dims(nranks: int, max_ndim: int) -> tuple[tuple[int, ...], ...]:
    """All ordered factorizations of ``nranks`` into 1..``max_ndim`` positive factors (factors
    of 1 included, order matters): for 4 and 2, ``(4,), (1, 4), (2, 2), (4, 1)``.  Shortest
    first, so hypothesis shrinks towards low-dimensional grids."""
    if nranks < 1 or max_ndim < 1:
        raise ValueError(f"need nranks >= 1 and max_ndim >= 1, got {nranks}, {max_ndim}")

    def rec(n: int, k: int):
        if k == 1:
            yield (n,)
            return
        for d in range(1, n + 1):
            if n % d == 0:
                for rest in rec(n // d, k - 1):
                    yield (d, *rest)

    return tuple(dims for k in range(1, max_ndim + 1) for dims in rec(nranks, k))


def grid_dims(nranks: int, max_ndim: int) -> st.SearchStrategy[tuple[int, ...]]:
    """A process-grid shape whose product is ``nranks``, with 1..``max_ndim`` axes."""
    return st.sampled_from(all_grid_dims(nranks, max_ndim))


@st.composite
def _splits(draw, ndim: int, grid_ndim: int, cover: bool):
    if cover and grid_ndim > ndim:
        raise ValueError(f"cannot cover {grid_ndim} grid axes with {ndim} tensor axes")
    free = list(range(grid_ndim))
    out: list[int | None] = []
    for i in range(ndim):
        axes_left = ndim - i
        choices: list[int | None] = list(free)
        if not (cover and len(free) >= axes_left):  # must place a grid axis on every axis left
            choices = [None] + choices
        if not choices:
            choices = [None]
        c = draw(st.sampled_from(choices))
        if c is not None:
            free.remove(c)
        out.append(c)
    return tuple(out)


def splits(ndim: int, grid_ndim: int, *, cover: bool = False) \
        -> st.SearchStrategy[tuple[int | None, ...]]:
    """A ``split`` tuple: tensor axis ``i`` is distributed over grid axis ``split[i]`` (each grid
    axis used at most once) or not distributed (``None``).  With ``cover=True`` every grid axis
    is used (needs ``ndim >= grid_ndim``); otherwise unused grid axes mean replication.
    Shrinks towards ``None`` (undistributed)."""
    if ndim < 0 or grid_ndim < 0:
        raise ValueError("ndim and grid_ndim must be non-negative")
    return _splits(ndim, grid_ndim, cover)


def shapes(min_ndim: int = 1, max_ndim: int = 4, max_side: int = 6, *, min_side: int = 0) \
        -> st.SearchStrategy[tuple[int, ...]]:
    """Small global shapes; sides in ``[min_side, max_side]``, so 0 and 1 are drawn often (and
    hypothesis shrinks towards them)."""
    return st.lists(st.integers(min_side, max_side), min_size=min_ndim,
                    max_size=max_ndim).map(tuple)


@st.composite
def _explicit_sizes(draw, n: int, p: int):
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=p - 1, max_size=p - 1)))
    bounds = [0, *cuts, n]
    return tuple(b - a for a, b in zip(bounds[:-1], bounds[1:]))


def explicit_sizes(n: int, p: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Explicit block sizes: a composition of ``n`` into ``p`` non-negative parts (uneven and
    empty blocks included), e.g. for ownership ranges along one axis of a ``p``-rank grid."""
    if p < 1 or n < 0:
        raise ValueError(f"need p >= 1 and n >= 0, got n={n}, p={p}")
    if p == 1:
        return st.just((n,))
    return _explicit_sizes(n, p)


@st.composite
def block_sizes(draw, shape, dims, split) -> tuple:
    """``sizes`` for a ``split`` of ``shape`` over grid ``dims``: per split axis balanced
    (``None``) or explicit uneven/empty sizes; ``None`` for axes not split."""
    sizes = []
    for t, g in enumerate(split):
        if g is None or not draw(st.booleans()):
            sizes.append(None)
        else:
            sizes.append(draw(explicit_sizes(shape[t], dims[g])))
    return tuple(sizes)


@st.composite
def _layouts(draw, shape: tuple[int, ...], nranks: int, max_grid_ndim: int):
    dims = draw(grid_dims(nranks, max_grid_ndim))
    split = draw(splits(len(shape), len(dims)))
    return dims, split, draw(block_sizes(shape, dims, split))


def layouts(shape, nranks: int, max_grid_ndim: int = 3) \
        -> st.SearchStrategy[tuple[tuple[int, ...], tuple, tuple]]:
    """A whole block layout for an array of ``shape`` on ``nranks`` ranks: ``(grid dims,
    split, sizes)``, where each split axis gets balanced ownership (``None``) or explicit
    uneven/empty sizes.  Shrinks towards a 1-D grid, no split and balanced sizes."""
    return _layouts(tuple(shape), nranks, max_grid_ndim)
