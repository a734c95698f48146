"""disttensor.ops.local.cpu.conv_direct: every algorithm and pass against a float64 NumPy
reference (strides, dilations, asymmetric and cropping padding, groups, odd sizes, several
channel blocks, reductions longer than one block, empty batches), the adjoint identities
linking the three passes, and the planner interface (supports, workspace_bytes)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from disttensor.ops.local.cpu import conv_direct as D

ALGOS = sorted(D.ALGORITHMS)
DIRECT = [a for a in ALGOS if a != "gemm1x1"]


def _supported(algo, ws, lo, hi):
    """Which cases an algorithm must take: gemm1x1 only 1x1x1 kernels without padding."""
    if algo == "gemm1x1":
        return tuple(ws[2:]) == (1, 1, 1) and not any(lo) and not any(hi)
    return True


# -- a float64 reference: one einsum per kernel offset ---------------------------------------
def _pad(x, lo, hi):
    """Zero-pad (positive) or crop (negative) the three spatial axes."""
    x = np.pad(x, ((0, 0), (0, 0)) + tuple((max(l, 0), max(h, 0)) for l, h in zip(lo, hi)))
    sl = tuple(slice(max(-l, 0), x.shape[2 + a] - max(-h, 0))
               for a, (l, h) in enumerate(zip(lo, hi)))
    return x[(slice(None), slice(None)) + sl]


def _out(in_sp, kernel, s, d, lo, hi):
    return tuple((n + l + h - dd * (k - 1) - 1) // ss + 1
                 for n, k, ss, dd, l, h in zip(in_sp, kernel, s, d, lo, hi))


def _window(k, s, d, o):
    return tuple(slice(kk * dd, kk * dd + (oo - 1) * ss + 1, ss)
                 for kk, ss, dd, oo in zip(k, s, d, o))


def ref_forward(x, w, s, d, lo, hi, g):
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, cin = x.shape[:2]
    cout, cg = w.shape[:2]
    cog = cout // g
    o = _out(x.shape[2:], w.shape[2:], s, d, lo, hi)
    xp = _pad(x, lo, hi)
    y = np.zeros((n, cout) + o)
    for k in itertools.product(*(range(kk) for kk in w.shape[2:])):
        patch = xp[(slice(None), slice(None)) + _window(k, s, d, o)]
        for gi in range(g):
            co, ci = slice(gi * cog, (gi + 1) * cog), slice(gi * cg, (gi + 1) * cg)
            y[:, co] += np.einsum("oc,ncdhw->nodhw", w[co, :][(Ellipsis,) + k], patch[:, ci])
    return y


def ref_backward_data(dy, w, in_sp, s, d, lo, hi, g):
    dy, w = dy.astype(np.float64), w.astype(np.float64)
    n, cout = dy.shape[:2]
    cg = w.shape[1]
    cog = cout // g
    o = dy.shape[2:]
    size = tuple(m + l + h for m, l, h in zip(in_sp, lo, hi))
    dxp = np.zeros((n, cg * g) + size)
    for k in itertools.product(*(range(kk) for kk in w.shape[2:])):
        win = (slice(None), slice(None)) + _window(k, s, d, o)
        for gi in range(g):
            co, ci = slice(gi * cog, (gi + 1) * cog), slice(gi * cg, (gi + 1) * cg)
            dxp[(slice(None), ci) + win[2:]] += np.einsum(
                "oc,nodhw->ncdhw", w[co, :][(Ellipsis,) + k], dy[:, co])
    return _pad(dxp, tuple(-l for l in lo), tuple(-h for h in hi))


def ref_backward_filter(x, dy, kernel, s, d, lo, hi, g):
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    cin = x.shape[1]
    cout = dy.shape[1]
    cg, cog = cin // g, cout // g
    o = dy.shape[2:]
    xp = _pad(x, lo, hi)
    dw = np.zeros((cout, cg) + tuple(kernel))
    for k in itertools.product(*(range(kk) for kk in kernel)):
        patch = xp[(slice(None), slice(None)) + _window(k, s, d, o)]
        for gi in range(g):
            co, ci = slice(gi * cog, (gi + 1) * cog), slice(gi * cg, (gi + 1) * cg)
            dw[(co, slice(None)) + k] = np.einsum("nodhw,ncdhw->oc", dy[:, co], patch[:, ci])
    return dw


def test_reference_matches_brute_force():
    """The einsum reference against one-cell-at-a-time loops (bounds checked, no padding)."""
    r = np.random.default_rng(5)
    x, w = r.standard_normal((1, 4, 5, 4, 6)), r.standard_normal((4, 2, 2, 3, 2))
    s, d, lo, hi, g = (2, 1, 1), (1, 1, 2), (1, 0, 2), (0, 2, 1), 2
    y = ref_forward(x, w, s, d, lo, hi, g)
    brute = np.zeros_like(y)
    for co, *o in itertools.product(range(4), *(range(m) for m in y.shape[2:])):
        gi = co // 2
        for c, *k in itertools.product(range(2), *(range(m) for m in w.shape[2:])):
            i = [oo * ss + kk * dd - ll for oo, ss, kk, dd, ll in zip(o, s, k, d, lo)]
            if all(0 <= ii < m for ii, m in zip(i, x.shape[2:])):
                brute[(0, co) + tuple(o)] += x[(0, gi * 2 + c) + tuple(i)] * w[(co, c) + tuple(k)]
    np.testing.assert_allclose(y, brute, rtol=1e-12, atol=1e-12)


# (x shape, w shape, stride, dilation, pad_lo, pad_hi, groups)
CASES = [
    ((2, 3, 5, 6, 7), (5, 3, 3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1),
    ((1, 6, 7, 8, 9), (4, 3, 3, 2, 3), (1, 2, 1), (1, 1, 2), (1, 0, 2), (0, 2, 1), 2),
    ((1, 4, 6, 6, 6), (6, 2, 3, 3, 3), (2, 1, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 2),
    ((1, 3, 5, 5, 5), (70, 3, 1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0), 1),
    ((2, 12, 5, 4, 6), (3, 12, 3, 3, 3), (1, 1, 1), (2, 1, 1), (2, 1, 1), (2, 1, 1), 1),
    ((1, 2, 9, 3, 11), (40, 2, 2, 1, 3), (3, 1, 2), (1, 1, 3), (0, 0, 3), (2, 0, 0), 1),
    ((1, 3, 6, 5, 4), (6, 1, 2, 2, 2), (2, 2, 2), (1, 1, 1), (0, 0, 0), (0, 0, 0), 3),
    ((2, 2, 5, 6, 5), (2, 2, 3, 3, 3), (1, 1, 1), (1, 1, 1), (-1, 0, 1), (1, -1, 0), 1),
    ((0, 4, 5, 5, 5), (8, 4, 3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1),
    ((1, 1, 4, 4, 4), (1, 1, 4, 4, 4), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0), 1),
    ((2, 6, 5, 7, 6), (8, 3, 1, 1, 1), (2, 1, 3), (1, 2, 1), (0, 0, 0), (0, 0, 0), 2),
    ((2, 64, 4, 5, 6), (3, 64, 1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0), 1),
]


def _tol(dtype):
    return 1e-10 if dtype == np.float64 else 2e-5


def _close(got, want, dtype):
    assert got.dtype == dtype
    assert got.shape == want.shape
    scale = max(np.abs(want).max(initial=0.0), 1e-300)
    err = np.abs(got.astype(np.float64) - want).max(initial=0.0) / scale
    assert err < _tol(dtype), err


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("algo", ALGOS)
def test_passes_match_reference(algo, case, dtype):
    xs, ws, s, d, lo, hi, g = case
    a = D.ALGORITHMS[algo]
    r = np.random.default_rng(hash((xs, ws)) % 2**32)
    x = r.standard_normal(xs).astype(dtype)
    w = r.standard_normal(ws).astype(dtype)
    if not _supported(algo, ws, lo, hi):
        for pass_ in ("forward", "backward_data", "backward_filter"):
            assert not a.supports(pass_, xs, ws, s, d, lo, hi, g, dtype)
        with pytest.raises(ValueError):
            a.forward(x, w, s, d, lo, hi, g)
        return
    for pass_ in ("forward", "backward_data", "backward_filter"):
        assert a.supports(pass_, xs, ws, s, d, lo, hi, g, dtype)
        assert a.workspace_bytes(pass_, xs, ws, s, d, lo, hi, g, dtype) > 0
    y = a.forward(x, w, s, d, lo, hi, g)
    _close(y, ref_forward(x, w, s, d, lo, hi, g), dtype)
    dy = r.standard_normal(y.shape).astype(dtype)
    _close(a.backward_data(dy, w, xs[2:], s, d, lo, hi, g),
           ref_backward_data(dy, w, xs[2:], s, d, lo, hi, g), dtype)
    _close(a.backward_filter(x, dy, ws[2:], s, d, lo, hi, g),
           ref_backward_filter(x, dy, ws[2:], s, d, lo, hi, g), dtype)


@pytest.mark.parametrize("algo", ALGOS)
def test_adjoint_identities(algo):
    """<conv(x, w), dy> = <x, backward_data(dy, w)> = <w, backward_filter(x, dy)>."""
    a = D.ALGORITHMS[algo]
    r = np.random.default_rng(11)
    s, d, lo, hi, g = (2, 1, 1), (1, 2, 1), (1, 2, 0), (0, 1, 2), 2
    x, w = r.standard_normal((2, 4, 7, 6, 5)), r.standard_normal((6, 2, 3, 2, 3))
    if algo == "gemm1x1":
        lo = hi = (0, 0, 0)
        w = r.standard_normal((6, 2, 1, 1, 1))
    y = a.forward(x, w, s, d, lo, hi, g)
    dy = r.standard_normal(y.shape)
    lhs = np.vdot(y, dy)
    assert abs(lhs - np.vdot(x, a.backward_data(dy, w, x.shape[2:], s, d, lo, hi, g))) \
        < 1e-10 * abs(lhs)
    assert abs(lhs - np.vdot(w, a.backward_filter(x, dy, w.shape[2:], s, d, lo, hi, g))) \
        < 1e-10 * abs(lhs)


@pytest.mark.parametrize("algo", ALGOS)
def test_mixed_dtypes_promote_and_float32_result(algo):
    a = D.ALGORITHMS[algo]
    r = np.random.default_rng(2)
    x = r.standard_normal((1, 2, 4, 4, 4)).astype(np.float32)
    w = r.standard_normal((3, 2, 3, 3, 3))
    one, zero = (1, 1, 1), (0, 0, 0)
    if algo == "gemm1x1":
        w = w[:, :, :1, :1, :1]
    assert a.forward(x, w, one, one, zero, zero).dtype == np.float64
    assert a.forward(x, w.astype(np.float32), one, one, zero, zero).dtype == np.float32
    with pytest.raises(TypeError):
        a.forward(x.astype(np.int32), w.astype(np.int32), one, one, zero, zero)


def test_gemm1x1_supports_only_unpadded_1x1():
    a = D.ALGORITHMS["gemm1x1"]
    one, zero = (1, 1, 1), (0, 0, 0)
    xs = (1, 4, 5, 5, 5)
    assert a.supports("forward", xs, (6, 2, 1, 1, 1), (2, 1, 1), one, zero, zero, 2,
                      np.float64)
    assert not a.supports("forward", xs, (6, 2, 1, 1, 1), one, one, one, zero, 2, np.float64)
    assert not a.supports("backward_data", xs, (6, 4, 3, 3, 3), one, one, zero, zero, 1,
                          np.float32)
    assert not a.supports("forward", xs, (6, 2, 1, 1, 1), one, one, zero, zero, 2, np.int32)
    with pytest.raises(ValueError):
        a.backward_filter(np.zeros(xs), np.zeros((1, 6, 5, 5, 5)), (1, 1, 1), one, one, one,
                          zero, 2)
    ws = a.workspace_bytes("forward", (2, 64, 8, 8, 8), (3, 64, 1, 1, 1), one, one, zero,
                           zero, 1, np.float32)
    assert ws >= 2 * 64 * 512 * 4


@pytest.mark.parametrize("algo", DIRECT)
def test_supports_false_and_errors(algo):
    a = D.ALGORITHMS[algo]
    one, zero = (1, 1, 1), (0, 0, 0)
    xs, ws = (1, 4, 5, 5, 5), (6, 2, 3, 3, 3)
    assert a.supports("forward", xs, ws, one, one, one, one, 2, np.float32)
    assert not a.supports("forward", xs, ws, one, one, one, one, 2, np.float16)
    assert not a.supports("forward", xs, ws, one, one, one, one, 2, np.int64)
    assert not a.supports("transpose", xs, ws, one, one, one, one, 2, np.float32)
    assert not a.supports("forward", xs, ws, one, one, one, one, 1, np.float32)  # cin mismatch
    assert not a.supports("forward", xs, (5, 2, 3, 3, 3), one, one, one, one, 2, np.float32)
    assert not a.supports("forward", xs, ws, one, (3, 1, 1), zero, zero, 2, np.float32)
    assert not a.supports("forward", xs, ws, (0, 1, 1), one, one, one, 2, np.float32)
    assert not a.supports("forward", (4, 5, 5, 5), ws, one, one, one, one, 2, np.float32)
    x = np.zeros(xs, np.float32)
    w = np.zeros(ws, np.float32)
    with pytest.raises(ValueError):
        a.forward(x, w, one, (3, 1, 1), zero, zero, 2)
    with pytest.raises(ValueError):
        a.backward_data(np.zeros((1, 6, 4, 5, 5), np.float32), w, xs[2:], one, one, one, one,
                        2)
    with pytest.raises(ValueError):
        a.backward_filter(x, np.zeros((1, 6, 4, 5, 5), np.float32), ws[2:], one, one, one,
                          one, 2)


@pytest.mark.parametrize("algo", DIRECT)
def test_workspace_grows_with_the_micro_batch(algo):
    a = D.ALGORITHMS[algo]
    one = (1, 1, 1)
    ws = (64, 32, 3, 3, 3)
    for pass_ in ("forward", "backward_data", "backward_filter"):
        b1 = a.workspace_bytes(pass_, (1, 32, 16, 16, 16), ws, one, one, one, one, 1,
                               np.float32)
        b4 = a.workspace_bytes(pass_, (4, 32, 16, 16, 16), ws, one, one, one, one, 1,
                               np.float32)
        # at least the padded operand: 18^3 * 32 (or 64) channels * 4 bytes per sample
        assert b1 >= 18 ** 3 * 32 * 4
        assert b4 > 3 * b1 // 2
        assert a.workspace_bytes(pass_, (1, 32, 16, 16, 16), ws, one, one, one, one, 1,
                                 np.float64) > b1


def test_default_dispatch_functions():
    r = np.random.default_rng(3)
    x, w = r.standard_normal((1, 3, 5, 5, 5)), r.standard_normal((40, 3, 3, 3, 3))
    one = (1, 1, 1)
    y = D.direct_forward(x, w, one, one, one, one)
    _close(y, ref_forward(x, w, one, one, one, one, 1), np.float64)
    dy = r.standard_normal(y.shape)
    _close(D.direct_backward_data(dy, w, x.shape[2:], one, one, one, one),
           ref_backward_data(dy, w, x.shape[2:], one, one, one, one, 1), np.float64)
    _close(D.direct_backward_filter(x, dy, w.shape[2:], one, one, one, one),
           ref_backward_filter(x, dy, w.shape[2:], one, one, one, one, 1), np.float64)


def test_pick_heuristic_and_dispatch_on_its_choices():
    one, zero = (1, 1, 1), (0, 0, 0)
    f32 = np.float32
    assert D.pick("forward", (1, 64, 8, 8, 8), (3, 64, 1, 1, 1), one, one, zero, zero, 1,
                  f32) == "gemm1x1"
    assert D.pick("forward", (1, 256, 4, 4, 4), (512, 256, 3, 3, 3), one, one, one, one, 1,
                  f32) == "wbcast4x4"
    assert D.pick("forward", (1, 32, 32, 32, 32), (64, 32, 3, 3, 3), one, one, one, one, 1,
                  f32) == "direct8x2"
    assert D.pick("backward_data", (1, 32, 32, 32, 32), (64, 32, 3, 3, 3), one, one, one, one,
                  1, f32) == "direct8x2"
    assert D.pick("backward_filter", (1, 64, 8, 8, 8), (3, 64, 1, 1, 1), one, one, zero,
                  zero, 1, f32) != "gemm1x1"
    r = np.random.default_rng(4)
    x, w = r.standard_normal((1, 40, 3, 3, 3)), r.standard_normal((48, 40, 3, 3, 3))
    y = D.direct_forward(x, w, one, one, one, one)      # picks wbcast (weights > columns)
    _close(y, ref_forward(x, w, one, one, one, one, 1), np.float64)
    dy = r.standard_normal(y.shape)
    _close(D.direct_backward_data(dy, w, x.shape[2:], one, one, one, one),
           ref_backward_data(dy, w, x.shape[2:], one, one, one, one, 1), np.float64)
    _close(D.direct_backward_filter(x, dy, w.shape[2:], one, one, one, one),
           ref_backward_filter(x, dy, w.shape[2:], one, one, one, one, 1), np.float64)


def test_scratch_is_reused_and_released():
    one = (1, 1, 1)
    r = np.random.default_rng(6)
    x, w = r.standard_normal((1, 3, 6, 6, 6)), r.standard_normal((5, 3, 3, 3, 3))
    a = D.ALGORITHMS["direct8x2"]
    y1 = a.forward(x, w, one, one, one, one)
    y2 = a.forward(2 * x, w, one, one, one, one)   # results never alias the scratch
    np.testing.assert_allclose(y2, 2 * y1, rtol=1e-12, atol=1e-12)
    D.release_scratch()
    np.testing.assert_allclose(a.forward(x, w, one, one, one, one), y1, rtol=0, atol=0)


@pytest.mark.parametrize("n_n, m_n, p_n, c", [(3, 5, 7, 4), (2, 3, 8, 4), (1, 2, 5, 8),
                                               (4, 6, 32, 64), (3, 2, 2, 4), (1, 3, 2, 8),
                                               (2, 1, 3, 2), (3, 2, 6, 4), (0, 2, 4, 4)])
def test_unblock_lanes_is_the_exact_unblocked_transpose(n_n, m_n, p_n, c):
    """The weight-broadcast result's single copy into ``(N, M, P)``: blocks of ``C`` lanes
    that straddle samples, padding rows and lanes (NaN here) never read, a strided ``dst``."""
    from disttensor.ops.local.cpu.conv_direct.direct import unblock_lanes
    r = np.random.default_rng(n_n * 100 + p_n)
    q_n = n_n * p_n
    n_pb = max(1, -(-q_n // c))
    src = np.full((n_pb, m_n + 3, c), np.nan, dtype=np.float32)
    flat = r.standard_normal((m_n, q_n)).astype(np.float32)
    lanes = np.full((m_n, n_pb * c), np.nan, dtype=np.float32)
    lanes[:, :q_n] = flat
    src[:, :m_n] = lanes.reshape(m_n, n_pb, c).transpose(1, 0, 2)
    want = flat.reshape(m_n, n_n, p_n).transpose(1, 0, 2)
    big = np.zeros((n_n, 2 * m_n, p_n + 1), dtype=np.float32)
    dst = big[:, 1::2, 1:]            # any strides
    unblock_lanes(src, dst)
    np.testing.assert_array_equal(dst, want)
    assert not big[:, 0::2].any() and not big[:, :, 0].any()   # nothing outside dst written
