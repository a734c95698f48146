"""CPU local pooling kernels (disttensor.ops.local.cpu.pool) against the serial float64
reference (tests/reference.py) and, for the cases the reference does not cover (windows made
only of padding, empty inputs), against a brute-force loop per output cell written here."""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from disttensor.ops.local.cpu.pool import (argmax_dtype, pool_backward, pool_forward,
                                           pool_output_shape)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reference as ref  # noqa: E402

DTYPES = (np.float32, np.float64)
RTOL = {np.float32: 2e-6, np.float64: 1e-12}
FAST = settings(max_examples=80, deadline=None)


def _pads(lo, hi):
    return tuple(zip(lo, hi))


def naive_pool(x, mode, k, s, lo, hi, cip):
    """One loop per output cell, float64; the kernel module's documented contract including
    all-padding windows (max: -inf at position 0; avg: 0)."""
    x = np.asarray(x, np.float64)
    out = pool_output_shape(x.shape[2:], k, s, lo, hi)
    y = np.zeros(x.shape[:2] + out)
    am = np.zeros(x.shape[:2] + out, np.int64)
    for n, c in itertools.product(*map(range, x.shape[:2])):
        for o in itertools.product(*map(range, out)):
            cells = []                         # (window position, value) of real cells
            for t, kk in enumerate(itertools.product(*map(range, k))):
                i = tuple(oo * ss - ll + q for oo, ss, ll, q in zip(o, s, lo, kk))
                if all(0 <= a < b for a, b in zip(i, x.shape[2:])):
                    cells.append((t, x[(n, c) + i]))
            if mode == "max":
                if not cells:
                    y[(n, c) + o], am[(n, c) + o] = -np.inf, 0
                    continue
                vals = np.array([v for _, v in cells])
                j = int(np.argmax(vals))          # np.argmax: first NaN, else first max
                y[(n, c) + o], am[(n, c) + o] = vals[j], cells[j][0]
            else:
                div = np.prod(k) if cip else len(cells)
                y[(n, c) + o] = sum(v for _, v in cells) / div if cells else 0.0
    return y, am


# --------------------------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------------------------

@st.composite
def pool_case(draw, wide_pad=False):
    k = tuple(draw(st.integers(1, 3)) for _ in range(3))
    s = tuple(draw(st.integers(1, 3)) for _ in range(3))
    pmax = (lambda kk: kk + 1) if wide_pad else (lambda kk: kk - 1)
    lo = tuple(draw(st.integers(0, pmax(kk))) for kk in k)
    hi = tuple(draw(st.integers(0, pmax(kk))) for kk in k)
    sp = tuple(draw(st.integers(1, 6)) for _ in range(3))
    out = pool_output_shape(sp, k, s, lo, hi)
    assume(min(out) >= 1)
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["normal", "ties", "nan"]))
    if kind == "normal":
        x = rng.standard_normal((n, c) + sp)
    else:                                      # small integers: many ties in every window
        x = rng.integers(-2, 3, (n, c) + sp).astype(np.float64)
        if kind == "nan":
            x[rng.random(x.shape) < 0.15] = np.nan
    dy = rng.standard_normal((n, c) + out)
    return x.astype(dtype), dy.astype(dtype), k, s, lo, hi


def _close(a, b, dtype):
    np.testing.assert_allclose(a, b, rtol=RTOL[dtype], atol=RTOL[dtype], equal_nan=True)


# --------------------------------------------------------------------------------------------
# forward and backward against the reference
# --------------------------------------------------------------------------------------------

@FAST
@given(pool_case(), st.booleans())
def test_max_pool_matches_reference(case, cip):
    x, dy, k, s, lo, hi = case
    y, am = pool_forward(x, "max", k, s, lo, hi, cip)
    assert y.dtype == x.dtype and am.dtype == argmax_dtype(k) and y.shape == dy.shape
    assert am.dtype == (np.uint8 if np.prod(k) <= 256 else np.int32)
    np.testing.assert_array_equal(y, ref.pool(x, "max", k, s, _pads(lo, hi)).astype(x.dtype))
    _, am_naive = naive_pool(x, "max", k, s, lo, hi, cip)
    np.testing.assert_array_equal(am, am_naive)
    dx = pool_backward(dy, am, "max", x.shape[2:], k, s, lo, hi, cip)
    assert dx.dtype == dy.dtype and dx.shape == x.shape
    _close(dx, ref.pool_backward(x, dy, "max", k, s, _pads(lo, hi)), x.dtype.type)


