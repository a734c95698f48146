"""The top-level names a NumPy user types: ``dt.asarray``, ``dt.take``, ``dt.diff``,
``dt.round``, the bitwise ufuncs, the dtype names and constants, one-argument ``where``
(``nonzero``), and NumPy's ``size=`` in the ``dt.random`` generators; against NumPy on 1-D and
2-D grids with uneven and empty blocks."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from checks import SIZE, examples, dist, expect, collective_checks, check_blocks as check
from conftest import assert_raises_all
from disttensor.testing.strategies import layouts, shapes


@settings(max_examples=examples(10), deadline=None)
@given(sl=layouts(shapes(1, 3, 5), SIZE, 2), seed=st.integers(0, 2**16))
@collective_checks
def test_names(sl, seed):
    shape, layout = sl
    rng = np.random.default_rng(seed)
    a = rng.integers(-50, 50, size=shape)
    b = rng.integers(0, 5, size=shape)
    x, y = dist(a, layout), dist(b, layout)
    for name in ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift",
                 "bitwise_left_shift", "bitwise_right_shift"):
        check(getattr(dt, name)(x, y), getattr(np, name)(a, b), name, layout=layout)
    for name in ("invert", "bitwise_not", "bitwise_invert"):
        check(getattr(dt, name)(x), getattr(np, name)(a), name, layout=layout)
    check(dt.where(x > 0)[0], np.where(a > 0)[0].astype(np.int64), "where(cond)")
    got, want = np.where(x > 0), np.where(a > 0)
    expect(len(got) == len(want), "np.where(cond) arity")
    for g, w in zip(got, want):
        check(g, w.astype(np.int64), "np.where(cond)")
    f = a * 0.37
    xf = dist(f, layout)
    check(dt.round(xf, 1), np.round(f, 1), "round", layout=layout)
    check(dt.diff(xf, axis=-1), np.diff(f, axis=-1), "diff")
    idx = rng.integers(0, shape[0], size=3) if shape[0] else np.zeros(0, int)
    check(dt.take(xf, idx, axis=0), np.take(f, idx, axis=0), "take")
    check(dt.asarray(f, grid=x.grid, split=layout.split, sizes=layout.sizes), f, "asarray",
          layout=layout)
    check(dt.asarray(xf, dtype=dt.float32), f.astype(np.float32), "asarray cast",
          layout=layout)
    expect(dt.asarray(xf) is xf, "asarray of a DistArray is the array itself")


def test_constants_and_dtypes(comm):
    for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64", "float16", "float32", "float64", "complex64", "complex128", "intp",
                 "e", "pi", "inf", "newaxis"):
        v = getattr(dt, name)
        assert v is getattr(np, name) or v == getattr(np, name), name
    assert np.isnan(dt.nan)
    assert dt.zeros(3, dtype=dt.float32).dtype == np.float32
    x = dt.asarray([[1, 2], [3, 4]])
    assert x.dtype == np.asarray([[1, 2], [3, 4]]).dtype and x.shape == (2, 2)
    assert x[dt.newaxis].shape == (1, 2, 2)
    assert_raises_all(comm, ValueError, "either both or neither", lambda: dt.where(x > 1, x))
    assert_raises_all(comm, ValueError, "always copied", lambda: dt.asarray([1], copy=False))


def test_random_size(comm):
    for draw in (lambda g, kw: g.random(**kw), lambda g, kw: g.uniform(-1, 2, **kw),
                 lambda g, kw: g.normal(1.0, 3.0, **kw), lambda g, kw: g.integers(7, **kw)):
        a = draw(dt.random.default_rng(5), {"size": (4, 3)})
        b = draw(dt.random.default_rng(5), {"shape": (4, 3)})
        assert a.shape == (4, 3)
        np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
        c = draw(dt.random.default_rng(5), {"size": 6})
        assert c.shape == (6,)
        assert draw(dt.random.default_rng(5), {}).shape == ()
    g = dt.random.default_rng(1)
    assert g.uniform(0, 1, 5).shape == (5,)  # size is NumPy's third positional parameter
    assert_raises_all(comm, TypeError, "both 'size' and 'shape'",
                      lambda: g.random(size=3, shape=3))
