"""CPU local batch-norm, activation and channel-softmax kernels
(disttensor.ops.local.cpu.pointwise) against the serial float64 reference (tests/reference.py)
and plain float64 NumPy."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor.ops.local.cpu import pointwise as pw
from disttensor.ops.norm import _local_moments

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reference as ref  # noqa: E402

DTYPES = (np.float32, np.float64)
TOL = {np.float32: 3e-6, np.float64: 1e-12}
FAST = settings(max_examples=60, deadline=None)


def _close(a, b, dtype, scale=1.0, rtol_scale=1.0):
    np.testing.assert_allclose(a, b, rtol=TOL[dtype] * rtol_scale, atol=TOL[dtype] * scale,
                               equal_nan=True)


@st.composite
def nc_array(draw, min_c=1, max_ndim=5):
    """(N, C, *spatial) float32/float64 array with 0 to 3 spatial axes (a zero extent allowed
    occasionally) and a scale that makes float32 rounding visible but not dominant."""
    ndim = draw(st.integers(2, max_ndim))
    shape = (draw(st.integers(0, 3)), draw(st.integers(min_c, 5)))
    shape += tuple(draw(st.integers(0, 6)) for _ in range(ndim - 2))
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    x = rng.standard_normal(shape) * draw(st.sampled_from([0.5, 3.0])) + draw(
        st.sampled_from([0.0, 2.0]))
    return x.astype(dtype), rng


def _chan(v, ndim):
    return np.asarray(v, np.float64).reshape((1, -1) + (1,) * (ndim - 2))


def _axes(x):
    return (0,) + tuple(range(2, x.ndim))


# --------------------------------------------------------------------------------------------
# batch norm pieces
# --------------------------------------------------------------------------------------------

@FAST
@given(nc_array())
def test_channel_sums(case):
    x, _ = case
    s, ss = pw.channel_sums(x)
    x64 = x.astype(np.float64)
    assert s.dtype == ss.dtype == np.float64 and s.shape == ss.shape == (x.shape[1],)
    np.testing.assert_allclose(s, x64.sum(axis=_axes(x)), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(ss, (x64 * x64).sum(axis=_axes(x)), rtol=1e-12, atol=1e-9)


@FAST
@given(nc_array())
def test_batch_norm_train_forward_backward(case):
    """channel_sums + channel_sums_backward (the two-pass moments of disttensor.ops.norm) ->
    bn_forward_apply and channel_sums_backward -> bn_backward_apply compose to the reference
    training-mode batch norm and its gradients (also for data whose variance is tiny next to
    its mean, where a one-pass E[x^2] - E[x]^2 loses ~1e-10 relatively)."""
    x, rng = case
    c = x.shape[1]
    m = x.size // c
    if m < 1:
        return
    eps = 1e-5
    gamma, beta = rng.standard_normal(c), rng.standard_normal(c)
    n, mean, m2 = _local_moments(pw, x, c)
    var = m2 / n
    invstd = 1.0 / np.sqrt(var + eps)
    scale = gamma * invstd
    y = pw.bn_forward_apply(x, scale, beta - mean * scale)
    y_ref, mean_ref, var_ref, _ = ref.batch_norm_train(x, gamma, beta, eps)
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_allclose(mean, mean_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(var, var_ref, rtol=1e-8, atol=1e-10)
    _close(y, y_ref, x.dtype.type, scale=10)

    dy = rng.standard_normal(x.shape).astype(x.dtype)
    sum_dy, sum_dy_xhat = pw.channel_sums_backward(dy, x, mean, invstd)
    dx = pw.bn_backward_apply(dy, x, mean, invstd, gamma, sum_dy / m, sum_dy_xhat / m)
    dx_ref, dgamma_ref, dbeta_ref = ref.batch_norm_train_backward(x, gamma, dy, eps)
    assert sum_dy.dtype == sum_dy_xhat.dtype == np.float64 and dx.dtype == dy.dtype
    np.testing.assert_allclose(sum_dy, dbeta_ref, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(sum_dy_xhat, dgamma_ref, rtol=1e-7, atol=1e-7)
    # dx = gamma*invstd*(dy - mean(dy) - xhat*mean(dy*xhat)) cancels, and the deviations
    # x - mean of a channel whose variance is tiny next to eps and its mean carry relative
    # errors ~ eps*|mean|/std that invstd amplifies: 2e-11 seen between two correct formulas
    _close(dx, dx_ref, x.dtype.type, scale=100, rtol_scale=1e3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bn_elementwise_formulas(dtype):
    """The exact per-element formulas, on shapes that span several work blocks."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 41000)).astype(dtype)       # 3 blocks per plane
    dy = rng.standard_normal(x.shape).astype(dtype)
    c = x.shape[1]
    scale, shift = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c)
    mean, invstd, gamma = rng.standard_normal(c), rng.random(c) + 0.5, rng.standard_normal(c)
    mdy, mdx = rng.standard_normal(c), rng.standard_normal(c)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    y = pw.bn_forward_apply(x, scale, shift)
    _close(y, x64 * _chan(scale, 3) + _chan(shift, 3), dtype, scale=10)
    sdy, sdx = pw.channel_sums_backward(dy, x, mean, invstd)
    xhat = (x64 - _chan(mean, 3)) * _chan(invstd, 3)
    np.testing.assert_allclose(sdy, dy64.sum(axis=(0, 2)), rtol=1e-10, atol=1e-8)
    np.testing.assert_allclose(sdx, (dy64 * xhat).sum(axis=(0, 2)), rtol=1e-10, atol=1e-8)
    dx = pw.bn_backward_apply(dy, x, mean, invstd, gamma, mdy, mdx)
    expect = _chan(gamma * invstd, 3) * (dy64 - _chan(mdy, 3) - xhat * _chan(mdx, 3))
    _close(dx, expect, dtype, scale=10)
    # strided (non-contiguous) inputs give the same results
    xs = np.ascontiguousarray(np.swapaxes(x.reshape(2, 3, 41, 1000), 2, 3)).swapaxes(2, 3)
    assert not xs.flags.c_contiguous
    np.testing.assert_array_equal(pw.bn_forward_apply(xs, scale, shift),
                                  pw.bn_forward_apply(x.reshape(xs.shape), scale, shift))
    np.testing.assert_array_equal(pw.channel_sums(xs)[0], pw.channel_sums(x)[0])