@FAST
@given(pool_case(), st.booleans())
def test_avg_pool_matches_reference(case, cip):
    x, dy, k, s, lo, hi = case
    x = np.nan_to_num(x)                       # NaNs only matter for max
    y, am = pool_forward(x, "avg", k, s, lo, hi, cip)
    assert am is None and y.dtype == x.dtype and y.shape == dy.shape
    _close(y, ref.pool(x, "avg", k, s, _pads(lo, hi), cip), x.dtype.type)
    dx = pool_backward(dy, None, "avg", x.shape[2:], k, s, lo, hi, cip)
    assert dx.dtype == dy.dtype and dx.shape == x.shape
    _close(dx, ref.pool_backward(x, dy, "avg", k, s, _pads(lo, hi), cip), x.dtype.type)


@FAST
@given(pool_case(wide_pad=True), st.sampled_from(["max", "avg"]), st.booleans())
def test_wide_padding_matches_naive(case, mode, cip):
    """Pads up to k+1: some windows hold no real cell at all."""
    x, dy, k, s, lo, hi = case
    y, am = pool_forward(x, mode, k, s, lo, hi, cip)
    y_naive, am_naive = naive_pool(x, mode, k, s, lo, hi, cip)
    _close(y, y_naive, x.dtype.type)
    if mode == "max":
        np.testing.assert_array_equal(am, am_naive)
    # adjoint of the forward (max: of "pick the argmax cell"), on NaN-free data
    x = np.nan_to_num(x)
    y, am = pool_forward(x, mode, k, s, lo, hi, cip)
    dx = pool_backward(dy, am, mode, x.shape[2:], k, s, lo, hi, cip)
    finite = np.isfinite(y)                    # all-padding max windows are -inf
    lhs = float(np.sum(np.where(finite, y, 0).astype(np.float64) * dy))
    rhs = float(np.sum(x.astype(np.float64) * dx))
    assert lhs == pytest.approx(rhs, rel=1e-5, abs=1e-5)


# --------------------------------------------------------------------------------------------
# adjoint identities in float64
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("cip", [True, False])
@pytest.mark.parametrize("k,s,lo,hi", [
    ((2, 2, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0)),      # non-overlapping (scatter path)
    ((3, 2, 1), (3, 3, 2), (1, 0, 0), (2, 1, 0)),      # stride > kernel, asymmetric padding
    ((3, 3, 3), (1, 2, 1), (1, 0, 2), (0, 2, 1)),      # overlapping (gather path)
    ((2, 3, 2), (1, 1, 3), (1, 2, 0), (0, 1, 1)),
])
def test_adjoint(mode, cip, k, s, lo, hi):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 7, 6, 9))
    y, am = pool_forward(x, mode, k, s, lo, hi, cip)
    dy = rng.standard_normal(y.shape)
    dx = pool_backward(dy, am, mode, x.shape[2:], k, s, lo, hi, cip)
    lhs, rhs = np.vdot(y, dy), np.vdot(x, dx)
    assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs))


