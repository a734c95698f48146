"""kernels/im2col.cu on the host: im2col3d (both layouts) against a NumPy gather, and the
real im2col + GEMM convolution of gpu/im2col_conv.py (which launches im2col3d and col2im3d
chunk by chunk, NumPy's matmul standing in for cuBLAS) against the CPU convolution
(ops/local/cpu/conv_im2col.py): groups, strides, dilations, asymmetric and negative
(cropping) pads, whole-batch and per-depth-plane chunks, empty batches, three dtypes."""
from __future__ import annotations

import math

import numpy as np
import pytest

from disttensor.ops.local.cpu import conv_im2col as cpu_conv
from disttensor.ops.local.gpu.operands import out_extents
from host_helpers import DTYPES, assert_close, rand, reference_input

import host_shim


def _case(seed):
    rng = np.random.default_rng(seed)
    G = int(rng.integers(1, 3))
    Cg, Coutg = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    kern = tuple(int(v) for v in rng.integers(1, 4, 3))
    stride = tuple(int(v) for v in rng.integers(1, 3, 3))
    dil = tuple(int(v) for v in rng.integers(1, 3, 3))
    spatial = tuple(int(v) for v in rng.integers(3, 7, 3))
    lo = tuple(int(v) for v in rng.integers(-1 if seed % 3 == 0 else 0, 3, 3))
    hi = tuple(int(v) for v in rng.integers(0, 3, 3))
    N = 0 if seed == 4 else int(rng.integers(1, 3))
    osp = out_extents(spatial, kern, stride, dil, lo, hi)
    if min(osp) < 1:
        return _case(seed + 100)
    return rng, (N, G * Cg) + spatial, (G * Coutg, Cg) + kern, G, stride, dil, lo, hi, osp


def _ref_cols(x, G, kern, osp, od0, ndp, stride, dil, lo):
    """The column matrix (nb, G, K, Q) by a NumPy gather (zero outside the input)."""
    nb, C, D, H, W = x.shape
    Cg = C // G
    cols = np.zeros((nb, G, Cg) + tuple(kern) + (ndp, osp[1], osp[2]), x.dtype)
    ods = np.arange(od0, od0 + ndp)
    ohs, ows = np.arange(osp[1]), np.arange(osp[2])
    for kd in range(kern[0]):
        for kh in range(kern[1]):
            for kw in range(kern[2]):
                i_d = ods * stride[0] - lo[0] + kd * dil[0]
                i_h = ohs * stride[1] - lo[1] + kh * dil[1]
                i_w = ows * stride[2] - lo[2] + kw * dil[2]
                md, mh, mw = (i_d >= 0) & (i_d < D), (i_h >= 0) & (i_h < H), (i_w >= 0) & (i_w < W)
                g = x[:, :, np.clip(i_d, 0, max(D - 1, 0))][:, :, :, np.clip(i_h, 0, H - 1)]
                g = g[..., np.clip(i_w, 0, W - 1)]
                mask = md[:, None, None] & mh[None, :, None] & mw[None, None, :]
                cols[:, :, :, kd, kh, kw] = (g * mask).reshape(nb, G, Cg, ndp, osp[1], osp[2])
    return cols.reshape(nb, G, Cg * math.prod(kern), ndp * osp[1] * osp[2])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("transposed", [0, 1])
@pytest.mark.parametrize("seed", range(6))
def test_im2col3d_matches_numpy_gather(host, seed, transposed, dtype):
    """The wrapper's own launch of im2col3d (im2col_conv._im2col) on a batch chunk and a
    range of output depth planes, against the gather; the operand is a chunk (a view into the
    batch) and must not be read outside."""
    from disttensor.ops.local.gpu import im2col_conv
    rng, xs, ws, G, stride, dil, lo, hi, osp = _case(seed)
    x = rand(rng, (xs[0] + 2,) + xs[1:], dtype)
    chunk = x[1:1 + xs[0]]
    od0 = int(rng.integers(0, osp[0]))
    ndp = int(rng.integers(1, osp[0] - od0 + 1))
    K = ws[1] * math.prod(ws[2:])
    Q = ndp * osp[1] * osp[2]
    shape = (xs[0], G, Q, K) if transposed else (xs[0], G, K, Q)
    col = np.full(shape, np.nan, dtype)
    im2col_conv._im2col(host_T(dtype), chunk, col, G, ws[1], xs[2:], ws[2:], osp[1:], od0, ndp,
                        stride, dil, lo, transposed)
    ref = _ref_cols(chunk, G, ws[2:], osp, od0, ndp, stride, dil, lo)
    if transposed:
        ref = ref.transpose(0, 1, 3, 2)
    np.testing.assert_array_equal(col, ref)


def host_T(dtype):
    from disttensor.ops.local.gpu import rawmodules
    return rawmodules.CTYPES[np.dtype(dtype).name]


def _conv_scale(a, b, terms):
    a = reference_input(a)
    b = reference_input(b)
    return float(np.abs(a).max(initial=0) * np.abs(b).max(initial=0) * max(terms, 1))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("budget", ["planes", "batch"])
@pytest.mark.parametrize("seed", range(6))
def test_im2col_conv_matches_cpu(host, seed, budget, dtype):
    from disttensor.ops.local.gpu import im2col_conv
    rng, xs, ws, G, stride, dil, lo, hi, osp = _case(seed)
    x, w = rand(rng, xs, dtype), rand(rng, ws, dtype)
    item = np.dtype(dtype).itemsize
    K = ws[1] * math.prod(ws[2:])
    # "planes": a budget below one sample's columns (chunks of output-depth planes)
    budget_bytes = item * (K * osp[1] * osp[2] * G if budget == "planes" else 1 << 20)
    algo = im2col_conv.Im2colGpu(budget_bytes)
    geo = (stride, dil, lo, hi, G)
    xr, wr = reference_input(x), reference_input(w)
    y = algo.forward(x, w, *geo)
    yr = cpu_conv.conv_forward(xr, wr, stride, dil, lo, hi, G)
    assert_close(y, yr, dtype, scale=_conv_scale(x, w, K), what="forward")
    dy = rand(rng, yr.shape, dtype)
    dx = algo.backward_data(dy, w, xs[2:], *geo)
    dxr = cpu_conv.conv_backward_data(reference_input(dy), wr, xs[2:], stride, dil, lo, hi, G)
    assert_close(dx, dxr, dtype, scale=_conv_scale(dy, w, ws[0] * math.prod(ws[2:])),
                 what="backward data")
    dw = algo.backward_filter(x, dy, ws[2:], *geo)
    dwr = cpu_conv.conv_backward_filter(xr, reference_input(dy), ws[2:], stride, dil, lo, hi, G)
    assert_close(dw, dwr, dtype, scale=_conv_scale(x, dy, xs[0] * math.prod(osp)),
                 what="backward filter")


def test_im2col_64bit_index_path_matches(host):
    from disttensor.ops.local.gpu import im2col_conv
    rng, xs, ws, G, stride, dil, lo, hi, osp = _case(3)
    x, w = rand(rng, xs, np.float64), rand(rng, ws, np.float64)
    algo = im2col_conv.Im2colGpu(1 << 20)
    geo = (stride, dil, lo, hi, G)
    y32 = algo.forward(x, w, *geo)
    dx32 = algo.backward_data(y32, w, xs[2:], *geo)
    host_shim.set_index32_limit(0)
    y64 = algo.forward(x, w, *geo)
    dx64 = algo.backward_data(y64, w, xs[2:], *geo)
    np.testing.assert_array_equal(y32, y64)
    np.testing.assert_array_equal(dx32, dx64)
