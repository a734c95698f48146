"""``gradient``, ``trapezoid``, ``interp``, ``convolve`` and ``nan_to_num`` against NumPy
(float64 reference) on random shapes, 1-D and 2-D grids, uneven and empty blocks (halos that
reach past a neighbour's block), as ``dt.*`` and through ``np.*``; bad input with NumPy's
errors on every rank."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from checks import SIZE, examples, dist, collective_checks, check_blocks as check
from checks import last_rank_only, mismatch
from conftest import assert_raises_all
from disttensor.testing.strategies import layouts, shapes

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
TOL = dict(rtol=1e-10, atol=1e-10)


@settings(max_examples=examples(6), deadline=None)
@given(sl=layouts(shapes(1, 3, 6, min_side=3), SIZE, 2), seed=st.integers(0, 2**16),
       edge_order=st.sampled_from([1, 2]), via=st.sampled_from(["dt", "np"]),
       spacing=st.sampled_from(["none", "scalar", "coords"]), data=st.data())
@collective_checks
def test_gradient(sl, seed, edge_order, via, spacing, data):
    shape, layout = sl
    rng = np.random.default_rng(seed)
    a = rng.normal(size=shape)
    x = dist(a, layout)
    f = dt if via == "dt" else np
    nd = len(shape)
    axis = data.draw(st.sampled_from([None] + list(range(-nd, nd))))
    axes = list(range(nd)) if axis is None else [axis % nd]
    if spacing == "none":
        args = ()
    elif spacing == "scalar":
        args = (0.25,)
    else:  # per axis: coordinates (uneven or uniform) or a scalar
        args = tuple(np.cumsum(rng.random(shape[t]) + 0.1) if rng.random() < 0.6
                     else (np.arange(shape[t]) * 0.5 if rng.random() < 0.5 else 2.0)
                     for t in axes)
    got = f.gradient(x, *args, axis=axis, edge_order=edge_order)
    want = np.gradient(a, *args, axis=axis, edge_order=edge_order)
    if len(axes) == 1:
        got, want = (got,), (want,)
    for k, (g, w) in enumerate(zip(got, want)):
        check(g, w, f"gradient axis {axes[k]}", layout=layout, **TOL)
    ai = rng.integers(-9, 9, size=shape)
    check(f.gradient(dist(ai, layout), axis=axes[0]),
          np.gradient(ai, axis=axes[0]), "gradient int", **TOL)


@settings(max_examples=examples(6), deadline=None)
@given(sl=layouts(shapes(1, 3, 6), SIZE, 2), seed=st.integers(0, 2**16),
       via=st.sampled_from(["dt", "np"]), data=st.data())
@collective_checks
def test_trapezoid_interp_nan_to_num(sl, seed, via, data):
    shape, layout = sl
    rng = np.random.default_rng(seed)
    a = rng.normal(size=shape)
    x = dist(a, layout)
    f = dt if via == "dt" else np
    nd = len(shape)
    axis = data.draw(st.integers(-nd, nd - 1))
    check(f.trapezoid(x, axis=axis), np.trapezoid(a, axis=axis), "trapezoid", **TOL)
    check(f.trapezoid(x, dx=0.3, axis=axis), np.trapezoid(a, dx=0.3, axis=axis), "dx", **TOL)
    c = np.cumsum(rng.random(shape[axis]))
    check(f.trapezoid(x, c, axis=axis), np.trapezoid(a, c, axis=axis), "1-D x", **TOL)
    b = rng.normal(size=shape)
    xb = dist(b, data.draw(layouts(shape, SIZE, 2)))
    check(f.trapezoid(x, xb, axis=axis), np.trapezoid(a, b, axis=axis), "x like y", **TOL)
    xp = np.sort(rng.normal(size=5))
    fp = rng.normal(size=5)
    check(f.interp(x, xp, fp), np.interp(a, xp, fp), "interp", layout=layout, **TOL)
    check(f.interp(x, xp, fp, left=-7.0, right=7.0, period=None),
          np.interp(a, xp, fp, left=-7.0, right=7.0), "interp left/right", **TOL)
    check(f.interp(x, xp, fp, period=2.0), np.interp(a, xp, fp, period=2.0), "period", **TOL)
    m = a.copy()
    m[rng.random(shape) < 0.3] = np.nan
    m[rng.random(shape) < 0.2] = np.inf
    m[rng.random(shape) < 0.2] = -np.inf
    xm = dist(m, layout)
    check(f.nan_to_num(xm), np.nan_to_num(m), "nan_to_num", layout=layout)
    check(f.nan_to_num(xm, nan=-1.0, posinf=5.0, neginf=-5.0),
          np.nan_to_num(m, nan=-1.0, posinf=5.0, neginf=-5.0), "nan_to_num values")
    r = dt.nan_to_num(xm, copy=False)
    check(xm, np.nan_to_num(m), "nan_to_num in place")
    check(r, np.nan_to_num(m), "nan_to_num in place result")


@settings(max_examples=examples(6), deadline=None)
@given(n=st.integers(1, 13), m=st.integers(1, 15), seed=st.integers(0, 2**16),
       mode=st.sampled_from(["full", "same", "valid"]), via=st.sampled_from(["dt", "np"]),
       data=st.data())
@collective_checks
def test_convolve(n, m, seed, mode, via, data):
    rng = np.random.default_rng(seed)
    s = rng.normal(size=n)
    k = rng.normal(size=m)
    x = dist(s, data.draw(layouts((n,), SIZE, 2)))
    f = dt if via == "dt" else np
    check(f.convolve(x, k, mode), np.convolve(s, k, mode), f"convolve {mode}", **TOL)
    kx = dist(k, data.draw(layouts((m,), SIZE, 2)))
    check(f.convolve(x, kx, mode), np.convolve(s, k, mode), f"DistArray kernel {mode}",
          **TOL)


def tiny_blocks(n):
    """Explicit sizes along axis 0 with single-element and empty blocks first (halos reach
    past the neighbours), the rest on the last rank."""
    head = [1, 0, 1][:SIZE - 1]
    return tuple(head) + (n - sum(head),)


@pytest.mark.parametrize("edge_order", [1, 2])
@collective_checks
def test_gradient_convolve_multi_hop(edge_order):
    rng = np.random.default_rng(edge_order)
    a = rng.normal(size=(7, 3))
    layout = ((SIZE,), (0, None), (tiny_blocks(7), None))
    x = dist(a, layout)
    c = np.cumsum(rng.random(7) + 0.1)
    for args in ((), (0.5,), (c, 2.0)):
        got = dt.gradient(x, *args, edge_order=edge_order)
        want = np.gradient(a, *args, edge_order=edge_order)
        for g, w in zip(got, want):
            check(g, w, f"gradient {len(args)} spacing args", layout=layout, **TOL)
    s = rng.normal(size=9)
    xs = dist(s, ((SIZE,), (0,), (tiny_blocks(9),)))
    for k in (rng.normal(size=4), rng.normal(size=9)):
        for mode in ("full", "same", "valid"):
            check(dt.convolve(xs, k, mode), np.convolve(s, k, mode), f"convolve {mode}", **TOL)


def test_bad_input(comm):
    x = dt.from_global(np.arange(12.0).reshape(3, 4))
    short = dt.from_global(np.arange(8.0).reshape(2, 4))
    assert_raises_all(comm, ValueError, "too small to calculate a numerical gradient",
                      lambda: dt.gradient(short, axis=0, edge_order=2))
    assert_raises_all(comm, ValueError, "'edge_order' greater than 2",
                      lambda: dt.gradient(x, edge_order=3))
    assert_raises_all(comm, TypeError, "invalid number of arguments",
                      lambda: dt.gradient(x, 1.0, 2.0, 3.0))
    assert_raises_all(comm, ValueError, "distances must match the length",
                      lambda: dt.gradient(x, np.arange(4.0), np.arange(4.0)))
    assert_raises_all(comm, ValueError, "fp and xp are not of the same length",
                      lambda: dt.interp(x, [1, 2], [1, 2, 3]))
    assert_raises_all(comm, ValueError, "period must be a non-zero value",
                      lambda: dt.interp(x, [1, 2], [1, 2], period=0))
    assert_raises_all(comm, ValueError, "v cannot be empty",
                      lambda: dt.convolve(x[0], np.zeros(0)))
    assert_raises_all(comm, ValueError, "mode must be one of",
                      lambda: dt.convolve(x[0], [1.0], "circular"))
    assert_raises_all(comm, np.exceptions.AxisError, "axis",
                      lambda: dt.trapezoid(x, axis=2))
    if SIZE > 1:
        with mismatch("gradient", "edge_order"):
            dt.gradient(x, edge_order=last_rank_only(1, 2))