def test_scatter_path_float32():
    """stride == kernel (the scatter path of the backward) with asymmetric padding and
    float32, against the reference."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 2, 5, 7, 6)).astype(np.float32)
    k = s = (2, 3, 2)
    lo, hi = (1, 0, 1), (0, 2, 1)
    for mode in ("max", "avg"):
        y, am = pool_forward(x, mode, k, s, lo, hi, False)
        dy = rng.standard_normal(y.shape).astype(np.float32)
        dx = pool_backward(dy, am, mode, x.shape[2:], k, s, lo, hi, False)
        _close(dx, ref.pool_backward(x, dy, mode, k, s, _pads(lo, hi), False), np.float32)


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("k,s,lo,hi", [
    ((2, 2, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0)),      # trailing cells in no window
    ((2, 1, 2), (3, 2, 3), (1, 0, 0), (0, 1, 0)),      # gaps between windows, padding
])
def test_scatter_path_zeroes_recycled_buffer(mode, k, s, lo, hi):
    """The scatter paths (the general one, and 2x2x2 max windows at stride 2) write dx into a
    recycled pool buffer without a separate zero pass: cells in no window (gaps, trailing
    cells on every axis) must still come out zero when the buffer last held NaN."""
    from disttensor.core import buffer_pool
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 7, 5, 9))     # odd: cells past the last window
    y, am = pool_forward(x, mode, k, s, lo, hi, True)
    dy = rng.standard_normal(y.shape)
    for _ in range(3):                       # leave NaN in the buffers dx may be given
        junk = buffer_pool.empty(x.shape, x.dtype)
        junk.fill(np.nan)
        del junk
    dx = pool_backward(dy, am, mode, x.shape[2:], k, s, lo, hi, True)
    _close(dx, ref.pool_backward(x, dy, mode, k, s, _pads(lo, hi), True), np.float64)


# --------------------------------------------------------------------------------------------
# max-pool tie and NaN rules
# --------------------------------------------------------------------------------------------

def _one_window(vals, dtype=np.float64):
    """A (1, 1, 2, 2, 2) input that is exactly one 2x2x2 window."""
    return np.asarray(vals, dtype=dtype).reshape(1, 1, 2, 2, 2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vals,value,pos", [
    ([1, 5, 5, 0, 5, 2, 3, 4], 5, 1),                          # first maximum wins
    ([1, np.nan, 9, np.nan, 0, 0, 0, 0], np.nan, 1),           # first NaN wins over larger
    ([1, 2, 3, 4, 5, 6, 7, np.nan], np.nan, 7),                # a late NaN still wins
    ([-np.inf] * 8, -np.inf, 0),                               # all -inf: first cell
    ([-np.inf, -np.inf, -3, -np.inf, 0, 0, 0, 0], 0, 4),
])
def test_max_ties_and_nan(dtype, vals, value, pos):
    x = _one_window(vals, dtype)
    y, am = pool_forward(x, "max", (2, 2, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0))
    np.testing.assert_array_equal(y.ravel(), np.array([value], dtype))
    assert am.ravel().tolist() == [pos]
    dx = pool_backward(np.full(y.shape, 3.0, dtype), am, "max", x.shape[2:], (2, 2, 2),
                       (2, 2, 2), (0, 0, 0), (0, 0, 0))
    expect = np.zeros(8, dtype)
    expect[pos] = 3.0
    np.testing.assert_array_equal(dx.ravel(), expect)


def test_real_minus_inf_beats_padding():
    """Padding acts as -inf but a real -inf cell wins the tie and gets the gradient."""
    x = np.full((1, 1, 1, 1, 2), -np.inf, np.float32)
    y, am = pool_forward(x, "max", (1, 1, 3), (1, 1, 1), (0, 0, 1), (0, 0, 1))
    assert y.ravel().tolist() == [-np.inf, -np.inf]
    assert am.ravel().tolist() == [1, 0]                 # window 0: pad, x0, x1 -> x0
    dx = pool_backward(np.array([1.0, 2.0], np.float32).reshape(y.shape), am, "max",
                       (1, 1, 2), (1, 1, 3), (1, 1, 1), (0, 0, 1), (0, 0, 1))
    assert dx.ravel().tolist() == [3.0, 0.0]


def test_all_padding_window():
    x = np.arange(2.0).reshape(1, 1, 1, 1, 2)
    # W: pad 3 below, kernel 2, stride 2 -> windows [-3,-2], [-1,0], [1,2]
    y, am = pool_forward(x, "max", (1, 1, 2), (1, 1, 2), (0, 0, 3), (0, 0, 1))
    assert y.ravel().tolist() == [-np.inf, 0.0, 1.0]
    assert am.ravel().tolist() == [0, 1, 0]
    dx = pool_backward(np.ones(y.shape), am, "max", (1, 1, 2), (1, 1, 2), (1, 1, 2),
                       (0, 0, 3), (0, 0, 1))
    assert dx.ravel().tolist() == [1.0, 1.0]
    for cip, expect in ((True, [0.0, 0.0, 0.5]), (False, [0.0, 0.0, 1.0])):
        y, am = pool_forward(x, "avg", (1, 1, 2), (1, 1, 2), (0, 0, 3), (0, 0, 1), cip)
        assert am is None and y.ravel().tolist() == expect


def test_avg_divisor():
    x = np.ones((1, 1, 3, 3, 3))
    y_inc, _ = pool_forward(x, "avg", (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), True)
    y_exc, _ = pool_forward(x, "avg", (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), False)
    assert y_inc[0, 0, 0, 0, 0] == pytest.approx(8 / 27)
    assert y_inc[0, 0, 1, 1, 1] == 1.0
    np.testing.assert_array_equal(y_exc, 1.0)


# --------------------------------------------------------------------------------------------
# shapes, layouts, errors
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("shape,k,s,lo,hi,out", [
    ((0, 3, 4, 4, 4), (2, 2, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0), (2, 2, 2)),   # N = 0
    ((2, 0, 4, 4, 4), (2, 2, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0), (2, 2, 2)),   # C = 0
    ((2, 3, 0, 4, 4), (2, 2, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0), (0, 2, 2)),   # D = 0
    ((2, 3, 0, 4, 4), (2, 2, 2), (1, 2, 2), (1, 0, 0), (1, 0, 0), (1, 2, 2)),   # D = 0, padded
    ((1, 2, 1, 3, 3), (2, 4, 2), (1, 1, 1), (0, 0, 0), (0, 0, 0), (0, 0, 2)),   # kernel > extent
    ((1, 2, 3, 3, 3), (2, 2, 2), (2, 2, 2), (1, 1, 1), (1, 1, 1), (2, 2, 2)),   # padded, s = k
])
def test_empty_and_degenerate(dtype, mode, shape, k, s, lo, hi, out):
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    y, am = pool_forward(x, mode, k, s, lo, hi)
    assert y.shape == shape[:2] + out and y.dtype == dtype
    dy = np.ones(y.shape, dtype)
    dx = pool_backward(dy, am, mode, shape[2:], k, s, lo, hi)
    assert dx.shape == shape and dx.dtype == dtype
    if y.size and x.size == 0:
        assert (y == (-np.inf if mode == "max" else 0.0)).all()
        if mode == "max":
            assert (am == 0).all()
    if y.size == 0 or x.size == 0:
        assert not dx.any()
    # overlapping-window (gather) path with the same degenerate extents
    y2, am2 = pool_forward(x, mode, (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 0, 1))
    dx2 = pool_backward(np.ones(y2.shape, dtype), am2, mode, shape[2:], (3, 3, 3), (1, 1, 1),
                        (1, 1, 1), (1, 0, 1))
    assert dx2.shape == shape


def test_non_contiguous_input():
    rng = np.random.default_rng(1)
    base = rng.standard_normal((3, 2, 6, 5, 8)).astype(np.float32)
    x = base.transpose(1, 0, 2, 4, 3)[:, :, ::2]          # (2, 3, 3, 8, 5), strided view
    for mode in ("max", "avg"):
        y, am = pool_forward(x, mode, (2, 3, 2), (1, 2, 2), (1, 1, 0), (0, 1, 1))
        y2, am2 = pool_forward(np.ascontiguousarray(x), mode, (2, 3, 2), (1, 2, 2), (1, 1, 0),
                               (0, 1, 1))
        np.testing.assert_array_equal(y, y2)
        dy = rng.standard_normal(y.shape).astype(np.float32)
        dyt = np.asfortranarray(dy)
        dx = pool_backward(dyt, am2 if am2 is None else np.asfortranarray(am2), mode,
                           x.shape[2:], (2, 3, 2), (1, 2, 2), (1, 1, 0), (0, 1, 1))
        dx2 = pool_backward(dy, am2, mode, x.shape[2:], (2, 3, 2), (1, 2, 2), (1, 1, 0),
                            (0, 1, 1))
        np.testing.assert_array_equal(dx, dx2)


def test_errors():
    x = np.zeros((1, 1, 4, 4, 4), np.float32)
    args = ((2, 2, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0))
    with pytest.raises(ValueError, match="mode"):
        pool_forward(x, "min", *args)
    with pytest.raises(ValueError):
        pool_forward(x[0], "max", *args)
    with pytest.raises(TypeError):
        pool_forward(x.astype(np.int32), "max", *args)
    with pytest.raises(ValueError):
        pool_forward(x, "max", (2, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0))
    with pytest.raises(ValueError):
        pool_forward(x, "max", (2, 0, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0))
    with pytest.raises(ValueError):
        pool_forward(x, "max", (2, 2, 2), (2, 2, 2), (0, -1, 0), (0, 0, 0))
    y, am = pool_forward(x, "max", *args)
    with pytest.raises(ValueError, match="does not match"):
        pool_backward(y, am, "max", (5, 4, 3), *args)
    with pytest.raises(ValueError, match="argmax"):
        pool_backward(y, None, "max", (4, 4, 4), *args)
    with pytest.raises(ValueError, match="argmax"):
        pool_backward(y, am[:, :, :1], "max", (4, 4, 4), *args)
