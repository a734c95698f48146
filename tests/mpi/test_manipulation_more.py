"""The joining, splitting and rearranging routines added for issue 25 (vstack, hstack, dstack,
column_stack, split, array_split, hsplit, vsplit, dsplit, ravel, rot90, atleast_1d/2d/3d)
against NumPy on random shapes and layouts (1-D/2-D grids, uneven and empty blocks, 1-4 ranks):
values exact (they only move data), result layouts as the docstrings say (split pieces keep
the input's split and every rank keeps its own part: nothing moves), ``np.<name>`` dispatch,
and bad input raising NumPy's exception on every rank."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from disttensor.routines import manipulation as M
from checks import (COMM, SIZE, check_blocks as check, collective_checks, dist, examples, expect,
                    grid, last_rank_only, mismatch)
from conftest import assert_raises_all
from disttensor.testing.strategies import layouts, shapes


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).round(3)


@st.composite
def case(draw, min_ndim=1, max_ndim=3, min_side=0):
    shape = draw(shapes(min_ndim, max_ndim, 5, min_side=min_side))
    return shape, draw(layouts(shape, SIZE, 2)), draw(st.integers(0, 2**16))


def same_layout_except(r, x, axes, what):
    """``r`` keeps ``x``'s split and ownership sizes on every axis outside ``axes``."""
    for t in range(x.ndim):
        if t in axes:
            continue
        ok = r.split[t] == x.split[t] and (x.split[t] is None or
                                           r.distribution.sizes(t) == x.distribution.sizes(t))
        expect(ok, f"{what}: axis {t} not laid out like the first operand "
                   f"({r.distribution} vs {x.distribution})")


@settings(max_examples=examples(10))
@given(case(), st.data())
@collective_checks
def test_stacks(c, data):
    shape, layout, seed = c
    a, b = rand(shape, seed), rand(shape, seed + 1)
    x, y = dist(a, layout), dist(b, data.draw(layouts(shape, SIZE, 2)))
    nd = len(shape)
    r = M.vstack([x, y])
    check(r, np.vstack([a, b]), "vstack")
    if nd >= 2:
        same_layout_except(r, x, (0,), "vstack")
    else:  # rows whole, columns split like x
        expect(r.split[0] is None and r.split[1] == x.split[0], f"vstack 1-d: {r.distribution}")
    r = M.hstack([x, y, x])
    check(r, np.hstack([a, b, a]), "hstack")
    same_layout_except(r, x, (0 if nd == 1 else 1,), "hstack")
    check(M.dstack([x, y]), np.dstack([a, b]), "dstack")
    if nd <= 2:
        check(M.column_stack([x, y]), np.column_stack([a, b]), "column_stack")
    check(M.vstack([x, y], dtype=np.float32), np.vstack([a, b], dtype=np.float32),
          "vstack dtype")
    check(np.vstack((x, y)), np.vstack((a, b)), "np.vstack")
    check(np.hstack([x, y]), np.hstack([a, b]), "np.hstack")
    check(np.dstack([x, y]), np.dstack([a, b]), "np.dstack")
    check(np.column_stack([x]), np.column_stack([a]), "np.column_stack")
    s = dt.from_global(np.array(2.5), grid=x.grid)
    check(M.hstack([s, s]), np.hstack([2.5, 2.5]), "hstack 0-d")
    check(M.column_stack([s, s]), np.column_stack([np.array(2.5), np.array(2.5)]),
          "column_stack 0-d")
    for fn, npfn in ((M.atleast_1d, np.atleast_1d), (M.atleast_2d, np.atleast_2d),
                     (M.atleast_3d, np.atleast_3d)):
        check(fn(x), npfn(a), fn.__name__)
        check(fn(s), npfn(np.array(2.5)), fn.__name__ + " 0-d")
        u, v = fn(x, s)
        check(u, npfn(a), fn.__name__ + " pair")
        check(getattr(np, fn.__name__)(x), npfn(a), "np." + fn.__name__)


def piece_sizes(x, axis, start, stop):
    """The ownership sizes a slice [start, stop) of split axis ``axis`` keeps (nothing moves)."""
    o = x.distribution.offsets[axis]
    return tuple(max(0, min(o[c + 1], stop) - max(o[c], start)) for c in range(len(o) - 1))


