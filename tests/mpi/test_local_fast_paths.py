"""The NumPy-speed paths of the sorting family against NumPy: roll along axes every rank holds
whole (no messages) mixed with split ones; quantiles on whole lines, on redistributed lines and
by the sampled selection of order statistics (disttensor.routines.order_statistics: arrays
long enough that the sample is strided, sorted and heavily tied data, NaNs, uneven and empty
blocks); unique's local-unique-then-merge path on data with many repeats.  Exact comparisons
(quantiles to 1e-12 relative, dtypes NumPy's)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from checks import SIZE, check_blocks as check, collective_checks, dist, examples, expect
from disttensor.testing.strategies import layouts, shapes

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
METHODS = ("linear", "lower", "higher", "nearest", "midpoint")


@settings(max_examples=examples(30))
@given(shape=shapes(1, 3, max_side=6), data_=st.data(), seed=st.integers(0, 2**16))
@collective_checks
def test_roll(shape, data_, seed):
    layout = data_.draw(layouts(shape, SIZE, 2))
    a = np.random.default_rng(seed).normal(size=shape)
    x = dist(a, layout)
    nd = len(shape)
    axes = data_.draw(st.lists(st.integers(-nd, nd - 1), min_size=1, max_size=3))
    shifts = data_.draw(st.lists(st.integers(-9, 9), min_size=len(axes), max_size=len(axes)))
    check(dt.roll(x, tuple(shifts), axis=tuple(axes)), np.roll(a, shifts, axis=axes),
          f"roll {shifts} {axes}", layout=layout)
    check(np.roll(x, shifts[0], axis=axes[0]), np.roll(a, shifts[0], axis=axes[0]), "np.roll",
          layout=layout)
    check(dt.roll(x, shifts[0]), np.roll(a, shifts[0]), "roll axis=None", layout=layout)


def _long(kind: str, n: int, rng) -> np.ndarray:
    if kind == "random":
        return rng.normal(size=n)
    if kind == "sorted":
        return np.sort(rng.normal(size=n))
    if kind == "reversed":
        return np.sort(rng.normal(size=n))[::-1].copy()
    if kind == "ties":
        return rng.integers(0, 3, n).astype(np.float64)
    if kind == "int":
        return rng.integers(-50, 50, n).astype(np.int32)
    a = rng.normal(size=n).astype(np.float32)  # "nans"
    a[rng.integers(0, n, n // 7)] = np.nan
    return a


@settings(max_examples=examples(10))
@given(n=st.sampled_from([1, 2, 3, 4100, 20011]), data_=st.data(), seed=st.integers(0, 2**16),
       kind=st.sampled_from(["random", "sorted", "reversed", "ties", "int", "nans"]))
@collective_checks
def test_selection_quantiles(n, data_, seed, kind):
    """1-D split arrays long enough for a strided sample: every method, vector and scalar q,
    median, and the nan forms."""
    layout = data_.draw(layouts((n,), SIZE, 1))
    a = _long(kind, n, np.random.default_rng(seed))
    x = dist(a, layout)
    for method in METHODS:
        for q in (0.5, [0.0, 0.001, 0.37, 0.999, 1.0]):
            check(dt.quantile(x, q, method=method), np.quantile(a, q, method=method),
                  f"quantile {method} {q}", rtol=1e-12, atol=0)
            check(dt.nanquantile(x, q, method=method), np.nanquantile(a, q, method=method),
                  f"nanquantile {method} {q}", rtol=1e-12, atol=0)
    check(dt.percentile(x, [12.5, 50], keepdims=True),
          np.percentile(a, [12.5, 50], keepdims=True), "percentile keepdims", rtol=1e-12)
    check(dt.median(x), np.median(a), "median", rtol=1e-12)
    check(dt.nanmedian(x), np.nanmedian(a), "nanmedian", rtol=1e-12)


@settings(max_examples=examples(12))
@given(shape=shapes(2, 3, max_side=6, min_side=1), data_=st.data(), seed=st.integers(0, 2**16),
       keepdims=st.booleans())
@collective_checks
def test_quantile_lines(shape, data_, seed, keepdims):
    """Quantiles along each axis (whole, split: redistributed to whole lines) and of the
    flattened N-d array (the selection over every split grid axis), laid out like a reduction
    of ``x``."""
    layout = data_.draw(layouts(shape, SIZE, 2))
    a = np.random.default_rng(seed).normal(size=shape)
    x = dist(a, layout)
    for axis in [None] + list(range(len(shape))):
        for q in (0.3, [0.2, 0.9]):
            got = dt.quantile(x, q, axis=axis, keepdims=keepdims)
            check(got, np.quantile(a, q, axis=axis, keepdims=keepdims), f"axis {axis} q {q}",
                  rtol=1e-12, atol=1e-15)
            if axis is not None and np.ndim(q) == 0:
                r = dt.sum(x, axis=axis, keepdims=keepdims)
                expect(got.distribution == r.distribution,
                       f"quantile along {axis} is laid out like a reduction")
        check(dt.median(x, axis=axis, keepdims=keepdims),
              np.median(a, axis=axis, keepdims=keepdims), f"median axis {axis}", rtol=1e-12,
              atol=1e-15)


@settings(max_examples=examples(10))
@given(n=st.integers(0, 3000), data_=st.data(), seed=st.integers(0, 2**16),
       distinct=st.sampled_from([1, 5, 40, 10**6]), floats=st.booleans())
@collective_checks
def test_unique_merge(n, data_, seed, distinct, floats):
    """Many repeats per value (the local uniques are few), uneven and empty blocks."""
    layout = data_.draw(layouts((n,), SIZE, 2))
    rng = np.random.default_rng(seed)
    a = rng.integers(0, distinct, n)
    if floats:
        a = a / 3.0
        a[rng.integers(0, max(n, 1), n // 9)] = np.nan
    x = dist(a, layout)
    got = np.unique(x, return_index=True, return_inverse=True, return_counts=True)
    want = np.unique(a, return_index=True, return_inverse=True, return_counts=True)
    for name, g, w in zip(("values", "index", "inverse", "counts"), got, want):
        check(g, w if name == "values" else w.astype(np.int64), f"unique {name}")
    check(got[2], want[2].astype(np.int64), "inverse keeps x's layout", layout=layout)
    for name, g, w in zip(("values", "indices", "inverse", "counts"), dt.unique_all(x),
                          np.unique_all(a)):
        check(g, w if name == "values" else w.astype(np.int64), f"unique_all {name}")
