"""kernels/pointwise.cu on the host through the real wrappers (gpu/batchnorm.py,
gpu/activations.py) against the CPU kernels (ops/local/cpu/pointwise.py): per-channel sums
(one and several blocks per channel), batch-norm apply, activations, channel softmax; layouts
(N, C) to (N, C, D, H, W), empty batches and channels, three dtypes."""
from __future__ import annotations

import numpy as np
import pytest

from disttensor.ops.local.cpu import pointwise as cpu_pw
from disttensor.ops.local.gpu import rawmodules
from host_helpers import DTYPES, assert_close, rand, reference_input

import host_shim

SHAPES = [(3, 4), (2, 3, 5), (2, 3, 1500), (1, 2, 3, 4, 5), (5, 1, 7, 3, 1), (0, 3, 4),
          (2, 0, 5), (3, 5, 0)]
IDS = ["x".join(map(str, s)) for s in SHAPES]
DT = dict(argnames="dtype", argvalues=DTYPES, ids=lambda d: np.dtype(d).name)


def _sums_scale(a):
    """Magnitude of a per-channel sum's terms (the tolerance's scale)."""
    a = np.abs(reference_input(a).astype(np.float64))
    return float(a.sum()) if a.size else 0.0


@pytest.mark.parametrize(**DT)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_channel_sums_match_cpu(host, shape, dtype):
    from disttensor.ops.local.gpu import batchnorm
    rng = np.random.default_rng(len(shape) * 7 + shape[-1])
    x = rand(rng, shape, dtype)
    s, ss = batchnorm.channel_sums(x)
    sr, ssr = cpu_pw.channel_sums(reference_input(x))
    # float64 accumulation of exactly converted inputs: float64 rounding only
    assert_close(s, sr, np.float64, scale=_sums_scale(x), what="sum")
    assert_close(ss, ssr, np.float64, scale=_sums_scale(x * x), what="sum of squares")
    mean = rng.standard_normal(shape[1])
    invstd = rng.uniform(0.5, 2, shape[1])
    dy = rand(rng, shape, dtype)
    b1, b2 = batchnorm.channel_sums_backward(dy, x, mean, invstd)
    b1r, b2r = cpu_pw.channel_sums_backward(reference_input(dy), reference_input(x), mean,
                                            invstd)
    assert_close(b1, b1r, np.float64, scale=_sums_scale(dy), what="sum dy")
    assert_close(b2, b2r, np.float64, scale=_sums_scale(dy) * 8, what="sum dy*xhat")


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("grid_y", [1, 2, 3])
def test_channel_partial_loops_over_channels(host, mode, grid_y):
    """channel_partial with fewer blocks along y than channels (the grid-stride over
    channels the wrapper uses beyond 65535 channels) and several blocks along x."""
    rng = np.random.default_rng(grid_y)
    N, C, S = 2, 5, 700
    a = rng.standard_normal((N, C, S))
    b = rng.standard_normal((N, C, S))
    mean, invstd = rng.standard_normal(C), rng.uniform(0.5, 2, C)
    B = 3
    p1 = np.full(C * B, np.nan)
    p2 = np.full(C * B, np.nan)
    kern = rawmodules.kernel("pointwise", f"channel_partial<double, {mode}>")
    kern((B, grid_y), (rawmodules.BLOCK,),
         (a, b, mean, invstd) + rawmodules.i64(C, S, N * S) + (p1, p2))
    xh = (b - mean[None, :, None]) * invstd[None, :, None]
    r1 = a.sum(axis=(0, 2))
    r2 = (a * a).sum(axis=(0, 2)) if mode == 0 else (a * xh).sum(axis=(0, 2))
    np.testing.assert_allclose(p1.reshape(C, B).sum(axis=1), r1, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(p2.reshape(C, B).sum(axis=1), r2, rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize(**DT)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_bn_apply_matches_cpu(host, shape, dtype):
    from disttensor.ops.local.gpu import batchnorm
    rng = np.random.default_rng(len(shape) + shape[0])
    C = shape[1]
    x, dy = rand(rng, shape, dtype), rand(rng, shape, dtype)
    scale, shift = rng.standard_normal(C), rng.standard_normal(C)
    y = batchnorm.bn_forward_apply(x, scale, shift)
    yr = cpu_pw.bn_forward_apply(reference_input(x), scale, shift)
    assert_close(y, yr, dtype, what="y")
    mean, invstd, gamma = rng.standard_normal(C), rng.uniform(0.5, 2, C), rng.standard_normal(C)
    mdy, mdx = rng.standard_normal(C), rng.standard_normal(C)
    dx = batchnorm.bn_backward_apply(dy, x, mean, invstd, gamma, mdy, mdx)
    dxr = cpu_pw.bn_backward_apply(reference_input(dy), reference_input(x), mean, invstd,
                                   gamma, mdy, mdx)
    assert_close(dx, dxr, dtype, what="dx")


@pytest.mark.parametrize(**DT)
@pytest.mark.parametrize("name", cpu_pw.ACTIVATIONS)
@pytest.mark.parametrize("shape", [(3, 4, 5), (1, 1), (2, 3, 300), (0, 4)], ids=str)
def test_activations_match_cpu(host, name, shape, dtype):
    from disttensor.ops.local.gpu import activations
    rng = np.random.default_rng(shape[-1])
    x = rand(rng, shape, dtype, nan=True) * 3
    if x.size > 4:
        x.reshape(-1)[:2] = 0.0   # the derivative conventions at 0
    alpha = None if name in ("sigmoid", "tanh", "relu") else 0.3
    y = activations.activation_forward(name, x, alpha)
    yr = cpu_pw.activation_forward(name, reference_input(x), alpha)
    assert_close(y, yr, dtype, what=f"{name} forward")
    dy = rand(rng, shape, dtype)
    dx = activations.activation_backward(name, dy, x, y, alpha)
    dxr = cpu_pw.activation_backward(name, reference_input(dy), reference_input(x),
                                     reference_input(y), alpha)
    assert_close(dx, dxr, dtype, scale=np.abs(reference_input(dy)).max(initial=0) * 4,
                 what=f"{name} backward")


@pytest.mark.parametrize(**DT)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_softmax_matches_cpu(host, shape, dtype):
    from disttensor.ops.local.gpu import activations
    rng = np.random.default_rng(shape[0] * 3 + len(shape))
    x = rand(rng, shape, dtype) * 4
    for fn in ("softmax_channels", "log_softmax_channels"):
        y = getattr(activations, fn)(x)
        yr = getattr(cpu_pw, fn)(reference_input(x))
        assert_close(y, yr, dtype, scale=8.0 if fn.startswith("log") else 1.0, what=fn)
    y = activations.softmax_channels(x)
    dy = rand(rng, shape, dtype)
    dx = activations.softmax_channels_backward(dy, y)
    dxr = cpu_pw.softmax_channels_backward(reference_input(dy), reference_input(y))
    assert_close(dx, dxr, dtype, scale=np.abs(reference_input(dy)).max(initial=0) * 4,
                 what="softmax backward")


def test_pointwise_64bit_index_path_matches(host):
    """The 64-bit index path (above 2^31 elements on a GPU) forced on small sizes gives the
    bit-identical results of the 32-bit path."""
    from disttensor.ops.local.gpu import activations, batchnorm
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal((3, 4, 50)), rng.standard_normal((3, 4, 50))
    p = [rng.standard_normal(4) for _ in range(5)]

    def run():
        y = activations.activation_forward("elu", x)
        return (y, activations.activation_backward("elu", dy, x, y),
                *batchnorm.channel_sums(x), *batchnorm.channel_sums_backward(dy, x, p[0], p[1]),
                batchnorm.bn_forward_apply(x, p[0], p[1]),
                batchnorm.bn_backward_apply(dy, x, *p),
                activations.softmax_channels(x), activations.log_softmax_channels(x),
                activations.softmax_channels_backward(dy, x))

    r32 = run()
    host_shim.set_index32_limit(0)
    r64 = run()
    for a, b in zip(r32, r64):
        np.testing.assert_array_equal(a, b)
