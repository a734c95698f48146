"""Adaptive average/max pooling (``disttensor.ops.adaptive_pool``, ``nn.functional``'s
``adaptive_*_pool*d`` and the ``nn.Adaptive*Pool*d`` layers) on ``(N, C, *S)`` arrays of any
sample x spatial grid, balanced, uneven and empty blocks: forward and gradient against the
float64 NumPy re-implementations of ``tests/resampling_reference.py``, the output's ownership
(each bin on the block holding its centre), adjoint (dot-product) identities of the average
pooling's communication, and bad input raising on every rank."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from disttensor import nn
from disttensor.autograd import Tensor
from disttensor.nn import functional as F
from disttensor.nn import resampling as R
from disttensor.ops.adaptive_pool import adaptive_pool_backward, adaptive_pool_forward
from disttensor.testing import assert_adjoint, assert_raises_collectively
from disttensor.testing.strategies import grids, split_sizes, splits

from checks import COMM, SIZE, examples, expect, grid
from gradchecks import close, guarded, like, scatter, self_grid

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import resampling_reference as ref  # noqa: E402


@st.composite
def nc_layouts(draw, shape, dims=None):
    """``(dims, split, sizes)`` of an ``(N, C, *S)`` array: channels never split, the other
    axes split or not, balanced, uneven or with empty blocks."""
    if dims is None:
        dims = draw(grids(SIZE, 3))
    rest = draw(splits(len(shape) - 1, len(dims)))
    split = (rest[0], None) + tuple(rest[1:])
    return tuple(dims), split, tuple(draw(split_sizes(shape, dims, split)))


@st.composite
def adaptive_cases(draw):
    nd = draw(st.integers(1, 3))
    side = {1: 9, 2: 6, 3: 4}[nd]
    spatial = tuple(draw(st.integers(1, side)) for _ in range(nd))
    out = tuple(draw(st.one_of(st.none(), st.integers(0, n + 2))) for n in spatial)
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 2))) + spatial
    out = draw(st.sampled_from([out, out[0] if out[0] is not None else 1]))
    return shape, out, draw(nc_layouts(shape)), draw(st.integers(0, 2**32 - 1))


def _sizes(out, spatial):
    out = (out,) * len(spatial) if not isinstance(out, tuple) else out
    return tuple(n if m is None else m for m, n in zip(out, spatial))


def _centre_owned(y, x, what):
    """Every output bin sits on the block (along each split axis) owning its centre cell."""
    for t in range(2, x.ndim):
        if x.split[t] is None:
            continue
        n, m = x.shape[t], y.shape[t]
        xo, yo = x.distribution.offsets[t], y.distribution.offsets[t]
        for o in range(m):
            centre = (o * n // m + -(-(o + 1) * n // m) - 1) // 2
            owner = next(c for c in range(len(xo) - 1) if xo[c] <= centre < xo[c + 1])
            ok = yo[owner] <= o < yo[owner + 1]
            expect(ok, f"{what}: bin {o} of axis {t} not on the block of its centre {centre}")


@settings(max_examples=examples(15))
@given(adaptive_cases())
@guarded
def test_adaptive_pool_forward_backward(case):
    shape, out, layout, seed = case
    rng = np.random.default_rng(seed)
    sizes = _sizes(out, shape[2:])
    for mode in ("avg", "max"):
        xg = rng.normal(size=shape)
        if mode == "max":
            xg = np.round(xg)   # ties: the first maximum of a bin gets the gradient
        x = scatter(xg, layout)
        y, saved = adaptive_pool_forward(x, mode, out)
        what = f"adaptive {mode} out={out} layout={layout}"
        if mode == "avg":
            yref, back = ref.adaptive_avg(xg, sizes), None
        else:
            yref, back = ref.adaptive_max(xg, sizes)
        close(y.to_numpy(), yref, f"{what} forward")
        expect(y.local.shape == y.distribution.block_shape(y.grid.coords), f"{what}: block")
        expect(y.split == x.split, f"{what}: split {y.split} != {x.split}")
        _centre_owned(y, x, what)
        dyg = rng.normal(size=yref.shape)
        dx = adaptive_pool_backward(saved, like(dyg, y))
        expect(dx.distribution == x.distribution, f"{what}: dx distribution")
        dref = ref.adaptive_avg_backward(dyg, shape) if mode == "avg" else back(dyg)
        close(dx.to_numpy(), dref, f"{what} backward")


@settings(max_examples=examples(8))
@given(adaptive_cases())
@guarded
def test_adaptive_avg_pool_adjoint(case):
    shape, out, layout, seed = case
    rng = np.random.default_rng(seed)
    x = scatter(rng.normal(size=shape), layout)
    y, saved = adaptive_pool_forward(x, "avg", out)
    dy = like(rng.normal(size=y.shape), y)
    assert_adjoint(lambda v: adaptive_pool_forward(v, "avg", out)[0],
                   lambda g: adaptive_pool_backward(saved, g), x, dy)


@guarded
def test_global_average_pool_layer_gradient():
    """``nn.AdaptiveAvgPool3d(1)`` (a ResNet's head) on a spatial grid with an empty block:
    the value and the gradient of a weighted sum through the autograd layer."""
    rng = np.random.default_rng(7)
    shape = (2, 3, 5, 4, 3)
    xg = rng.normal(size=shape)
    dims = (SIZE,) if SIZE < 4 else (2, 2)
    split = (None, None, 0, None, None) if SIZE < 4 else (None, None, 0, 1, None)
    sizes = [None] * 5
    if SIZE > 1:
        sizes[2] = (0,) * (dims[0] - 1) + (5,) if SIZE < 4 else (1, 4)
    x = Tensor(dt.from_global(xg, grid=grid(dims), split=split, sizes=sizes),
               requires_grad=True)
    y = nn.AdaptiveAvgPool3d(1)(x)
    w = rng.normal(size=(2, 3, 1, 1, 1))
    loss = F.mse_loss(y, Tensor(like(w, y.data)))
    loss.backward()
    yref = ref.adaptive_avg(xg, (1, 1, 1))
    close(y.data.to_numpy(), yref, "global average pool")
    dy = 2 * (yref - w) / yref.size
    close(x.grad.to_numpy(), ref.adaptive_avg_backward(dy, shape), "global average gradient")


@guarded
def test_adaptive_max_pool_layers_and_nan():
    """The layers by rank (1-D, 2-D) and PyTorch's NaN rule: a NaN in a bin is its maximum."""
    rng = np.random.default_rng(3)
    for nd, cls in ((1, nn.AdaptiveMaxPool1d), (2, nn.AdaptiveMaxPool2d)):
        shape = (2, 2) + (7,) * nd
        xg = rng.normal(size=shape)
        xg[0, 1, 3] = np.nan
        x = Tensor(scatter(xg, ((SIZE,), (None, None, 0) + (None,) * (nd - 1), None)),
                   requires_grad=True)
        out = (3,) + (None,) * (nd - 1) if nd > 1 else 3
        y = cls(out)(x)
        yref, back = ref.adaptive_max(xg, _sizes(out, shape[2:]))
        close(y.data.to_numpy(), yref, f"adaptive max {nd}d", atol=0)
        expect(np.isnan(y.data.to_numpy()[0, 1, 1]).all(), f"{nd}d: NaN bin")


@guarded
def test_adaptive_pool_bad_input():
    x = scatter(np.zeros((1, 2, 5, 4)), ((SIZE,), (None, None, 0, None), None))
    with assert_raises_collectively(ValueError, match="output_size .* needs 2 entries"):
        adaptive_pool_forward(x, "avg", (2, 2, 2))
    with assert_raises_collectively(ValueError, match=">= 0"):
        adaptive_pool_forward(x, "max", (2, -1))
    with assert_raises_collectively(TypeError, match="ints or None"):
        adaptive_pool_forward(x, "avg", (2.5, 1))
    with assert_raises_collectively(NotImplementedError, match="return_indices"):
        F.adaptive_max_pool2d(Tensor(x), 2, return_indices=True)
    with assert_raises_collectively(ValueError, match="3 spatial axes"):
        F.adaptive_avg_pool3d(Tensor(x), 1)


# -- channel dropout (Dropout1d/2d/3d) ---------------------------------------------------------
@settings(max_examples=examples(6))
@given(st.integers(1, 3), st.sampled_from([0.0, 0.3, 0.6, 1.0]), st.data())
@guarded
def test_channel_dropout_maps_and_grid_independence(nd, p, data):
    """Each (n, c) map is kept whole (scaled by 1/(1-p)) or zeroed whole, by the same decision
    on every rank holding a part of it: the result equals the one-rank result of the same
    generator state; the gradient applies the same mask; about a fraction p is dropped."""
    shape = (6, 5) + (3,) * nd
    layout = data.draw(nc_layouts(shape))
    xg = np.random.default_rng(nd).normal(size=shape) + 3.0   # no zeros in x
    fn = {1: R.dropout1d, 2: R.dropout2d, 3: R.dropout3d}[nd]
    x = Tensor(scatter(xg, layout), requires_grad=True)
    y = fn(x, p, True, rng=dt.random.Generator(42))
    one = fn(Tensor(scatter(xg, ((1,) * len(layout[0]), layout[1], None), self_grid())),
             p, True, rng=dt.random.Generator(42))
    yg = y.data.to_numpy()
    close(yg, one.data.to_numpy(), f"dropout{nd}d p={p}: grid independence", atol=0)
    kept = np.all(yg != 0, axis=tuple(range(2, yg.ndim)))
    dropped = np.all(yg == 0, axis=tuple(range(2, yg.ndim)))
    expect(bool(np.all(kept | dropped)), f"dropout{nd}d: a map partly dropped")
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    close(yg, xg * scale * kept[(...,) + (None,) * nd], f"dropout{nd}d values")
    if 0 < p < 1:
        expect(0 < dropped.mean() < 1, f"dropout{nd}d p={p}: dropped {dropped.mean()}")
    dyg = np.random.default_rng(1).normal(size=shape)
    y.backward(like(dyg, y.data))
    close(x.grad.to_numpy(), dyg * scale * kept[(...,) + (None,) * nd], f"dropout{nd}d grad")


@guarded
def test_channel_dropout_layers():
    xg = np.random.default_rng(4).normal(size=(4, 6, 3, 2))
    x = Tensor(scatter(xg, ((SIZE,), (None, None, 0, None), None)))
    layer = nn.Dropout2d(0.5, seed=3)
    a, b = layer(x).data.to_numpy(), layer(x).data.to_numpy()
    expect(not np.array_equal(a, b), "Dropout2d: the generator advances per call")
    expect(int(layer.rng_counter) == 2, f"Dropout2d: counter {int(layer.rng_counter)}")
    layer.eval()
    close(layer(x).data.to_numpy(), xg, "Dropout2d eval: identity", atol=0)
    with assert_raises_collectively(ValueError, match="between 0 and 1"):
        R.dropout3d(Tensor(scatter(np.zeros((1, 1, 2, 2, 2)), ((SIZE,), (None,) * 5, None))),
                    1.5)
    with assert_raises_collectively(ValueError, match="3 spatial axes"):
        R.dropout3d(x, 0.5)
