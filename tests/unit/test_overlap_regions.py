"""Pure tests of the interior/shell split that lets a convolution compute its interior while
the halo exchange is in flight (disttensor.ops._spatial.overlap_regions): the boxes tile the
rank's outputs, the interior reads only owned cells, every read stays in the halo'd buffer,
and assembling the local convolution region by region gives the whole block's result."""
import numpy as np
from hypothesis import given, settings, strategies as st

from disttensor.core.distribution import Distribution, rank_to_coords
from disttensor.ops._spatial import overlap_regions, window_plan
from disttensor.ops.local.cpu.conv_im2col import conv_forward
from disttensor.ops.window import AxisWindow

from disttensor.testing.strategies import explicit_sizes as compositions


@st.composite
def cases(draw):
    nd = 2
    windows, shape, split, sizes, dims = [], [1, 2], [None, None], [None, None], []
    for i in range(nd):
        k = draw(st.integers(1, 4))
        s = draw(st.integers(1, 3))
        d = draw(st.integers(1, 2))
        lo, hi = draw(st.integers(0, 3)), draw(st.integers(0, 3))
        periodic = draw(st.booleans()) and max(lo, hi) <= 3
        w = AxisWindow(k, s, d, lo, hi, periodic)
        n = draw(st.integers(max(w.span - lo - hi, 1, max(lo, hi) if periodic else 1), 14))
        p = draw(st.integers(1, 3))
        windows.append(w)
        shape.append(n)
        split.append(len(dims))
        sizes.append(draw(compositions(n, p)))
        dims.append(p)
    rank = draw(st.integers(0, int(np.prod(dims)) - 1))
    return Distribution(shape, dims, split, sizes), tuple(windows), rank_to_coords(rank, dims)


def _buffer(x, dist, plan, coords, windows):
    """The rank's halo'd buffer filled as the exchange would (zero or periodic boundary)."""
    box = dist.block_box(coords)
    idx = []
    for t in range(dist.ndim):
        lo, hi = plan.halo[t]
        g = np.arange(box.start[t] - lo, box.stop[t] + hi)
        if t >= 2 and windows[t - 2].periodic:
            g = g % dist.shape[t]
        idx.append(g)
    valid = np.ones([len(i) for i in idx], dtype=bool)
    for t, g in enumerate(idx):
        ok = (g >= 0) & (g < dist.shape[t])
        valid &= ok.reshape([-1 if u == t else 1 for u in range(dist.ndim)])
    clipped = [np.clip(g, 0, n - 1) for g, n in zip(idx, dist.shape)]
    return np.where(valid, x[np.ix_(*clipped)], 0.0)


@settings(max_examples=60, deadline=None)
@given(cases())
def test_regions_tile_outputs_and_assemble_the_block(case):
    dist, windows, coords = case
    plan = window_plan(dist, windows, coords)
    interior, shells = overlap_regions(dist, windows, coords)
    if not plan.has_output:
        assert interior is None and shells == ()
        return
    out_shape = plan.out_dist.block_shape(coords)
    cover = np.zeros(out_shape[2:], dtype=int)
    box = dist.block_box(coords)
    buf_shape = [lo + (b - a) + hi for (lo, hi), a, b in zip(plan.halo, box.start, box.stop)]
    for r in ([interior] if interior else []) + list(shells):
        cover[r.out[2:]] += 1
        for t, sl in enumerate(r.read[2:], start=2):
            assert 0 <= sl.start <= sl.stop <= buf_shape[t]
    assert (cover == 1).all()
    if interior is not None:
        for t, sl in enumerate(interior.read[2:], start=2):
            lo = plan.halo[t][0]
            assert lo <= sl.start and sl.stop <= lo + box.stop[t] - box.start[t]
    # region-wise local convolution == the whole block's
    rng = np.random.default_rng(0)
    x = rng.standard_normal(dist.shape)
    w = rng.standard_normal((1, 2) + tuple(win.kernel for win in windows))
    buf = _buffer(x, dist, plan, coords, windows)
    s = (1,) + tuple(win.stride for win in windows)
    d = (1,) + tuple(win.dilation for win in windows)

    def local(read, plo, phi):
        return conv_forward(buf[read][:, :, None], w[:, :, None], s, d, (0,) + tuple(plo),
                            (0,) + tuple(phi), 1)[:, :, 0]
    whole = local(plan.read, plan.pad_lo, plan.pad_hi)
    pieces = np.full(whole.shape, np.nan)
    for r in ([interior] if interior else []) + list(shells):
        pieces[r.out] = local(r.read, r.pad_lo, r.pad_hi)
    np.testing.assert_allclose(pieces, whole, rtol=1e-12, atol=1e-12)
