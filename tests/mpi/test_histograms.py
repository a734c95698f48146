"""Histograms against NumPy: ``histogram`` (automatic and given ranges, explicit edges,
weights, density), ``histogram_bin_edges``, ``histogram2d``, ``histogramdd``, ``bincount``
(weights, minlength) and ``digitize``, as ``dt.*`` and through ``np.*``, on 1-D and 2-D grids
with uneven and empty blocks; the results are DistArrays cut into balanced blocks over grid
axis 0; bad input raises NumPy's errors on every rank."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from checks import SIZE, examples, dist, expect, collective_checks, check_blocks as check
from checks import last_rank_only, mismatch
from conftest import assert_raises_all
from disttensor.testing.strategies import layouts, shapes

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's empty density


def spread_layout(x, n_or_shape):
    """The layout the module docstring promises: axis 0 balanced over grid axis 0."""
    shape = (n_or_shape,) if isinstance(n_or_shape, int) else tuple(n_or_shape)
    return (x.grid.dims, (0,) + (None,) * (len(shape) - 1), None)


@settings(max_examples=examples(6), deadline=None)
@given(sl=layouts(shapes(1, 3, 6), SIZE, 2), seed=st.integers(0, 2**16),
       bins=st.integers(1, 6), via=st.sampled_from(["dt", "np"]), data=st.data())
@collective_checks
def test_histogram(sl, seed, bins, via, data):
    shape, layout = sl
    rng = np.random.default_rng(seed)
    a = rng.normal(size=shape).astype(data.draw(st.sampled_from(["float64", "float32"])))
    w = rng.random(shape)
    x, wx = dist(a, layout), dist(w, data.draw(layouts(shape, SIZE, 2)))
    f = dt if via == "dt" else np
    h, e = f.histogram(x, bins=bins)
    hn, en = np.histogram(a, bins=bins)
    check(h, hn, "histogram", layout=spread_layout(x, hn.shape))
    check(e, en, "edges", layout=spread_layout(x, en.shape))
    h, e = f.histogram(x, bins=bins, range=(-1, 1), weights=wx, density=True)
    hn, en = np.histogram(a, bins=bins, range=(-1, 1), weights=w, density=True)
    check(h, hn, "weighted density", rtol=1e-12, atol=1e-12)
    edges = np.array([-3.0, -0.5, 0.0, 0.1, 2.0])
    check(f.histogram(x, bins=edges)[0], np.histogram(a, bins=edges)[0], "explicit edges")
    check(f.histogram_bin_edges(x, bins=bins), np.histogram_bin_edges(a, bins=bins),
          "histogram_bin_edges")
    check(f.digitize(x, edges), np.digitize(a, edges).astype(np.int64), "digitize",
          layout=layout)
    check(f.digitize(x, edges[::-1], right=True),
          np.digitize(a, edges[::-1], right=True).astype(np.int64), "digitize right")


@settings(max_examples=examples(6), deadline=None)
@given(n=st.integers(0, 9), seed=st.integers(0, 2**16), via=st.sampled_from(["dt", "np"]),
       data=st.data())
@collective_checks
def test_histogram2d_dd_bincount(n, seed, via, data):
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(n, 3))
    w = rng.random(n)
    layout = data.draw(layouts((n, 3), SIZE, 2))
    xs, ws = dist(s, layout), dist(w, data.draw(layouts((n,), SIZE, 2)))
    xcol, ycol = xs[:, 0], xs[:, 1]
    f = dt if via == "dt" else np
    bins = data.draw(st.sampled_from([3, (2, 4), [np.array([-2.0, 0, 1]), 2]]))
    h, ex, ey = f.histogram2d(xcol, ycol, bins=bins, weights=ws)
    hn, exn, eyn = np.histogram2d(s[:, 0], s[:, 1], bins=bins, weights=w)
    check(h, hn, "histogram2d", rtol=1e-12, layout=spread_layout(h, hn.shape))
    check(ex, exn, "xedges")
    check(ey, eyn, "yedges")
    if n:
        h, es = f.histogramdd(xs, bins=(2, 3, 1), density=True)
        hn, esn = np.histogramdd(s, bins=(2, 3, 1), density=True)
        check(h, hn, "histogramdd density", rtol=1e-12)
        for k in range(3):
            check(es[k], esn[k], f"histogramdd edges {k}")
        h, es = f.histogramdd([xcol, ycol], bins=4, range=[(-1, 1), (0, 2)])
        check(h, np.histogramdd(s[:, :2], bins=4, range=[(-1, 1), (0, 2)])[0], "dd seq")
    ci = rng.integers(0, 7, n)
    cx = dist(ci, data.draw(layouts((n,), SIZE, 2)))
    bc = np.bincount(ci, minlength=3)
    check(f.bincount(cx, minlength=3), bc, "bincount", layout=spread_layout(cx, bc.shape))
    check(f.bincount(cx, weights=ws, minlength=9),
          np.bincount(ci, weights=w, minlength=9).astype(np.float64), "bincount weights",
          rtol=1e-12)


def test_bad_input(comm):
    x = dt.from_global(np.arange(6.0))
    i = dt.from_global(np.array([0, 2, 1]))
    assert_raises_all(comm, ValueError, "negative",
                      lambda: dt.bincount(dt.from_global(np.array([0, -1, 2]))))
    assert_raises_all(comm, TypeError, "Cannot cast", lambda: dt.bincount(x))
    assert_raises_all(comm, ValueError, "same length",
                      lambda: dt.bincount(i, weights=x))
    assert_raises_all(comm, ValueError, "'minlength' must not be negative",
                      lambda: dt.bincount(i, minlength=-1))
    assert_raises_all(comm, ValueError, "not finite",
                      lambda: dt.histogram(dt.from_global(np.array([0.0, np.nan]))))
    assert_raises_all(comm, ValueError, "monotonically", lambda: dt.digitize(x, [3, 1, 2]))
    assert_raises_all(comm, TypeError, "complex",
                      lambda: dt.digitize(x.astype(complex), [1, 2]))
    assert_raises_all(comm, ValueError, "same length",
                      lambda: dt.histogram2d(x, x[:3]))
    assert_raises_all(comm, TypeError, "string bin", lambda: dt.histogram(x, bins="auto"))
    if SIZE > 1:
        with mismatch("histogram", "bins"):
            dt.histogram(x, bins=last_rank_only(3, 4))
