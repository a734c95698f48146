"""GPU local kernels (disttensor.ops.local.gpu) against the CPU ones (cpu_conv, cpu_pool,
cpu_pointwise), on small random inputs.

Per-rank kernels: these tests do no MPI communication (under mpirun every rank runs them on its
own); they skip cleanly where CuPy or a CUDA device is missing.  Convolutions run with the
default backend (cuDNN when the frontend imports) and with backend='im2col'; references are
computed by the CPU kernels in float64.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
try:
    _NDEV = cupy.cuda.runtime.getDeviceCount()
except Exception:  # noqa: BLE001 - no driver, no device
    _NDEV = 0
if _NDEV == 0:
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from disttensor.ops.local import gpu  # noqa: E402
from disttensor.ops.local.cpu import conv_im2col as cpu_conv  # noqa: E402
from disttensor.ops.local.cpu import pointwise as cpu_pointwise  # noqa: E402
from disttensor.ops.local.cpu import pool as cpu_pool  # noqa: E402

pytestmark = pytest.mark.gpu

BACKENDS = [None, "im2col"]
FLOATS = [np.float32, np.float64]


def _rng(*key):
    # the same data on every rank and every run (str hash() is salted per process)
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _tol(dtype):
    # float32 on cuDNN may run TF32 tensor-core engines (10-bit mantissa inputs)
    return 5e-3 if np.dtype(dtype) == np.float32 else 1e-9


def _close(got, ref, dtype, what=""):
    """max |got - ref| <= tol * max(1, max |ref|), got's dtype checked."""
    assert got.dtype == np.dtype(dtype), (what, got.dtype, dtype)
    g = cupy.asnumpy(got).astype(np.float64)
    r = np.asarray(ref, dtype=np.float64)
    assert g.shape == r.shape, (what, g.shape, r.shape)
    scale = max(1.0, float(np.abs(r).max(initial=0.0)))
    err = float(np.abs(g - r).max(initial=0.0))
    assert err <= _tol(dtype) * scale, f"{what}: max error {err} (scale {scale})"


# ----------------------------------------------------------------------------------------------
# convolution
# ----------------------------------------------------------------------------------------------
# (N, Cin, Cout, groups, spatial, kernel, stride, dilation, pad_lo, pad_hi)
CONV_CASES = [
    (2, 3, 4, 1, (6, 7, 5), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1)),
    (2, 4, 6, 2, (7, 6, 8), (2, 3, 4), (2, 1, 3), (1, 2, 1), (1, 0, 2), (0, 2, 1)),
    (1, 2, 3, 1, (9, 5, 6), (3, 2, 1), (3, 2, 1), (2, 1, 1), (2, 1, 0), (1, 0, 0)),
    (3, 6, 6, 3, (5, 5, 5), (1, 1, 1), (2, 2, 2), (1, 1, 1), (0, 0, 0), (0, 0, 0)),
    (2, 4, 4, 4, (6, 6, 6), (3, 3, 3), (1, 1, 1), (1, 1, 1), (2, 2, 2), (0, 1, 2)),
    (1, 3, 2, 1, (4, 8, 3), (4, 2, 2), (1, 3, 2), (1, 1, 2), (3, 0, 1), (2, 1, 1)),
]
CONV_IDS = [f"case{i}" for i in range(len(CONV_CASES))]


