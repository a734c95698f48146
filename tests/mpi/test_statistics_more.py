"""``average``, ``cov``, ``corrcoef`` and ``ptp`` against NumPy (float64 reference) on random
shapes, 1-D and 2-D grids, uneven and empty blocks, as ``dt.*`` and through ``np.*``; weights
as DistArrays of another layout and as NumPy arrays; cov/corrcoef replicated results; bad
input with NumPy's errors on every rank."""
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

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
TOL = dict(rtol=1e-10, atol=1e-12)


@settings(max_examples=examples(8), deadline=None)
@given(sl=layouts(shapes(1, 3, 5), SIZE, 2), seed=st.integers(0, 2**16),
       keepdims=st.booleans(), via=st.sampled_from(["dt", "np"]), data=st.data())
@collective_checks
def test_average_ptp(sl, seed, keepdims, via, data):
    shape, layout = sl
    rng = np.random.default_rng(seed)
    a = rng.normal(size=shape)
    ai = rng.integers(-5, 5, size=shape)
    x, xi = dist(a, layout), dist(ai, layout)
    f = dt if via == "dt" else np
    nd = len(shape)
    axis = data.draw(st.sampled_from([None] + list(range(-nd, nd))))
    if a.size:
        check(f.average(x, axis=axis, keepdims=keepdims),
              np.average(a, axis=axis, keepdims=keepdims), "average", **TOL)
        check(f.average(xi, axis=axis), np.average(ai, axis=axis), "average int", **TOL)
    w = rng.random(shape) + 0.1
    wx = dist(w, data.draw(layouts(shape, SIZE, 2)))
    if a.size:
        got = f.average(x, axis=axis, weights=wx, returned=True, keepdims=keepdims)
        want = np.average(a, axis=axis, weights=w, returned=True, keepdims=keepdims)
        check(got[0], want[0], "weighted", **TOL)
        check(got[1], want[1], "sum of weights", **TOL)
    if axis is not None and shape[axis]:
        w1 = rng.random(shape[axis]) + 0.1
        check(f.average(x, axis=axis, weights=w1), np.average(a, axis=axis, weights=w1),
              "1-D weights", **TOL)
        w1x = dist(w1, data.draw(layouts(w1.shape, SIZE, 2)))
        check(f.average(x, axis=axis, weights=w1x), np.average(a, axis=axis, weights=w1),
              "1-D DistArray weights", **TOL)
    if all(shape[t] for t in ([axis] if axis is not None else range(nd))):
        check(f.ptp(x, axis=axis, keepdims=keepdims),
              np.ptp(a, axis=axis, keepdims=keepdims), "ptp")
        check(f.ptp(xi, axis=axis), np.ptp(ai, axis=axis), "ptp int")


@settings(max_examples=examples(8), deadline=None)
@given(nobs=st.integers(1, 9), nvar=st.integers(1, 4), seed=st.integers(0, 2**16),
       rowvar=st.booleans(), via=st.sampled_from(["dt", "np"]), data=st.data())
@collective_checks
def test_cov_corrcoef(nobs, nvar, seed, rowvar, via, data):
    rng = np.random.default_rng(seed)
    shape = (nvar, nobs) if rowvar else (nobs, nvar)
    a = rng.normal(size=shape)
    x = dist(a, data.draw(layouts(shape, SIZE, 2)))
    f = dt if via == "dt" else np
    rep = lambda want: (x.grid.dims, (None,) * np.ndim(want), None)  # noqa: E731
    want = np.cov(a, rowvar=rowvar)
    check(f.cov(x, rowvar=rowvar), want, "cov", layout=rep(want), **TOL)
    check(f.cov(x, rowvar=rowvar, bias=True), np.cov(a, rowvar=rowvar, bias=True), "bias",
          **TOL)
    fw = rng.integers(0, 3, nobs)
    fw[0] = 1  # (weights summing to zero: test_bad_input)
    aw = rng.random(nobs) + 0.1
    fwx = dist(fw, data.draw(layouts((nobs,), SIZE, 2)))
    ddof = data.draw(st.sampled_from([None, 0, 1, 2]))
    check(f.cov(x, rowvar=rowvar, fweights=fwx, aweights=aw, ddof=ddof),
          np.cov(a, rowvar=rowvar, fweights=fw, aweights=aw, ddof=ddof), "weighted cov",
          **TOL)
    b = rng.normal(size=nobs)
    y = dist(b, data.draw(layouts((nobs,), SIZE, 2)))
    check(f.cov(x, y, rowvar=rowvar), np.cov(a, b, rowvar=rowvar), "cov(x, y)", **TOL)
    check(f.cov(y), np.cov(b), "cov 1-D (0-d result)", **TOL)
    check(f.corrcoef(x, rowvar=rowvar), np.corrcoef(a, rowvar=rowvar), "corrcoef", **TOL)
    check(f.corrcoef(y, x[0] if rowvar else x[:, 0]),
          np.corrcoef(b, a[0] if rowvar else a[:, 0]), "corrcoef(x, y)", **TOL)


def test_bad_input(comm):
    x = dt.from_global(np.arange(12.0).reshape(3, 4))
    assert_raises_all(comm, TypeError, "Axis must be specified",
                      lambda: dt.average(x, weights=np.ones(4)))
    assert_raises_all(comm, ValueError, "Length of weights not compatible",
                      lambda: dt.average(x, axis=0, weights=np.ones(4)))
    assert_raises_all(comm, TypeError, "1D weights expected",
                      lambda: dt.average(x, axis=0, weights=np.ones((1, 4))))
    assert_raises_all(comm, ZeroDivisionError, "Weights sum to zero",
                      lambda: dt.average(x, axis=0, weights=np.zeros(3)))
    assert_raises_all(comm, TypeError, "boolean subtract", lambda: dt.ptp(x > 3))
    assert_raises_all(comm, ValueError, "more than 2 dimensions",
                      lambda: dt.cov(dt.zeros((2, 2, 2))))
    assert_raises_all(comm, TypeError, "fweights must be integer",
                      lambda: dt.cov(x, fweights=np.ones(4)))
    assert_raises_all(comm, RuntimeError, "incompatible numbers of samples and aweights",
                      lambda: dt.cov(x, aweights=np.ones(3)))
    assert_raises_all(comm, ValueError, "fweights cannot be negative",
                      lambda: dt.cov(x, fweights=dt.from_global(np.array([1, 1, -1, 1]))))
    assert_raises_all(comm, ZeroDivisionError, "Weights sum to zero",
                      lambda: dt.cov(x, fweights=np.zeros(4, int)))
    if SIZE > 1:
        with mismatch("cov", "rowvar"):
            dt.cov(x, rowvar=last_rank_only(False, True))
