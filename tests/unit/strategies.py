"""Hypothesis strategies shared by the pure unit tests."""
from __future__ import annotations

import math

from hypothesis import assume
from hypothesis import strategies as st


@st.composite
def grid_dims_st(draw, max_axes=3, max_extent=4, max_size=24, min_axes=1):
    dims = draw(st.lists(st.integers(1, max_extent), min_size=min_axes, max_size=max_axes))
    assume(math.prod(dims) <= max_size)
    return tuple(dims)


@st.composite
def split_st(draw, ndim: int, ngrid: int):
    """One entry per tensor axis: a distinct grid axis or ``None``."""
    free = list(range(ngrid))
    split = []
    for _ in range(ndim):
        g = draw(st.sampled_from([None] + free))
        if g is not None:
            free.remove(g)
        split.append(g)
    return tuple(split)


@st.composite
def compositions(draw, n: int, p: int):
    """``p`` non-negative integers summing to ``n`` (zeros allowed, any imbalance)."""
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=p - 1, max_size=p - 1)))
    bounds = [0] + cuts + [n]
    return tuple(b - a for a, b in zip(bounds[:-1], bounds[1:]))
