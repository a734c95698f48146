"""The shaping and utility routines (disttensor.routines.manipulation, .padding, .logic,
.mathematical, .indexing take, .sets isin, .creation eye/meshgrid/tril/triu, the nan-reductions)
against NumPy float64 on random shapes and layouts (1-D/2-D/3-D grids,
splits over any grid axis, uneven and empty blocks, replicated axes): every result block must
equal NumPy's exactly (shape functions move data; the elementwise ones are exact), the
nan-reductions to 1e-12 relative (a different summation order than NumPy's pairwise sum over
at most a few hundred elements).  Bad input raises the same exception on every rank."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from checks import (SIZE, check_blocks as check, collective_checks, dist, examples, expect,
                    last_rank_only, mismatch)
from conftest import assert_all_ranks, assert_raises_all
from mpi4py import MPI
from disttensor.testing.strategies import layouts, shapes

COMM = MPI.COMM_WORLD
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def rand(shape, seed, nans=False):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).round(2)  # ties for isclose/clip/round
    if nans and a.size:
        a[rng.random(shape) < 0.3] = np.nan
    return a


@st.composite
def case(draw, min_ndim=1, max_ndim=3, min_side=0):
    shape = draw(shapes(min_ndim, max_ndim, 5, min_side=min_side))
    return shape, draw(layouts(shape, SIZE)), draw(st.integers(0, 2**16))


@settings(max_examples=examples(25))
@given(case(), st.data())
@collective_checks
def test_axes_and_broadcast(c, data):
    shape, layout, seed = c
    a = rand(shape, seed)
    x = dist(a, layout)
    nd = len(shape)
    pos = data.draw(st.integers(-nd - 1, nd))
    check(dt.expand_dims(x, pos), np.expand_dims(a, pos), "expand_dims")
    check(dt.expand_dims(x, (0, nd + 1)), np.expand_dims(a, (0, nd + 1)), "expand_dims tuple")
    y = dt.expand_dims(x, 1)
    check(dt.squeeze(y, 1), a, "squeeze axis")
    check(dt.squeeze(y), np.squeeze(np.expand_dims(a, 1)), "squeeze all")
    ax = data.draw(st.integers(-nd - 1, nd))
    check(dt.stack([x, 2 * x, x], ax), np.stack([a, 2 * a, a], ax), "stack")
    t = data.draw(st.integers(0, nd - 1))
    parts = np.unstack(x, axis=t)
    expect(len(parts) == shape[t], "unstack count")
    for p, w in zip(parts, np.moveaxis(a, t, 0)):
        check(p, w, "unstack")
    # broadcast a length-1 slice of axis t to the full shape, with a new leading axis
    sl = x[(slice(None),) * t + (slice(0, 1),)]
    target = (2,) + shape
    want = np.broadcast_to(a[(slice(None),) * t + (slice(0, 1),)], target)
    check(dt.broadcast_to(sl, target), want, "broadcast_to")
    u, v = dt.broadcast_arrays(sl, x)
    check(u, np.broadcast_to(want[0], shape), "broadcast_arrays 0")
    check(v, a, "broadcast_arrays 1")


@settings(max_examples=examples(25))
@given(case(), st.data())
@collective_checks
def test_roll_repeat_tile_pad(c, data):
    shape, layout, seed = c
    a = rand(shape, seed)
    x = dist(a, layout)
    nd = len(shape)
    t = data.draw(st.integers(0, nd - 1))
    s = data.draw(st.integers(-7, 7))
    r = dt.roll(x, s, t)
    check(r, np.roll(a, s, t), "roll", layout=layout)
    check(dt.roll(x, s), np.roll(a, s), "roll flat")
    if nd >= 2:
        check(dt.roll(x, (s, 1), (0, -1)), np.roll(a, (s, 1), (0, -1)), "roll multi")
    k = data.draw(st.integers(0, 3))
    check(dt.repeat(x, k, t), np.repeat(a, k, t), "repeat")
    reps = data.draw(st.lists(st.integers(0, 3), min_size=shape[t], max_size=shape[t]))
    check(dt.repeat(x, reps, t), np.repeat(a, reps, t), "repeat counts")
    check(dt.repeat(x, 2), np.repeat(a, 2), "repeat flat")
    tl = tuple(data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=nd + 1)))
    check(dt.tile(x, tl), np.tile(a, tl), "tile")
    pw = [(data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in range(nd)]
    for mode in ("constant", "edge", "reflect", "symmetric", "wrap"):
        if mode != "constant" and any(n == 0 for n in shape):
            continue
        kw = {"constant_values": 1.5} if mode == "constant" else {}
        check(dt.pad(x, pw, mode, **kw), np.pad(a, pw, mode, **kw), f"pad {mode}")


@settings(max_examples=examples(20))
@given(case(min_ndim=2), st.integers(-3, 3))
@collective_checks
def test_triangles_eye_meshgrid(c, k):
    shape, layout, seed = c
    a = rand(shape, seed)
    x = dist(a, layout)
    check(dt.tril(x, k), np.tril(a, k), "tril", layout=layout)
    check(dt.triu(x, k), np.triu(a, k), "triu", layout=layout)
    dims, split, sizes = layout
    g = dt.ProcessGrid(dims) if dims not in _GRIDS else _GRIDS[dims]
    _GRIDS[dims] = g
    n, m = shape[-2], shape[-1]
    check(dt.eye(n, m, k, grid=g, split=split[-2:], sizes=sizes[-2:]), np.eye(n, m, k), "eye",
          layout=(dims, split[-2:], sizes[-2:]))
    u = dist(np.arange(n, dtype=float), (dims, split[-2:-1], sizes[-2:-1]))
    v = dist(np.arange(m, dtype=float) * 10, (dims, split[-1:], sizes[-1:]))
    for ind in ("xy", "ij"):
        p, q = dt.meshgrid(u, v, indexing=ind)
        wp, wq = np.meshgrid(np.arange(n, dtype=float), np.arange(m, dtype=float) * 10,
                             indexing=ind)
        check(p, wp, f"meshgrid {ind} 0")
        check(q, wq, f"meshgrid {ind} 1")


_GRIDS: dict = {}


@settings(max_examples=examples(25))
@given(case(), case(), st.data())
@collective_checks
def test_elementwise_and_diff(c1, c2, data):
    shape, layout, seed = c1
    a = rand(shape, seed, nans=True)
    x = dist(a, layout)
    b = a + rand(shape, seed + 1) * 1e-6
    # the second operand in another layout of the same shape: the alignment rule moves it
    y = dist(b, data.draw(layouts(shape, SIZE)))
    check(dt.isclose(x, y, rtol=1e-7, atol=1e-7), np.isclose(a, b, rtol=1e-7, atol=1e-7),
          "isclose")
    check(dt.isclose(x, y, equal_nan=True), np.isclose(a, b, equal_nan=True), "isclose nan")
    expect(dt.allclose(x, y, equal_nan=True) == np.allclose(a, b, equal_nan=True), "allclose")
    expect(dt.array_equal(x, x) == np.array_equal(a, a), "array_equal")
    expect(dt.array_equal(x, x, equal_nan=True), "array_equal nan")
    expect(not dt.array_equal(x, dt.expand_dims(x, 0)), "array_equal shape")
    lo = dist(rand(shape, seed + 2), data.draw(layouts(shape, SIZE)))
    check(np.clip(x, lo, 0.5), np.clip(a, lo.to_numpy(), 0.5), "clip array bound")
    check(np.clip(x, None, lo), np.clip(a, None, lo.to_numpy()), "clip upper only")
    check(np.round(x * 3.7, 1), np.round(a * 3.7, 1), "round")
    z = dist(a + 1j * b, layout)
    check(np.real(z), a, "np.real")
    check(np.imag(z), b, "np.imag")
    check(np.imag(x), np.zeros_like(a), "np.imag of real")
    check(np.astype(x, np.float32), a.astype(np.float32), "np.astype")
    nd = len(shape)
    t = data.draw(st.integers(-nd, nd - 1))
    n = data.draw(st.integers(0, 3))
    check(dt.diff(x, n, t) if hasattr(dt, "diff") else np.diff(x, n, t), np.diff(a, n, t),
          "diff")
    from disttensor.routines.mathematical import diff
    from disttensor.routines.sets import isin
    check(diff(x, 1, t, prepend=x, append=x),
          np.diff(a, 1, t, prepend=a, append=a), "diff prepend/append")
    r = np.round(a)
    test = np.round(b).reshape(-1)[:3]
    check(isin(dist(r, layout), test), np.isin(r, test), "isin")
    check(np.isin(dist(r, layout), dt.from_global(test), invert=True),
          np.isin(r, test, invert=True), "np.isin invert, distributed test values")


@settings(max_examples=examples(20))
@given(case(min_side=1), st.data())
@collective_checks
def test_take(c, data):
    from disttensor.routines.indexing import take, take_along_axis
    shape, layout, seed = c
    a = rand(shape, seed)
    x = dist(a, layout)
    nd = len(shape)
    t = data.draw(st.integers(0, nd - 1))
    idx = np.array(data.draw(st.lists(st.integers(-shape[t], shape[t] - 1), max_size=6)),
                   dtype=np.int64)
    check(take(x, idx, t), np.take(a, idx, t), "take")
    check(take(x, idx.reshape(-1, 1)[:2], t), np.take(a, idx.reshape(-1, 1)[:2], t),
          "take 2-d indices")
    check(take(x, idx), np.take(a, idx) if a.size else np.take(a, idx), "take flat")
    ia = np.random.default_rng(seed).integers(-shape[t], shape[t], size=shape)
    ix = dist(ia, data.draw(layouts(shape, SIZE)))
    got = take_along_axis(x, ix, t)
    check(got, np.take_along_axis(a, ia, t), "take_along_axis")
    expect(got.distribution == ix.distribution, "take_along_axis layout")


@settings(max_examples=examples(25))
@given(case(min_side=1), st.data())
@collective_checks
def test_nan_reductions(c, data):
    shape, layout, seed = c
    a = rand(shape, seed, nans=True)
    x = dist(a, layout)
    nd = len(shape)
    axis = data.draw(st.sampled_from([None, *range(-nd, nd), tuple(range(nd))]))
    keep = data.draw(st.booleans())
    for name in ("nansum", "nanprod", "nanmean", "nanvar", "nanstd", "nanmin", "nanmax"):
        want = getattr(np, name)(a, axis=axis, keepdims=keep)
        got = getattr(dt, name)(x, axis=axis, keepdims=keep)
        exact = name in ("nanmin", "nanmax")
        check(got, want, name, **({} if exact else {"rtol": 1e-12, "atol": 1e-14}))
        # through NumPy's dispatch too
        check(getattr(np, name)(x, axis=axis, keepdims=keep), want, "np." + name,
              **({} if exact else {"rtol": 1e-12, "atol": 1e-14}))
    check(dt.nanvar(x, axis=axis, ddof=1), np.nanvar(a, axis=axis, ddof=1), "nanvar ddof",
          rtol=1e-12, atol=1e-14)
    ax1 = data.draw(st.sampled_from([None, *range(nd)]))
    allnan = np.all(np.isnan(a), axis=ax1)
    if not np.any(allnan):
        for name in ("nanargmin", "nanargmax"):
            check(getattr(dt, name)(x, axis=ax1), getattr(np, name)(a, axis=ax1), name)


def test_nanargmin_all_nan_raises_everywhere():
    # the all-NaN row lives on one rank only; every rank raises
    n = max(2, SIZE)
    a = np.arange(float(n * 3)).reshape(n, 3)
    a[n - 1] = np.nan
    x = dt.from_global(a, split=0)
    assert_raises_all(COMM, ValueError, "All-NaN slice", lambda: dt.nanargmin(x, axis=1))
    assert_raises_all(COMM, ValueError, "All-NaN slice", lambda: np.nanargmax(x, axis=1))
    y = dt.nanmax(x, axis=1).to_numpy()
    assert_all_ranks(COMM, np.isnan(y[-1]) and np.array_equal(y[:-1], a[:-1, 2]), "nanmax")


def test_bad_input_raises_everywhere():
    x = dt.from_global(np.zeros((2 * SIZE, 3)), split=0)
    assert_raises_all(COMM, ValueError, "size not equal to one", lambda: dt.squeeze(x, 0))
    assert_raises_all(COMM, ValueError, "negative", lambda: dt.repeat(x, -1, 0))
    assert_raises_all(COMM, ValueError, "broadcast", lambda: dt.repeat(x, [1] * (2 * SIZE + 1), 0))
    assert_raises_all(COMM, ValueError, "not supported", lambda: dt.pad(x, 1, "median"))
    assert_raises_all(COMM, ValueError, "same shape", lambda: dt.stack([x, x[1:]]))
    assert_raises_all(COMM, ValueError, "broadcast", lambda: dt.broadcast_to(x, (3, 3)))
    assert_raises_all(COMM, np.exceptions.AxisError, "out of bounds",
                      lambda: dt.expand_dims(x, 5))
    assert_raises_all(COMM, IndexError, "out of range", lambda: np.take(x, [9], axis=1))
    assert_raises_all(COMM, ValueError, "at least 2", lambda: dt.tril(x[0]))


def test_arguments_differ_between_ranks():
    if SIZE == 1:
        pytest.skip("needs two ranks to differ")
    x = dt.from_global(np.zeros((2 * SIZE, 3)), split=0)
    with mismatch("roll", "shift"):
        dt.roll(x, last_rank_only(2, 1), 0)
    with mismatch("pad", "mode"):
        dt.pad(x, 1, last_rank_only("edge", "wrap"))
    with mismatch("repeat", "repeats"):
        dt.repeat(x, last_rank_only(3, 2), 0)


@settings(max_examples=examples(15))
@given(case(min_side=1), st.data())
@collective_checks
def test_roll_adjoint(c, data):
    """roll is a permutation, so its adjoint is the opposite roll: <roll(x), y> equals
    <x, roll(y, -s)> for x and y in different layouts (the dot-product test of the shift's
    communication: concatenation of two slices, then the return to x's ownership)."""
    shape, layout, seed = c
    a, b = rand(shape, seed), rand(shape, seed + 1)
    x, y = dist(a, layout), dist(b, data.draw(layouts(shape, SIZE)))
    nd = len(shape)
    t = data.draw(st.integers(0, nd - 1))
    s = data.draw(st.integers(-9, 9))
    lhs = float(dt.sum(dt.roll(x, s, t) * y))
    rhs = float(dt.sum(x * dt.roll(y, -s, t)))
    ref = float(np.sum(np.roll(a, s, t) * b))
    scale = float(np.sum(np.abs(a) * np.abs(b[...]).max())) + 1e-300
    expect(abs(lhs - rhs) <= 1e-12 * scale and abs(lhs - ref) <= 1e-12 * scale,
           f"<Rx,y>={lhs} <x,R*y>={rhs} numpy={ref}")
