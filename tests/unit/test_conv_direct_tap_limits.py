"""disttensor.ops.local.cpu.conv_direct: the depth taps each micro-tile skips because they
read only zero padding (geometry.data_span, tap_window, tile_tap_limits against brute force),
and the direct passes on halo'd blocks (one zero-padded depth side, thin depth, strides,
dilations, pads wider than the kernel) against the float64 reference."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from disttensor.ops.local.cpu import conv_direct as D
from disttensor.ops.local.cpu.conv_direct.geometry import data_span, tap_window, tile_tap_limits

from .test_local_cpu_conv_direct import (_close, ref_backward_data, ref_backward_filter,
                                         ref_forward)


def test_data_span_is_where_embed_puts_data():
    for n, lo, size, step in itertools.product(range(0, 5), range(-4, 5), range(0, 12),
                                               range(1, 4)):
        pos = [lo + i * step for i in range(n) if 0 <= lo + i * step < size]
        want = (pos[0], pos[-1] + 1) if pos else (0, 0)
        assert data_span(n, lo, size, step) == want


def test_tap_window_is_the_taps_inside_the_span():
    for o, k, s, d, first, stop in itertools.product(range(5), range(1, 5), range(1, 3),
                                                     range(1, 3), range(0, 6), range(0, 9)):
        inside = [t for t in range(k) if first <= o * s + t * d < stop]
        want = (min(inside), max(inside) + 1) if inside else (0, 0)
        assert tap_window(o, k, s, d, (first, stop)) == want, (o, k, s, d, first, stop)


@pytest.mark.parametrize("n_n,out_sp,kernel,stride,dil,span,rows", [
    (4, (5, 2, 4), (3, 3, 3), 1, 1, (1, 6), 8),      # one zero plane low: a halo'd block
    (4, (5, 2, 2), (3, 3, 3), 1, 1, (1, 6), 8),      # tiles over two planes: nothing to skip
    (2, (4, 3, 3), (3, 2, 2), 1, 1, (2, 6), 4),      # zero planes low, data to the end
    (3, (6, 1, 5), (3, 1, 3), 2, 1, (1, 12), 8),     # stride: the last outputs run short
    (1, (7, 2, 1), (2, 3, 3), 1, 3, (3, 5), 8),      # dilation: planes with no tap at all
    (2, (3, 2, 2), (3, 3, 3), 1, 1, (0, 5), 4),      # nothing to skip: empty table
])
def test_tile_tap_limits_cover_exactly_the_tiles_data_taps(n_n, out_sp, kernel, stride, dil,
                                                          span, rows):
    lim = tile_tap_limits(n_n, out_sp, kernel, stride, dil, span, rows)
    khw = kernel[1] * kernel[2]
    plane = out_sp[1] * out_sp[2]
    r_n = n_n * out_sp[0] * plane
    n_t = -(-r_n // rows)
    full = (0, kernel[0] * khw)
    got = [full] * n_t if lim.size == 0 else [tuple(p) for p in lim.reshape(-1, 2)]
    want = []
    for t in range(n_t):
        taps = set()
        for r in range(t * rows, (t + 1) * rows):
            od = (min(r, r_n - 1) // plane) % out_sp[0]
            taps |= {kd for kd in range(kernel[0]) if span[0] <= od * stride + kd * dil < span[1]}
        want.append((min(taps) * khw, (max(taps) + 1) * khw) if taps else (0, 0))
    assert got == want
    assert (lim.size == 0) == all(w == full for w in want)


# (x shape, w shape, stride, dilation, pad_lo, pad_hi): depth blocks as the spatial split's
# ranks read them (halo on one side, zero padding on the other), and skipped-tap corner cases
HALO_CASES = [
    ((3, 5, 5, 4, 4), (7, 5, 3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 1, 1)),
    ((3, 5, 5, 4, 4), (7, 5, 3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 1, 1), (1, 1, 1)),
    ((2, 3, 3, 3, 5), (40, 3, 3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1)),
    ((2, 4, 7, 3, 3), (6, 4, 3, 2, 2), (2, 1, 1), (2, 1, 1), (3, 0, 1), (4, 1, 0)),
    ((1, 2, 6, 3, 2), (5, 2, 2, 3, 1), (3, 1, 1), (3, 1, 1), (5, 1, 0), (1, 0, 0)),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", HALO_CASES)
@pytest.mark.parametrize("algo", ["direct8x2", "direct4x4"])
def test_direct_passes_on_halo_blocks_match_reference(algo, case, dtype):
    xs, ws, s, d, lo, hi = case
    a = D.ALGORITHMS[algo]
    r = np.random.default_rng(sum(xs) + 7 * sum(lo))
    x = r.standard_normal(xs).astype(dtype)
    w = r.standard_normal(ws).astype(dtype)
    y = a.forward(x, w, s, d, lo, hi, 1)
    _close(y, ref_forward(x, w, s, d, lo, hi, 1), dtype)
    dy = r.standard_normal(y.shape).astype(dtype)
    _close(a.backward_data(dy, w, xs[2:], s, d, lo, hi, 1),
           ref_backward_data(dy, w, xs[2:], s, d, lo, hi, 1), dtype)
    _close(a.backward_filter(x, dy, ws[2:], s, d, lo, hi, 1),
           ref_backward_filter(x, dy, ws[2:], s, d, lo, hi, 1), dtype)


@pytest.mark.parametrize("pass_", ["forward", "backward_data"])
@pytest.mark.parametrize("case", HALO_CASES)
def test_pass_tap_limits_skip_only_padding_of_the_embedded_operand(pass_, case):
    """Against the padded operand the pass really builds (ones embedded as the kernels do):
    every skipped tap of a tile reads only zeros for all its rows, and the first and last
    kept depth taps read data for some row (no tap with data skipped, none without kept at
    the window's ends, where ``dy`` is not zero-inserted)."""
    from disttensor.ops.local.cpu.conv_direct.geometry import (embed, gather_offsets,
                                                               pass_tap_limits)
    from disttensor.ops.local.cpu.conv_operands import conv_out_shape
    xs, ws, s, d, lo, hi = case
    kernel = ws[2:]
    out_sp = conv_out_shape(xs[2:], kernel, s, d, lo, hi)
    if pass_ == "forward":
        size = tuple(n + a + b for n, a, b in zip(xs[2:], lo, hi))
        xp = embed(np.ones(xs), lo, size).copy()
        rows_sp, gs = out_sp, s
    else:
        reach = tuple(dd * (k - 1) for dd, k in zip(d, kernel))
        size = tuple(n + r for n, r in zip(xs[2:], reach))
        xp = embed(np.ones((xs[0], ws[0]) + out_sp), tuple(r - a for r, a in zip(reach, lo)),
                   size, s).copy()
        rows_sp, gs = xs[2:], (1, 1, 1)
    for rows in (4, 8):
        lim = pass_tap_limits(pass_, xs, ws, s, d, lo, hi, rows)
        pos, taps, _ = gather_offsets(xp, kernel, rows_sp, gs, d, 1)
        flat = xp.reshape(-1)
        kk = int(np.prod(kernel))
        khw = kk // kernel[0]
        n_t = -(-pos.size // rows)
        win = [(0, kk)] * n_t if lim.size == 0 else [tuple(p) for p in lim.reshape(-1, 2)]
        for t in range(n_t):
            r = pos[np.minimum(np.arange(t * rows, (t + 1) * rows), pos.size - 1)]
            data = flat[r[:, None] + taps[:kk][None, :]].any(axis=0)   # per tap, channel 0
            a, b = win[t]
            assert not data[:a].any() and not data[b:].any()
            # tight at both ends (a zero-inserted dy, stride > 1, has zero planes inside its
            # span: there only the superset holds)
            if b > a and lim.size and (pass_ == "forward" or s[0] == 1):
                assert data[a:a + khw].any() and data[b - khw:b].any()


def test_kept_fraction_of_a_halo_block():
    from disttensor.ops.local.cpu.conv_direct.geometry import kept_fraction, pass_tap_limits
    x, w = (4, 8, 17, 4, 8), (16, 8, 3, 3, 3)
    lo, hi = (1, 1, 1), (0, 1, 1)
    fwd = pass_tap_limits("forward", x, w, (1,) * 3, (1,) * 3, lo, hi, 8)
    assert kept_fraction(fwd, 27) == pytest.approx((15 + 2 / 3) / 16)
    bwd = pass_tap_limits("backward_data", x, w, (1,) * 3, (1,) * 3, lo, hi, 8)
    assert kept_fraction(bwd, 27) == pytest.approx((14 + 2 / 3 + 2 / 3 + 1 / 3) / 17)
    assert kept_fraction(pass_tap_limits("backward_filter", x, w, (1,) * 3, (1,) * 3, lo, hi,
                                         8), 27) == 1.0
