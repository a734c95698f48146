"""Cumulative sums and products (disttensor.routines.scans) against NumPy float64, along split and
unsplit axes of 1-D..3-D arrays on 1-D and 2-D grids with uneven and empty blocks.

Tolerances: integer and bool scans are exact; a float cumulative sum differs from NumPy's only
by the association of the sums, so ``|got - want| <= 1e-12 * cumsum(|x|)`` elementwise (the
bound ``(n + p) eps cumsum(|x|)`` with room); products of factors in [0.5, 1.5] to 1e-12
relative."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import disttensor as dt
from checks import SIZE, check_blocks as check, collective_checks, dist, examples, expect, \
    last_rank_only, mismatch
from conftest import assert_raises_all
from disttensor.testing.strategies import layouts, shapes

COMM = MPI.COMM_WORLD


def check_sum(got, x_abs_scan, want, what, layout=None):
    """Elementwise error bound of a reordered float sum (see the module docstring)."""
    check(got, want, what, layout=layout, values=False)
    if isinstance(got, dt.DistArray) and got.shape == want.shape:
        sl = got.local_slices
        err = np.abs(got.local - want[sl])
        ok = bool(np.all(err <= 1e-12 * x_abs_scan[sl]))
        expect(ok, f"{what}: error {err.max() if err.size else 0} over the bound")


@settings(max_examples=examples(40))
@given(shape=shapes(1, 3, max_side=7), data_=st.data(), seed=st.integers(0, 2**16),
       kind=st.sampled_from("fib"), include_initial=st.booleans())
@collective_checks
def test_cumulative(shape, data_, seed, kind, include_initial):
    layout = data_.draw(layouts(shape, SIZE, 2))
    axis = data_.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(seed)
    if kind == "f":
        a = rng.normal(size=shape)
    elif kind == "i":
        a = rng.integers(-5, 6, size=shape)
    else:
        a = rng.random(shape) < 0.5
    x = dist(a, layout)
    ii = include_initial
    want = np.cumulative_sum(a, axis=axis, include_initial=ii)
    got = dt.cumulative_sum(x, axis=axis, include_initial=ii)
    if kind == "f":
        bound = np.cumulative_sum(np.abs(a), axis=axis, include_initial=ii)
        check_sum(got, bound, want, "cumulative_sum")
        check_sum(np.cumsum(x, axis=axis), np.cumsum(np.abs(a), axis=axis),
                  np.cumsum(a, axis=axis), "np.cumsum", layout=layout)
        check_sum(x.cumsum(), np.cumsum(np.abs(a)), np.cumsum(a), "cumsum flat")
        f = 0.5 + rng.random(shape)
        y = dist(f, layout)
        check(dt.cumulative_prod(y, axis=axis, include_initial=ii),
              np.cumulative_prod(f, axis=axis, include_initial=ii), "cumulative_prod",
              rtol=1e-12)
        check(np.cumprod(y, axis=axis), np.cumprod(f, axis=axis), "np.cumprod", rtol=1e-12,
              layout=layout)
    else:
        check(got, want, "cumulative_sum (exact)")
        check(np.cumsum(x, axis=axis), np.cumsum(a, axis=axis), "np.cumsum (exact)",
              layout=layout)
        check(np.cumprod(x, axis=axis), np.cumprod(a, axis=axis), "np.cumprod (exact)")
        check(dt.cumulative_sum(x, axis=axis, dtype=np.float64),
              np.cumulative_sum(a, axis=axis, dtype=np.float64), "dtype=float64")
    if include_initial and layout[1][axis % len(shape)] is not None:
        # the initial element belongs to grid coordinate 0: sizes grow by one there
        d = x.distribution
        t = axis % len(shape)
        s = list(d.sizes(t))
        s[0] += 1
        expect(got.distribution.sizes(t) == tuple(s), "include_initial ownership")


def test_errors(comm):
    g = dt.ProcessGrid((SIZE,))
    m = dt.from_global(np.ones((4, 3)), grid=g, split=(0, None))
    assert_raises_all(comm, ValueError, "axis must be given", lambda: dt.cumulative_sum(m))
    assert_raises_all(comm, np.exceptions.AxisError, "axis", lambda: dt.cumsum(m, axis=2))
    assert_raises_all(comm, TypeError, "out=", lambda: np.cumsum(m, axis=0, out=m))
    if SIZE > 1:
        with mismatch("cumsum", "axis"):
            dt.cumsum(m, axis=last_rank_only(1, 0))
