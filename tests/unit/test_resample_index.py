"""Property tests of the resampling index math (disttensor.ops.resample_index): every output
is owned by exactly one block (the one holding its key), input halos cover every read, output
halos cover every bin a block's cells contribute to, adaptive bins are PyTorch's, an integer
upsampling keeps the input's blocks times the factor, and the interpolation taps are
PyTorch's source coordinates."""
import math

import numpy as np
from hypothesis import given, strategies as st

from disttensor.ops.resample_index import (adaptive_map, interp_map, linear_taps,
                                           nearest_index, output_extent)
from disttensor.testing.strategies import explicit_sizes


def _offsets(sizes):
    offs = [0]
    for v in sizes:
        offs.append(offs[-1] + v)
    return tuple(offs)


@st.composite
def maps_and_split(draw):
    n = draw(st.integers(1, 30))
    m = draw(st.integers(1, 40))
    kind = draw(st.sampled_from(["adaptive", "nearest", "nearest-exact", "linear", "linear-ac"]))
    if kind == "adaptive":
        amap = adaptive_map(n, m)
    else:
        sf = draw(st.one_of(st.none(), st.floats(0.1, 4.0)))
        if sf is not None:
            m = max(1, output_extent(n, sf))
        mode = "linear" if kind.startswith("linear") else kind
        amap = interp_map(n, m, mode, sf, kind == "linear-ac")
    p = draw(st.integers(1, 6))
    return amap, _offsets(draw(explicit_sizes(n, p)))


@given(maps_and_split())
def test_outputs_tiled_by_key_owner_and_halos_cover_reads(ms):
    amap, offs = ms
    n, m = amap.n, amap.m
    assert all(0 <= lo < hi <= n for lo, hi in zip(amap.lo, amap.hi))
    assert list(amap.key) == sorted(amap.key) and list(amap.lo) == sorted(amap.lo)
    assert list(amap.hi) == sorted(amap.hi) and all(0 <= k < n for k in amap.key)
    out = amap.output_offsets(offs)
    assert out[0] == 0 and out[-1] == m and list(out) == sorted(out)
    hl, hh = amap.halo(offs)
    ol, oh = amap.out_halo(offs)
    for a, b, o0, o1 in zip(offs[:-1], offs[1:], out[:-1], out[1:]):
        for o in range(o0, o1):
            assert a <= amap.key[o] < b
            assert a - hl <= amap.lo[o] and amap.hi[o] <= b + hh
        if b > a:
            met = [o for o in range(m) if amap.lo[o] < b and amap.hi[o] > a]
            p0, p1 = amap.touched(a, b)
            assert (p0, p1) == (met[0], met[-1] + 1) if met else p0 >= p1
            assert all(o0 - ol <= o < o1 + oh for o in met)


@given(st.integers(1, 40), st.integers(1, 40))
def test_adaptive_bins_are_pytorchs(n, m):
    amap = adaptive_map(n, m)
    for o in range(m):
        assert amap.lo[o] == math.floor(o * n / m) or amap.lo[o] == (o * n) // m
        assert amap.hi[o] == -((-(o + 1) * n) // m)
        assert amap.key[o] == (amap.lo[o] + amap.hi[o] - 1) // 2
    covered = set()
    for lo, hi in zip(amap.lo, amap.hi):
        covered.update(range(lo, hi))
    assert covered == set(range(n))


@given(st.integers(1, 20), st.integers(1, 4), st.integers(1, 5),
       st.sampled_from(["nearest", "nearest-exact", "linear"]), st.data())
def test_integer_upsampling_keeps_blocks_times_factor(n, f, p, mode, data):
    offs = _offsets(data.draw(explicit_sizes(n, p)))
    amap = interp_map(n, n * f, mode, float(f), False)
    assert amap.output_offsets(offs) == tuple(a * f for a in offs)


@given(st.integers(1, 30), st.integers(1, 30), st.booleans())
def test_linear_taps_are_source_coordinates(n, m, align):
    i0, i1, w0, w1 = linear_taps(n, m, None, align)
    assert np.all((0 <= i0) & (i0 <= i1) & (i1 < n) & (i1 - i0 <= 1))
    np.testing.assert_allclose(w0 + w1, 1.0)
    scale = ((n - 1) / (m - 1) if m > 1 else 0.0) if align else n / m
    want = [scale * o if align else max(scale * (o + 0.5) - 0.5, 0.0) for o in range(m)]
    np.testing.assert_allclose(i0 + w1, want, rtol=1e-12, atol=1e-12)
    if align and m > 1:
        assert i0[0] == 0 and i1[-1] == n - 1 and w1[0] == 0.0


@given(st.integers(1, 30), st.integers(1, 60), st.booleans())
def test_nearest_index(n, m, exact):
    idx = nearest_index(n, m, None, exact)
    for o in range(m):
        pos = (o + 0.5) * n / m if exact else o * n / m
        # PyTorch indexes in float32: at most one cell off the exact real-number rule
        assert abs(int(idx[o]) - min(math.floor(pos), n - 1)) <= 1
    assert idx.min() >= 0 and idx.max() <= n - 1


@given(st.integers(1, 30), st.integers(1, 60), st.sampled_from(["nearest", "linear"]))
def test_interpolation_key_is_the_output_centre(n, m, mode):
    amap = interp_map(n, m, mode, None, False)
    assert amap.key == tuple(math.floor((o + 0.5) * n / m) if (2 * o + 1) * n % (2 * m)
                             else (2 * o + 1) * n // (2 * m) for o in range(m))