# --------------------------------------------------------------------------------------------
# activations
# --------------------------------------------------------------------------------------------

@FAST
@given(nc_array(), st.sampled_from(pw.ACTIVATIONS), st.sampled_from([None, 0.2, 1.7]))
def test_activations(case, name, alpha):
    x, rng = case
    x = x * np.asarray(4, x.dtype)                 # reach the saturated parts of sigmoid/tanh
    y = pw.activation_forward(name, x, alpha)
    assert y.dtype == x.dtype and y.shape == x.shape
    _close(y, ref.activation(name, x, alpha), x.dtype.type)
    dy = rng.standard_normal(x.shape).astype(x.dtype)
    dx = pw.activation_backward(name, dy, x, y, alpha)
    assert dx.dtype == dy.dtype and dx.shape == x.shape
    _close(dx, ref.activation_backward(name, x, dy, alpha), x.dtype.type, scale=10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_activation_edge_values(dtype):
    x = np.array([[-np.inf, -800.0, -1.0, -0.0, 0.0, 1e-30, 2.0, 800.0, np.inf, np.nan]],
                 dtype)
    with np.errstate(all="ignore"):
        y = {n: pw.activation_forward(n, x) for n in pw.ACTIVATIONS}
    assert np.array_equal(y["relu"], [[0, 0, 0, 0, 0, dtype(1e-30), 2, 800, np.inf, np.nan]],
                          equal_nan=True)
    sig = y["sigmoid"][0]
    assert sig[0] == 0 and sig[-2] == 1 and np.isnan(sig[-1]) and sig[4] == 0.5
    assert np.all(np.isfinite(sig[:-1]))
    assert 0 < sig[2] < 0.5 and sig[1] >= 0
    elu = y["elu"][0]
    assert elu[0] == -1 and elu[2] == pytest.approx(np.expm1(-1.0), rel=1e-6) and elu[4] == 0
    assert y["leaky_relu"][0, 2] == pytest.approx(-0.01, rel=1e-6)
    assert y["tanh"][0, 0] == -1 and y["tanh"][0, -2] == 1
    # derivative at 0 follows PyTorch: relu 0, leaky alpha, elu 1 + ... = y + alpha = alpha
    z = np.zeros((1, 1), dtype)
    one = np.ones((1, 1), dtype)
    d = {n: pw.activation_backward(n, one, z, pw.activation_forward(n, z), 0.3)[0, 0]
         for n in pw.ACTIVATIONS}
    assert d["relu"] == 0 and d["leaky_relu"] == pytest.approx(0.3)
    assert d["elu"] == pytest.approx(0.3) and d["sigmoid"] == 0.25 and d["tanh"] == 1
    # relu's zero derivative wins even over a non-finite upstream gradient
    dx = pw.activation_backward("relu", np.array([[np.inf, np.nan]], dtype),
                                np.array([[-1.0, 0.0]], dtype), np.zeros((1, 2), dtype))
    assert dx.tolist() == [[0.0, 0.0]]


def test_activation_unknown_name():
    x = np.zeros((1, 2), np.float32)
    with pytest.raises(ValueError, match="relu, leaky_relu, elu, sigmoid, tanh"):
        pw.activation_forward("gelu", x)
    with pytest.raises(ValueError, match="valid names"):
        pw.activation_backward("softplus", x, x, x)


@pytest.mark.parametrize("name", pw.ACTIVATIONS)
def test_activation_large_and_strided(name):
    rng = np.random.default_rng(2)
    base = (rng.standard_normal((3, 4, 70001)) * 3).astype(np.float32)   # several blocks
    x = base[:, ::2, ::3]                                                 # strided view
    y = pw.activation_forward(name, x)
    _close(y, ref.activation(name, x, None), np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    _close(pw.activation_backward(name, dy, x, y), ref.activation_backward(name, x, dy, None),
           np.float32, scale=10)


# --------------------------------------------------------------------------------------------
# softmax over channels
# --------------------------------------------------------------------------------------------

@FAST
@given(nc_array(), st.sampled_from([0.0, 1e3]))
def test_softmax_channels(case, shift):
    x, rng = case
    x = x + np.asarray(shift, x.dtype)             # stability: large common offsets
    y = pw.softmax_channels(x)
    assert y.dtype == x.dtype and y.shape == x.shape
    y_ref = ref.softmax(x)
    _close(y, y_ref, x.dtype.type)
    ly = pw.log_softmax_channels(x)
    assert ly.dtype == x.dtype and ly.shape == x.shape
    with np.errstate(divide="ignore"):
        _close(ly, np.log(y_ref), x.dtype.type, scale=10)
    dy = rng.standard_normal(x.shape).astype(x.dtype)
    dx = pw.softmax_channels_backward(dy, y)
    assert dx.dtype == dy.dtype and dx.shape == x.shape
    _close(dx, ref.softmax_backward(y, dy), x.dtype.type, scale=10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_stability_and_nan(dtype):
    x = np.array([[[1000.0, -1000.0, 0.0]], [[1001.0, -1000.0, np.nan]]], dtype)  # (2, 1, 3)
    x = np.ascontiguousarray(x.transpose(1, 0, 2))                 # (1, 2, 3): C = 2
    y = pw.softmax_channels(x)
    ly = pw.log_softmax_channels(x)
    np.testing.assert_allclose(y[0, :, 0], [1 / (1 + np.e), np.e / (1 + np.e)], rtol=1e-6)
    np.testing.assert_allclose(ly[0, :, 0], np.log([1 / (1 + np.e), np.e / (1 + np.e)]),
                               rtol=1e-6)
    np.testing.assert_array_equal(y[0, :, 1], [0.5, 0.5])
    assert np.isnan(y[0, :, 2]).all() and np.isnan(ly[0, :, 2]).all()


def test_softmax_many_blocks_strided():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 5, 9, 130)).astype(np.float32)[:, :, :, 1:]  # S = 1161 > block
    y = pw.softmax_channels(x)
    _close(y, ref.softmax(x), np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)[..., ::-1]
    _close(pw.softmax_channels_backward(dy, y), ref.softmax_backward(y, dy), np.float32,
           scale=10)


# --------------------------------------------------------------------------------------------
# shapes and errors
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(0, 3), (0, 3, 4, 4), (2, 0, 5), (2, 3, 0, 4), (3, 2)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_and_2d(shape, dtype):
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    c = shape[1]
    v = np.ones(c)
    s, ss = pw.channel_sums(x)
    assert s.shape == ss.shape == (c,)
    np.testing.assert_allclose(s, x.astype(np.float64).sum(axis=_axes(x)), rtol=1e-12)
    for y in (pw.bn_forward_apply(x, v, v), pw.bn_backward_apply(x, x, v, v, v, v, v),
              pw.softmax_channels(x), pw.log_softmax_channels(x),
              pw.softmax_channels_backward(x, x),
              *(pw.activation_forward(n, x) for n in pw.ACTIVATIONS),
              *(pw.activation_backward(n, x, x, x) for n in pw.ACTIVATIONS)):
        assert y.shape == shape and y.dtype == dtype
    assert pw.channel_sums_backward(x, x, v, v)[0].shape == (c,)


def test_errors():
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(TypeError):
        pw.channel_sums(x.astype(np.int64))
    with pytest.raises(ValueError):
        pw.softmax_channels(np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="scale"):
        pw.bn_forward_apply(x, np.ones(2), np.ones(3))
    with pytest.raises(ValueError, match="shape"):
        pw.bn_backward_apply(x, x[:1], np.ones(3), np.ones(3), np.ones(3), np.ones(3),
                             np.ones(3))
    with pytest.raises(ValueError, match="shape"):
        pw.softmax_channels_backward(x, x[:, :2])


# -- a layer's bias ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3), (2, 5, 4, 3, 7), (1, 4, 0, 2), (3, 2, 9)])
@pytest.mark.parametrize("layout", ["c", "strided"])
def test_add_channel_bias_gives_numpy_bits(dtype, shape, layout):
    """``add_channel_bias`` (compiled on C-contiguous arrays, NumPy's expression otherwise)
    gives the bits of NumPy's broadcast add, the bias cast to the data's dtype first (a
    float64 bias on float32 data, non-finite values included), in place."""
    rng = np.random.default_rng(4)
    base = rng.standard_normal(shape[:1] + (2 * shape[1],) + shape[2:]).astype(dtype)
    if base.size:
        base.reshape(-1)[::7] = np.inf
    y = base[:, ::2] if layout == "strided" else np.ascontiguousarray(base[:, ::2])
    b = rng.standard_normal(shape[1]) * 3
    b[0] = -np.inf
    with np.errstate(invalid="ignore"):
        want = y.astype(dtype, copy=True)
        want += b.reshape((1, -1) + (1,) * (len(shape) - 2)).astype(dtype)
        pw.add_channel_bias(y, b)
    assert y.dtype == dtype and y.tobytes() == want.tobytes()