def _conv_data(case, dtype):
    N, Cin, Cout, G, sp, k, s, d, lo, hi = case
    rng = _rng("conv", case, np.dtype(dtype).name)
    x = rng.standard_normal((N, Cin) + sp)
    w = rng.standard_normal((Cout, Cin // G) + k)
    y_ref = cpu_conv.conv_forward(x, w, s, d, lo, hi, G)
    dy = rng.standard_normal(np.shape(y_ref))
    return x, w, np.asarray(y_ref), dy


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", CONV_CASES, ids=CONV_IDS)
def test_conv_forward(case, dtype, backend):
    N, Cin, Cout, G, sp, k, s, d, lo, hi = case
    x, w, y_ref, _ = _conv_data(case, dtype)
    y = gpu.conv_forward(cupy.asarray(x, dtype), cupy.asarray(w, dtype), s, d, lo, hi, G,
                         backend=backend)
    _close(y, y_ref, dtype, "conv_forward")
    if backend == "im2col":
        assert gpu.last_conv_backend() == "im2col"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", CONV_CASES, ids=CONV_IDS)
def test_conv_backward_data(case, dtype, backend):
    N, Cin, Cout, G, sp, k, s, d, lo, hi = case
    x, w, _, dy = _conv_data(case, dtype)
    ref = cpu_conv.conv_backward_data(dy, w, sp, s, d, lo, hi, G)
    dx = gpu.conv_backward_data(cupy.asarray(dy, dtype), cupy.asarray(w, dtype), sp, s, d, lo,
                                hi, G, backend=backend)
    _close(dx, ref, dtype, "conv_backward_data")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", CONV_CASES, ids=CONV_IDS)
def test_conv_backward_filter(case, dtype, backend):
    N, Cin, Cout, G, sp, k, s, d, lo, hi = case
    x, w, _, dy = _conv_data(case, dtype)
    ref = cpu_conv.conv_backward_filter(x, dy, k, s, d, lo, hi, G)
    dw = gpu.conv_backward_filter(cupy.asarray(x, dtype), cupy.asarray(dy, dtype), k, s, d, lo,
                                  hi, G, backend=backend)
    _close(dw, ref, dtype, "conv_backward_filter")


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_adjoint_identities(backend):
    """<conv(x), dy> == <x, dgrad(dy)> == <w, wgrad(x, dy)> on the GPU alone (float64)."""
    N, Cin, Cout, G, sp, k, s, d, lo, hi = CONV_CASES[1]
    rng = _rng("adjoint")
    x = cupy.asarray(rng.standard_normal((N, Cin) + sp))
    w = cupy.asarray(rng.standard_normal((Cout, Cin // G) + k))
    y = gpu.conv_forward(x, w, s, d, lo, hi, G, backend=backend)
    dy = cupy.asarray(rng.standard_normal(y.shape))
    dx = gpu.conv_backward_data(dy, w, sp, s, d, lo, hi, G, backend=backend)
    dw = gpu.conv_backward_filter(x, dy, k, s, d, lo, hi, G, backend=backend)
    a = float(cupy.vdot(y, dy))
    assert abs(a - float(cupy.vdot(x, dx))) <= 1e-9 * max(1.0, abs(a))
    assert abs(a - float(cupy.vdot(w, dw))) <= 1e-9 * max(1.0, abs(a))


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_negative_padding_crops(backend):
    """Negative padding crops the input: the same as cropping by hand with the rest of the
    padding (the distributed ops hand a halo'd block with less padding than it holds)."""
    rng = _rng("negpad")
    N, Cin, Cout, G = 2, 3, 4, 1
    sp, k, s, d = (7, 8, 6), (3, 2, 3), (1, 2, 1), (1, 1, 2)
    lo, hi = (-1, 1, 0), (1, -2, -1)
    x = cupy.asarray(rng.standard_normal((N, Cin) + sp))
    w = cupy.asarray(rng.standard_normal((Cout, Cin // G) + k))
    crop = (slice(None), slice(None), slice(1, None), slice(0, sp[1] - 2), slice(0, sp[2] - 1))
    lo2, hi2 = (0, 1, 0), (1, 0, 0)
    y = gpu.conv_forward(x, w, s, d, lo, hi, G, backend=backend)
    y2 = gpu.conv_forward(x[crop], w, s, d, lo2, hi2, G, backend=backend)
    assert y.shape == y2.shape
    cupy.testing.assert_allclose(y, y2, rtol=1e-12, atol=1e-12)
    dy = cupy.asarray(rng.standard_normal(y.shape))
    dx = gpu.conv_backward_data(dy, w, sp, s, d, lo, hi, G, backend=backend)
    dx2 = cupy.zeros_like(x)
    dx2[crop] = gpu.conv_backward_data(dy, w, x[crop].shape[2:], s, d, lo2, hi2, G,
                                       backend=backend)
    cupy.testing.assert_allclose(dx, dx2, rtol=1e-12, atol=1e-12)
    dw = gpu.conv_backward_filter(x, dy, k, s, d, lo, hi, G, backend=backend)
    dw2 = gpu.conv_backward_filter(x[crop], dy, k, s, d, lo2, hi2, G, backend=backend)
    cupy.testing.assert_allclose(dw, dw2, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("budget", ["plane", "sample"])
def test_conv_im2col_chunking(monkeypatch, budget):
    """A small column budget cuts the batch (whole samples) or the output depth (planes)."""
    case = CONV_CASES[1]
    N, Cin, Cout, G, sp, k, s, d, lo, hi = case
    x, w, y_ref, dy = _conv_data(case, np.float64)
    osp = y_ref.shape[2:]
    per_sample = Cin * int(np.prod(k)) * int(np.prod(osp)) * 8
    mib = (1.5 * per_sample / 2**20) if budget == "sample" else 1e-5  # 1 sample / 1 plane
    monkeypatch.setenv("DISTTENSOR_IM2COL_WORKSPACE_MIB", repr(mib))
    xg, wg, dyg = (cupy.asarray(a) for a in (x, w, dy))
    _close(gpu.conv_forward(xg, wg, s, d, lo, hi, G, backend="im2col"), y_ref, np.float64)
    _close(gpu.conv_backward_data(dyg, wg, sp, s, d, lo, hi, G, backend="im2col"),
           cpu_conv.conv_backward_data(dy, w, sp, s, d, lo, hi, G), np.float64)
    _close(gpu.conv_backward_filter(xg, dyg, k, s, d, lo, hi, G, backend="im2col"),
           cpu_conv.conv_backward_filter(x, dy, k, s, d, lo, hi, G), np.float64)


@pytest.mark.skipif(not gpu.cudnn_available(), reason="cuDNN frontend not available")
@pytest.mark.parametrize("case", [CONV_CASES[0], CONV_CASES[1]], ids=["symmetric", "asymmetric"])
def test_conv_float32_runs_on_cudnn(case):
    """float32 convolutions (symmetric and asymmetric padding) really run on cuDNN."""
    N, Cin, Cout, G, sp, k, s, d, lo, hi = case
    x, w, y_ref, dy = _conv_data(case, np.float32)
    xg, wg, dyg = (cupy.asarray(a, np.float32) for a in (x, w, dy))
    gpu.conv_forward(xg, wg, s, d, lo, hi, G, backend="cudnn")
    assert gpu.last_conv_backend() == "cudnn"
    gpu.conv_backward_data(dyg, wg, sp, s, d, lo, hi, G, backend="cudnn")
    assert gpu.last_conv_backend() == "cudnn"
    gpu.conv_backward_filter(xg, dyg, k, s, d, lo, hi, G, backend="cudnn")
    assert gpu.last_conv_backend() == "cudnn"


def test_conv_backend_selection(monkeypatch):
    monkeypatch.setenv("DISTTENSOR_CONV_BACKEND", "im2col")
    assert gpu.conv_backend() == "im2col"
    x = cupy.ones((1, 1, 3, 3, 3), np.float32)
    w = cupy.ones((1, 1, 1, 1, 1), np.float32)
    gpu.conv_forward(x, w, 1, 1, 0, 0, 1)
    assert gpu.last_conv_backend() == "im2col"
    monkeypatch.delenv("DISTTENSOR_CONV_BACKEND")
    assert gpu.conv_backend() == ("cudnn" if gpu.cudnn_available() else "im2col")


def test_conv_float16_smoke():
    case = CONV_CASES[0]
    N, Cin, Cout, G, sp, k, s, d, lo, hi = case
    x, w, y_ref, _ = _conv_data(case, np.float16)
    for backend in BACKENDS:
        try:
            y = gpu.conv_forward(cupy.asarray(x, np.float16), cupy.asarray(w, np.float16), s, d,
                                 lo, hi, G, backend=backend)
        except TypeError as e:  # no __half kernels on this NVRTC
            pytest.skip(str(e))
        assert y.dtype == np.float16
        err = np.abs(cupy.asnumpy(y).astype(np.float64) - y_ref).max()
        assert err <= 2e-2 * max(1.0, np.abs(y_ref).max())


# ----------------------------------------------------------------------------------------------
# pooling
# ----------------------------------------------------------------------------------------------
# (spatial, kernel, stride, pad_lo, pad_hi); pads <= kernel - 1 so every window has real cells
POOL_CASES = [
    ((6, 7, 5), (2, 2, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0)),
    ((7, 6, 8), (3, 2, 3), (2, 1, 2), (1, 0, 1), (1, 1, 0)),
    ((5, 5, 5), (3, 3, 3), (1, 1, 1), (2, 2, 2), (2, 2, 2)),
    ((4, 9, 6), (4, 3, 2), (3, 2, 1), (3, 1, 0), (0, 2, 1)),
]
POOL_IDS = [f"case{i}" for i in range(len(POOL_CASES))]
POOL_MODES = [("max", True), ("avg", True), ("avg", False)]


def _pool_check(x, mode, cip, case, dtype):
    sp, k, s, lo, hi = case
    y_ref, am_ref = cpu_pool.pool_forward(x, mode, k, s, lo, hi, count_include_pad=cip)
    xg = cupy.asarray(x)
    y, am = gpu.pool_forward(xg, mode, k, s, lo, hi, count_include_pad=cip)
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_allclose(cupy.asnumpy(y), y_ref, rtol=1e-6, atol=1e-6, equal_nan=True)
    if mode == "max":
        assert am.dtype == cpu_pool.argmax_dtype(k) and am.shape == y.shape
        np.testing.assert_array_equal(cupy.asnumpy(am), np.asarray(am_ref))
    else:
        assert am is None
    dy = _rng("pooldy", case, mode).standard_normal(y.shape).astype(dtype)
    dx_ref = cpu_pool.pool_backward(dy, am_ref, mode, sp, k, s, lo, hi, count_include_pad=cip)
    dx = gpu.pool_backward(cupy.asarray(dy), am, mode, sp, k, s, lo, hi, count_include_pad=cip)
    assert dx.dtype == np.dtype(dtype) and dx.shape == x.shape
    np.testing.assert_allclose(cupy.asnumpy(dx), dx_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mode,cip", POOL_MODES)
@pytest.mark.parametrize("case", POOL_CASES, ids=POOL_IDS)
def test_pool(case, mode, cip, dtype):
    x = _rng("pool", case, np.dtype(dtype).name).standard_normal((2, 3) + case[0]).astype(dtype)
    _pool_check(x, mode, cip, case, dtype)


@pytest.mark.parametrize("case", POOL_CASES, ids=POOL_IDS)
def test_max_pool_ties_nan_inf(case):
    """Ties resolve to the first maximal element, the first NaN wins, -inf vs padding."""
    rng = _rng("ties", case)
    x = rng.integers(0, 3, size=(2, 2) + case[0]).astype(np.float64)
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, size=max(1, flat.size // 20), replace=False)] = np.nan
    flat[rng.choice(flat.size, size=max(1, flat.size // 20), replace=False)] = -np.inf
    _pool_check(x, "max", True, case, np.float64)
    _pool_check(np.full((1, 1) + case[0], -np.inf), "max", True, case, np.float64)


def test_pool_float16_smoke():
    case = POOL_CASES[1]
    sp, k, s, lo, hi = case
    x = _rng("pool16").standard_normal((2, 3) + sp)
    try:
        y, am = gpu.pool_forward(cupy.asarray(x, np.float16), "max", k, s, lo, hi)
    except TypeError as e:
        pytest.skip(str(e))
    y_ref, _ = cpu_pool.pool_forward(x.astype(np.float16).astype(np.float64), "max", k, s, lo, hi)
    assert y.dtype == np.float16
    np.testing.assert_allclose(cupy.asnumpy(y).astype(np.float64), y_ref, rtol=1e-3, atol=1e-3)


# ----------------------------------------------------------------------------------------------
# pointwise
# ----------------------------------------------------------------------------------------------
PW_SHAPES = [(5, 3), (2, 4, 7), (2, 3, 4, 5, 3)]
PW_IDS = ["2d", "3d", "5d"]


def _pw_close(got, ref, dtype, rtol=None):
    assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
    rtol = rtol if rtol is not None else (1e-5 if np.dtype(dtype) == np.float32 else 1e-12)
    np.testing.assert_allclose(cupy.asnumpy(got), np.asarray(ref), rtol=rtol, atol=rtol)


def _bn_inputs(shape, dtype):
    rng = _rng("bn", shape, np.dtype(dtype).name)
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    C = shape[1]
    mean = rng.standard_normal(C)
    invstd = 1.0 / (0.5 + rng.random(C))
    return rng, x, C, mean, invstd


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", PW_SHAPES, ids=PW_IDS)
def test_channel_sums_and_bn(shape, dtype):
    rng, x, C, mean, invstd = _bn_inputs(shape, dtype)
    xg = cupy.asarray(x)
    s, ss = gpu.channel_sums(xg)
    s_ref, ss_ref = cpu_pointwise.channel_sums(x)
    _pw_close(s, s_ref, np.float64, rtol=1e-10)
    _pw_close(ss, ss_ref, np.float64, rtol=1e-10)
    s2, ss2 = gpu.channel_sums(xg)  # deterministic: bitwise the same
    assert bool((s2 == s).all()) and bool((ss2 == ss).all())

    scale, shift = rng.standard_normal(C), rng.standard_normal(C)
    _pw_close(gpu.bn_forward_apply(xg, cupy.asarray(scale), cupy.asarray(shift)),
              cpu_pointwise.bn_forward_apply(x, scale, shift), dtype)

    dy = rng.standard_normal(shape).astype(dtype)
    dyg = cupy.asarray(dy)
    a, b = gpu.channel_sums_backward(dyg, xg, cupy.asarray(mean), cupy.asarray(invstd))
    a_ref, b_ref = cpu_pointwise.channel_sums_backward(dy, x, mean, invstd)
    _pw_close(a, a_ref, np.float64, rtol=1e-10)
    _pw_close(b, b_ref, np.float64, rtol=1e-10)

    gamma, mdy, mdyx = rng.standard_normal(C), rng.standard_normal(C), rng.standard_normal(C)
    dx = gpu.bn_backward_apply(dyg, xg, cupy.asarray(mean), cupy.asarray(invstd),
                               cupy.asarray(gamma), cupy.asarray(mdy), cupy.asarray(mdyx))
    _pw_close(dx, cpu_pointwise.bn_backward_apply(dy, x, mean, invstd, gamma, mdy, mdyx), dtype)


ACTS = [("relu", None), ("leaky_relu", None), ("leaky_relu", 0.2), ("elu", None),
        ("elu", 0.5), ("sigmoid", None), ("tanh", None)]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name,alpha", ACTS)
@pytest.mark.parametrize("shape", PW_SHAPES, ids=PW_IDS)
def test_activations(shape, name, alpha, dtype):
    rng = _rng("act", shape, name, alpha, np.dtype(dtype).name)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    xg, dyg = cupy.asarray(x), cupy.asarray(dy)
    y_ref = cpu_pointwise.activation_forward(name, x, alpha)
    y = gpu.activation_forward(name, xg, alpha)
    _pw_close(y, y_ref, dtype)
    dx_ref = cpu_pointwise.activation_backward(name, dy, x, np.asarray(y_ref), alpha)
    _pw_close(gpu.activation_backward(name, dyg, xg, y, alpha), dx_ref, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", PW_SHAPES, ids=PW_IDS)
def test_softmax_channels(shape, dtype):
    rng = _rng("softmax", shape, np.dtype(dtype).name)
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    xg = cupy.asarray(x)
    y = gpu.softmax_channels(xg)
    y_ref = cpu_pointwise.softmax_channels(x)
    _pw_close(y, y_ref, dtype)
    _pw_close(gpu.log_softmax_channels(xg), cpu_pointwise.log_softmax_channels(x), dtype)
    y_np = cupy.asnumpy(y)
    _pw_close(gpu.softmax_channels_backward(cupy.asarray(dy), y),
              cpu_pointwise.softmax_channels_backward(dy, y_np), dtype)


def test_pointwise_float16_smoke():
    x = _rng("pw16").standard_normal((2, 3, 4, 5))
    xh = cupy.asarray(x, np.float16)
    try:
        y = gpu.activation_forward("tanh", xh)
    except TypeError as e:
        pytest.skip(str(e))
    assert y.dtype == np.float16
    np.testing.assert_allclose(cupy.asnumpy(y).astype(np.float64), np.tanh(x), atol=2e-3)
    s, _ = gpu.channel_sums(xh)
    np.testing.assert_allclose(cupy.asnumpy(s), x.astype(np.float16).astype(np.float64)
                               .sum(axis=(0, 2, 3)), rtol=1e-12, atol=1e-12)
    sm = gpu.softmax_channels(xh)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(cupy.asnumpy(sm).astype(np.float64),
                               e / e.sum(axis=1, keepdims=True), atol=2e-3)