@settings(max_examples=examples(10))
@given(case(), st.data())
@collective_checks
def test_split(c, data):
    shape, layout, seed = c
    a = rand(shape, seed)
    x = dist(a, layout)
    nd = len(shape)
    t = data.draw(st.integers(-nd, nd - 1))
    n = shape[t]
    k = data.draw(st.integers(1, 5))
    got, want = M.array_split(x, k, t), np.array_split(a, k, t)
    expect(isinstance(got, list) and len(got) == len(want), "array_split count")
    start = 0
    for i, (p, w) in enumerate(zip(got, want)):
        check(p, w, f"array_split {k} piece {i}")
        if x.split[t] is not None:
            expect(p.split == x.split and tuple(p.distribution.sizes(t)) ==
                   piece_sizes(x, t % nd, start, start + w.shape[t]),
                   f"piece {i} moved data: {p.distribution} from {x.distribution}")
        start += w.shape[t]
    idx = data.draw(st.lists(st.integers(-n - 2, n + 2), max_size=4))
    for p, w in zip(M.array_split(x, idx, t), np.array_split(a, idx, t)):
        check(p, w, f"array_split at {idx}")
    got = M.split(x, np.array(idx, dtype=np.int64), t)
    want = np.split(a, np.array(idx, dtype=np.int64), t)
    expect(len(got) == len(want), "split count")
    for p, w in zip(got, want):
        check(p, w, f"split at {idx}")
    d = next(d for d in (3, 2, 1) if n % d == 0)
    for p, w in zip(np.split(x, d, axis=t), np.split(a, d, axis=t)):
        check(p, w, f"np.split {d}")
    for p, w in zip(np.array_split(x, k, axis=t), np.array_split(a, k, axis=t)):
        check(p, w, f"np.array_split {k}")
    for name, lo in (("hsplit", 1), ("vsplit", 2), ("dsplit", 3)):
        if nd >= lo:
            ax = {"hsplit": 1 if nd > 1 else 0, "vsplit": 0, "dsplit": 2}[name]
            parts = [1, 2] if shape[ax] % 2 else 2
            for p, w in zip(getattr(M, name)(x, parts), getattr(np, name)(a, parts)):
                check(p, w, name)
            for p, w in zip(getattr(np, name)(x, parts), getattr(np, name)(a, parts)):
                check(p, w, "np." + name)


@settings(max_examples=examples(10))
@given(case(min_ndim=2), st.data())
@collective_checks
def test_ravel_rot90(c, data):
    shape, layout, seed = c
    a = rand(shape, seed)
    x = dist(a, layout)
    nd = len(shape)
    for order in ("C", "F", "A", "K"):
        check(M.ravel(x, order), np.ravel(a, order), f"ravel {order}")
    check(np.ravel(x), np.ravel(a), "np.ravel")
    k = data.draw(st.integers(-5, 5))
    i = data.draw(st.integers(-nd, nd - 1))
    j = data.draw(st.integers(-nd, nd - 1).filter(lambda j: (j - i) % nd != 0))
    check(M.rot90(x, k, (i, j)), np.rot90(a, k, (i, j)), f"rot90 {k} {(i, j)}")
    check(np.rot90(x, k), np.rot90(a, k), f"np.rot90 {k}")
    if k % 2 and x.split[i] is not None:  # the axes swap places with their splits
        r = M.rot90(x, k, (i, j))
        expect(r.split[j] == x.split[i], f"rot90 split: {r.distribution} from {x.distribution}")


def test_bad_input_on_every_rank():
    g = grid((SIZE,))
    x = dt.from_global(rand((5, 4, 3), 1), grid=g)
    v = dt.from_global(rand((5,), 2), grid=g)
    s = dt.from_global(np.array(1.0), grid=g)
    assert_raises_all(COMM, ValueError, "equal division", lambda: M.split(x, 2))
    assert_raises_all(COMM, ValueError, "equal division", lambda: np.split(x, 3, axis=1))
    assert_raises_all(COMM, ValueError, "number sections must be larger than 0",
                      lambda: M.array_split(x, 0))
    assert_raises_all(COMM, np.exceptions.AxisError, "axis 3 is out of bounds",
                      lambda: M.array_split(x, 2, 3))
    assert_raises_all(COMM, ValueError, "hsplit only works on arrays of 1 or more",
                      lambda: M.hsplit(s, 1))
    assert_raises_all(COMM, ValueError, "vsplit only works on arrays of 2 or more",
                      lambda: M.vsplit(v, 1))
    assert_raises_all(COMM, ValueError, "dsplit only works on arrays of 3 or more",
                      lambda: M.dsplit(x[0], 1))
    assert_raises_all(COMM, ValueError, "need at least one array", lambda: M.vstack([]))
    assert_raises_all(COMM, ValueError, "all the input array dimensions except for the "
                      "concatenation axis must match", lambda: M.vstack([x, x[:, :2]]))
    assert_raises_all(COMM, TypeError, "must be a DistArray", lambda: M.hstack([x, 1.0]))
    assert_raises_all(COMM, ValueError, "Axes must be different", lambda: M.rot90(x, 1, (0, 0)))
    assert_raises_all(COMM, ValueError, "Axes must be different", lambda: M.rot90(v))
    assert_raises_all(COMM, ValueError, r"len\(axes\) must be 2", lambda: M.rot90(x, 1, (0,)))
    assert_raises_all(COMM, ValueError, "out of range", lambda: M.rot90(x, 1, (0, 4)))
    assert_raises_all(COMM, ValueError, "order must be one of", lambda: M.ravel(x, "X"))
    assert_raises_all(COMM, TypeError, "expected a DistArray", lambda: M.atleast_2d(x, [1.0]))


def test_arguments_differing_between_ranks():
    if SIZE == 1:
        pytest.skip("needs 2 ranks")
    x = dt.from_global(rand((6, 4), 1), grid=grid((SIZE,)))
    with mismatch("array_split", "sections"):
        M.array_split(x, last_rank_only(3, 2))
    with mismatch("split", "sections"):
        M.split(x, last_rank_only([1, 4], [1, 3]))
    with mismatch("rot90", "k"):
        M.rot90(x, last_rank_only(1, 2))
    with mismatch("ravel", "order"):
        M.ravel(x, last_rank_only("F", "C"))
