"""Max/average pooling with PyTorch's ``ceil_mode``, max pooling's ``dilation`` and average
pooling's ``divisor_override`` (``disttensor.ops.pool_forward``, ``nn.functional``'s
``max_pool*d``/``avg_pool*d``, ``nn.MaxPool*d``/``nn.AvgPool*d``) on ``(N, C, *S)`` arrays of
any sample x spatial grid with balanced, uneven and empty blocks: forward and gradient against
the float64 NumPy re-implementation of ``tests/resampling_reference.py``, adjoint identities,
bad input raising on every rank."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor import nn
from disttensor.autograd import Tensor
from disttensor.nn import functional as F
from disttensor.ops import pool_backward, pool_forward
from disttensor.testing import assert_adjoint, assert_raises_collectively

from checks import SIZE, examples, expect
from gradchecks import close, guarded, like, scatter
from test_nn_resampling import nc_layouts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import resampling_reference as ref  # noqa: E402


@st.composite
def pool_cases(draw):
    nd = draw(st.integers(1, 3))
    side = {1: 9, 2: 6, 3: 5}[nd]
    mode = draw(st.sampled_from(["max", "avg"]))
    k = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    s = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    p = tuple(draw(st.integers(0, kk // 2)) for kk in k)
    d = tuple(draw(st.integers(1, 2)) for _ in range(nd)) if mode == "max" else (1,) * nd
    span = [di * (ki - 1) + 1 for di, ki in zip(d, k)]
    spatial = tuple(draw(st.integers(max(1, sp - 2 * pi), side)) for sp, pi in zip(span, p))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) + spatial
    ceil = draw(st.booleans())
    include = draw(st.booleans())
    divisor = draw(st.sampled_from([None, None, 3])) if mode == "avg" else None
    return shape, mode, k, s, p, d, ceil, include, divisor, draw(nc_layouts(shape)), \
        draw(st.integers(0, 2**32 - 1))


@settings(max_examples=examples(20))
@given(pool_cases())
@guarded
def test_pool_ceil_dilation_divisor(case):
    shape, mode, k, s, p, d, ceil, include, divisor, layout, seed = case
    rng = np.random.default_rng(seed)
    xg = rng.normal(size=shape)
    if mode == "max":
        xg = np.round(xg * 2)   # ties: the first maximum gets the gradient
    x = scatter(xg, layout)
    y, saved = pool_forward(x, mode, k, s, p, include, ceil, d, divisor)
    what = f"{mode} k={k} s={s} p={p} d={d} ceil={ceil} incl={include} div={divisor} {layout}"
    yref, back = ref.pool(xg, mode, k, s, [(q, q) for q in p], d, ceil, include, divisor)
    close(y.to_numpy(), yref, f"{what} forward")
    expect(y.local.shape == y.distribution.block_shape(y.grid.coords), f"{what}: block")
    dyg = rng.normal(size=yref.shape)
    dx = pool_backward(saved, like(dyg, y))
    close(dx.to_numpy(), back(dyg), f"{what} backward")
    if mode == "avg":   # linear: the backward is the forward's adjoint
        assert_adjoint(lambda v: pool_forward(v, mode, k, s, p, include, ceil, d, divisor)[0],
                       lambda g: pool_backward(saved, g), x, like(dyg, y), err_msg=what)


@guarded
def test_pool_layers_pytorch_signatures():
    rng = np.random.default_rng(9)
    xg = rng.normal(size=(2, 2, 7, 6, 5))
    for layer, args in ((nn.MaxPool3d(3, 2, 1, dilation=(1, 2, 1), ceil_mode=True),
                         ("max", (3,) * 3, (2,) * 3, [(1, 1)] * 3, (1, 2, 1), True, True, None)),
                        (nn.AvgPool3d(2, 2, 1, True, False),
                         ("avg", (2,) * 3, (2,) * 3, [(1, 1)] * 3, (1,) * 3, True, False, None)),
                        (nn.AvgPool3d((3, 2, 2), 2, 1, ceil_mode=True, divisor_override=5),
                         ("avg", (3, 2, 2), (2,) * 3, [(1, 1)] * 3, (1,) * 3, True, True, 5))):
        x = Tensor(scatter(xg, ((SIZE,), (None, None, 0, None, None), None)),
                   requires_grad=True)
        y = layer(x)
        mode, k, s, p, d, ceil, incl, div = args
        yref, back = ref.pool(xg, mode, k, s, p, d, ceil, incl, div)
        close(y.data.to_numpy(), yref, repr(layer))
        w = rng.normal(size=yref.shape)
        F.mse_loss(y, Tensor(like(w, y.data))).backward()
        close(x.grad.to_numpy(), back(2 * (yref - w) / w.size), f"{layer!r} gradient")
    y = F.max_pool1d(Tensor(scatter(xg[:, :, :, 0, 0], ((SIZE,), (None, None, 0), None))), 2,
                     ceil_mode=True)
    close(y.data.to_numpy(), ref.pool(xg[:, :, :, 0, 0], "max", (2,), (2,), [(0, 0)], (1,),
                                      True)[0], "F.max_pool1d ceil_mode")


@guarded
def test_pool_modes_bad_input():
    x = scatter(np.zeros((1, 2, 6, 5)), ((SIZE,), (None, None, 0, None), None))
    with assert_raises_collectively(ValueError, match="no dilation"):
        pool_forward(x, "avg", 2, dilation=2)
    with assert_raises_collectively(ValueError, match="divisor_override"):
        pool_forward(x, "avg", 2, divisor_override=0)
    with assert_raises_collectively(ValueError, match="at most half the kernel"):
        F.max_pool2d(Tensor(x), 3, padding=2, dilation=2)
    with assert_raises_collectively(NotImplementedError, match="return_indices"):
        F.max_pool2d(Tensor(x), 2, return_indices=True)


@guarded
def test_avg_pool_ceil_mode_divisor_counts_declared_padding_only():
    """A window reaching past the input and its declared padding (ceil_mode) divides by the
    cells up to the declared padding: 7 cells, kernel 2 -> the last window holds one cell;
    with padding 1 and kernel 3, stride 2 the last one counts 2 (cell 6 and the padding)."""
    xg = np.random.default_rng(4).normal(size=(2, 2, 7))
    x = scatter(xg, ((SIZE,), (None, None, 0), None))
    for k, s, p in ((2, 2, 0), (3, 2, 1), (3, 3, 1)):
        y = F.avg_pool1d(Tensor(x), k, s, p, ceil_mode=True)
        close(y.data.to_numpy(), ref.pool(xg, "avg", (k,), (s,), [(p, p)], (1,), True)[0],
              f"avg_pool1d k={k} s={s} p={p} ceil_mode")
