"""DistArray's NumPy methods (disttensor/core/array_methods.py) against ndarray's on random
shapes and layouts (1-D/2-D grids, uneven and empty blocks, 1-4 ranks): reductions with
NumPy's positional order, shape and selection methods, elementwise ones, sort (in place),
scans and searches, fill, tolist, put; each result equals ndarray's (exactly where the
method only moves data, to 1e-12 where it sums in another order); bad input raises NumPy's
exception on every rank."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from checks import (COMM, SIZE, check_blocks as check, collective_checks, dist, examples, expect,
                    grid, last_rank_only, mismatch)
from conftest import assert_raises_all
from disttensor.testing.strategies import layouts, shapes

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def rand(shape, seed, cplx=False):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).round(2)
    return a + 1j * rng.standard_normal(shape).round(2) if cplx else a


@st.composite
def case(draw, min_ndim=1, max_ndim=3, min_side=0):
    shape = draw(shapes(min_ndim, max_ndim, 5, min_side=min_side))
    return shape, draw(layouts(shape, SIZE, 2)), draw(st.integers(0, 2**16))


SUMS = dict(rtol=1e-12, atol=1e-12)


@settings(max_examples=examples(6))
@given(case(min_side=1), st.data())
@collective_checks
def test_reductions(c, data):
    shape, layout, seed = c
    a = rand(shape, seed)
    x = dist(a, layout)
    nd = len(shape)
    t = data.draw(st.integers(-nd, nd - 1))
    check(x.sum(), a.sum(), "sum", **SUMS)
    check(x.sum(t, None, None, True), a.sum(t, None, None, True), "sum positional", **SUMS)
    check(x.prod(axis=t, dtype=np.float32), a.prod(axis=t, dtype=np.float32), "prod",
          rtol=1e-5)
    check(x.mean(t, keepdims=True), a.mean(t, keepdims=True), "mean", **SUMS)
    check(x.var(t, None, None, 1), a.var(t, None, None, 1), "var ddof", **SUMS)
    check(x.std(), a.std(), "std", **SUMS)
    check(x.min(t), a.min(t), "min")
    check(x.max(None, None, True), a.max(None, None, True), "max keepdims")
    check(x.argmin(t), a.argmin(t), "argmin")
    check(x.argmax(keepdims=True), a.argmax(keepdims=True), "argmax")
    check((x > 0).any(t), (a > 0).any(t), "any")
    check((x > -1).all(), (a > -1).all(), "all")
    if nd >= 2:
        check(x.trace(1), a.trace(1), "trace", **SUMS)
        check(x.trace(0, nd - 1, 0, np.float32), a.trace(0, nd - 1, 0, np.float32), "trace",
              rtol=1e-5)


@settings(max_examples=examples(6))
@given(case(), st.data())
@collective_checks
def test_shape_and_selection(c, data):
    shape, layout, seed = c
    a = rand(shape, seed)
    x = dist(a, layout)
    nd = len(shape)
    for order in ("C", "F"):
        check(x.flatten(order), a.flatten(order), f"flatten {order}")
        check(x.ravel(order), a.ravel(order), f"ravel {order}")
        check(x.reshape(a.size, order=order), a.reshape(a.size, order=order),
              f"reshape {order}")
        check(x.reshape(*shape[::-1], 1, order=order), a.reshape(*shape[::-1], 1, order=order),
              f"reshape {order} n-d")
    check(x.reshape(*shape[::-1]), a.reshape(*shape[::-1]), "reshape *shape")
    check(x.transpose(), a.transpose(), "transpose")
    check(x.T, a.T, "T")
    perm = tuple(data.draw(st.permutations(range(nd))))
    check(x.transpose(*perm), a.transpose(*perm), "transpose *axes")
    check(x.transpose(perm), a.transpose(perm), "transpose axes")
    y, b = x[None], a[None]
    check(y.squeeze(), b.squeeze(), "squeeze")
    check(y.squeeze(0), b.squeeze(0), "squeeze axis")
    t = data.draw(st.integers(-nd, nd - 1))
    check(x.swapaxes(0, t), a.swapaxes(0, t), "swapaxes")
    check(x.repeat(2, t), a.repeat(2, t), "repeat")
    check(x.repeat(2), a.repeat(2), "repeat flat")
    if shape[t]:
        idx = data.draw(st.lists(st.integers(-shape[t], shape[t] - 1), max_size=4))
        idx = np.array(idx, dtype=np.intp)
        check(x.take(idx, t), a.take(idx, t), "take")
    if nd >= 2:
        k = data.draw(st.integers(-2, 2))
        check(x.diagonal(k), a.diagonal(k), "diagonal")
        check(x.diagonal(0, nd - 1, 0), a.diagonal(0, nd - 1, 0), "diagonal axes")


@settings(max_examples=examples(6))
@given(case(), st.booleans(), st.data())
@collective_checks
def test_elementwise(c, cplx, data):
    shape, layout, seed = c
    a = rand(shape, seed, cplx)
    x = dist(a, layout)
    check(x.conj(), a.conj(), "conj")
    check(x.conjugate(), a.conjugate(), "conjugate")
    check(x.real, a.real, "real")
    check(x.imag, a.imag, "imag")
    r = rand(shape, seed + 1)
    y = dist(r, data.draw(layouts(shape, SIZE, 2)))
    check(y.clip(-0.5, 0.5), r.clip(-0.5, 0.5), "clip")
    check(y.clip(max=0.2), r.clip(max=0.2), "clip max=")
    check(y.clip(min=y * 0.5), r.clip(min=r * 0.5), "clip array min")
    check((y * 3.3).round(1), (r * 3.3).round(1), "round")
    check(y.round(), r.round(), "round 0")
    v = rand(shape[-1:], seed + 2)
    check(y.dot(v), r.dot(v), "dot vector", **SUMS)
    if len(shape) == 2:
        check(y.dot(y.T), r.dot(r.T), "dot matrix", **SUMS)


@settings(max_examples=examples(6))
@given(case(), st.data())
@collective_checks
def test_sort_scan_search(c, data):
    shape, layout, seed = c
    a = rand(shape, seed)
    x = dist(a, layout)
    nd = len(shape)
    t = data.draw(st.integers(-nd, nd - 1))
    y, b = x.copy(), a.copy()
    y.sort(t)
    b.sort(t)
    check(y, b, "sort in place", layout=layout)
    if shape[t]:
        k = data.draw(st.integers(0, shape[t] - 1))
        y, b = x.copy(), a.copy()
        y.partition(k, t)
        b.partition(k, t)
        kth = (slice(None),) * (t % nd) + (slice(k, k + 1),)
        check(y[kth], b[kth], "partition: the kth elements in place")
        check(dt.sort(y, axis=t), np.sort(a, t), "partition permutes along the axis")
        expect(y.distribution == x.distribution, "partition changed the layout")
        i = x.argpartition(k, t)
        check(np.take_along_axis(x, i, t)[kth], b[kth], "argpartition")
    check(x.argsort(t, kind="stable"), a.argsort(t, kind="stable"), "argsort")
    check(x.argsort(None), a.argsort(None, kind="stable"), "argsort flat")
    check(x.cumsum(t), a.cumsum(t), "cumsum", **SUMS)
    check(x.cumsum(), a.cumsum(), "cumsum flat", **SUMS)
    check(x.cumprod(t, np.float32), a.cumprod(t, np.float32), "cumprod", rtol=1e-5)
    got, want = (x > 0).nonzero(), (a > 0).nonzero()
    expect(len(got) == len(want), "nonzero count")
    for g, w in zip(got, want):
        check(g, w, "nonzero")
    s = np.sort(a.ravel())
    z = dist(s, data.draw(layouts(s.shape, SIZE, 2)))
    q = np.array([-1.0, 0.0, 0.5, 2.0])
    for side in ("left", "right"):  # NumPy values searched: a NumPy result (the routine's rule)
        got = z.searchsorted(q, side)
        got = got.to_numpy() if isinstance(got, dt.DistArray) else got
        expect(np.array_equal(got, s.searchsorted(q, side)), f"searchsorted {side}")
    check(z.searchsorted(dist(q, data.draw(layouts(q.shape, SIZE, 2)))), s.searchsorted(q),
          "searchsorted DistArray values")


@settings(max_examples=examples(6))
@given(case(), st.data())
@collective_checks
def test_fill_tolist_put(c, data):
    shape, layout, seed = c
    a = rand(shape, seed)
    x = dist(a, layout)
    expect(x.tolist() == a.tolist(), "tolist")
    y, b = x.copy(), a.copy()
    y.fill(2.5)
    b.fill(2.5)
    check(y, b, "fill", layout=layout)
    i = dt.from_global(np.arange(6, dtype=np.int32).reshape(2, 3) % 4, grid=x.grid)
    i.fill(dt.from_global(np.array(7.9), grid=x.grid))  # a 0-d DistArray, cast as NumPy
    check(i, np.full((2, 3), 7, np.int32), "fill int from 0-d")
    if a.size:
        idx = data.draw(st.lists(st.integers(-a.size, a.size - 1), min_size=1, max_size=4))
        vals = np.arange(len(idx), dtype=float) + 10
        y, b = x.copy(), a.copy()
        y.put(idx, vals)
        b.put(idx, vals)
        check(y, b, "put")


def test_bad_input_on_every_rank():
    g = grid((SIZE,))
    x = dt.from_global(rand((5, 3), 1), grid=g)
    assert_raises_all(COMM, ValueError, "could not convert string to float",
                      lambda: x.fill("abc"))
    assert_raises_all(COMM, TypeError, "out= is not supported", lambda: x.sum(out=x))
    assert_raises_all(COMM, ValueError, "order must be one of", lambda: x.reshape(15, order="X"))
    assert_raises_all(COMM, ValueError, "order must be one of", lambda: x.flatten("X"))
    assert_raises_all(COMM, ValueError, "cannot select an axis to squeeze",
                      lambda: x.squeeze(0))
    assert_raises_all(COMM, np.exceptions.AxisError, "out of bounds", lambda: x.cumsum(2))
    assert_raises_all(COMM, ValueError, "cannot reshape", lambda: x.reshape(4, 4))
    assert_raises_all(COMM, ValueError, "axis1 and axis2 cannot be the same",
                      lambda: x.diagonal(0, 1, 1))


def test_arguments_differing_between_ranks():
    if SIZE == 1:
        pytest.skip("needs 2 ranks")
    x = dt.from_global(rand((6, 4), 1), grid=grid((SIZE,)))
    with mismatch("fill", "value"):
        x.fill(last_rank_only(2, 1.5))
    with mismatch("ravel", "order"):
        x.flatten(last_rank_only("F", "C"))
