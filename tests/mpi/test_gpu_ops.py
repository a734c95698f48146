"""The distributed CNN ops with CuPy blocks (cuDNN / RawModule kernels), skipped without a GPU.

Each op runs forward and backward on the same global data with CPU blocks and with GPU blocks
on the same layout; the GPU results must equal the CPU ones (which tests/mpi/test_ops_*.py hold
to the serial float64 reference).  float64 everywhere so the comparison is tight, except the
float32 conv, which may run on TF32 tensor cores in cuDNN."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor import ops
from disttensor.core.backend import gpu_available, to_host

from conftest import assert_all_ranks, assert_allclose_all

pytestmark = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")

COMM = MPI.COMM_WORLD


def _layout():
    if COMM.size >= 4:
        return dt.ProcessGrid((2, 2)), (0, None, 1, None)
    return dt.ProcessGrid((COMM.size,)), (None, None, 0, None)


def _pair(a, grid, split):
    return (dt.from_global(a, grid=grid, split=split),
            dt.from_global(a, grid=grid, split=split, device="cuda"))


def _like(a, y):
    return dt.from_global(a, grid=y.grid, split=y.split, sizes=y.distribution.split_sizes,
                          device=y.device)


def _close(cpu, gpu, rtol=1e-9, atol=1e-12):
    c = cpu.to_numpy() if hasattr(cpu, "to_numpy") else to_host(cpu)
    g = gpu.to_numpy() if hasattr(gpu, "to_numpy") else to_host(gpu)
    assert_allclose_all(COMM, g, c, rtol=rtol, atol=atol)


@pytest.mark.parametrize("stride,padding", [(1, "same"), (2, ((1, 0), (0, 2))), (1, 0)])
def test_conv2d_cpu_equals_gpu(stride, padding):
    import cupy
    rng = np.random.default_rng(0)
    grid, split = _layout()
    x = rng.standard_normal((2, 4, 11, 9))
    w = rng.standard_normal((6, 2, 3, 2))
    b = rng.standard_normal(6)
    xc, xg = _pair(x, grid, split)
    yc, sc = ops.conv_forward(xc, w, b, stride, padding, groups=2)
    yg, sg = ops.conv_forward(xg, cupy.asarray(w), cupy.asarray(b), stride, padding, groups=2)
    assert_all_ranks(COMM, isinstance(yg.local, cupy.ndarray))
    _close(yc, yg)
    dy = rng.standard_normal(yc.shape)
    gc = ops.conv_backward(sc, _like(dy, yc))
    gg = ops.conv_backward(sg, _like(dy, yg))
    for c, g in zip(gc, gg):
        _close(c, g)


def test_conv3d_float32_cosmoflow_like():
    import cupy
    rng = np.random.default_rng(1)
    grid, split = _layout()
    split = split + (None,)
    x = rng.standard_normal((1, 4, 16, 16, 16)).astype(np.float32)
    w = (rng.standard_normal((8, 4, 3, 3, 3)) / 10).astype(np.float32)
    xc, xg = _pair(x, grid, split)
    yc, sc = ops.conv_forward(xc, w, None, 1, "same")
    yg, sg = ops.conv_forward(xg, cupy.asarray(w), None, 1, "same")
    _close(yc, yg, rtol=0, atol=5e-3 * float(np.abs(yc.to_numpy()).max()))
    dxc, dwc, _ = ops.conv_backward(sc, yc)
    dxg, dwg, _ = ops.conv_backward(sg, yg)
    _close(dxc, dxg, rtol=0, atol=5e-3 * float(np.abs(dxc.to_numpy()).max()))
    _close(dwc, dwg, rtol=0, atol=5e-3 * float(np.abs(dwc).max()))


def test_conv_transpose_cpu_equals_gpu():
    import cupy
    rng = np.random.default_rng(2)
    grid, split = _layout()
    y = rng.standard_normal((2, 4, 5, 6))
    w = rng.standard_normal((4, 3, 2, 2))
    yc, yg = _pair(y, grid, split)
    xc, sc = ops.conv_transpose_forward(yc, w, None, 2)
    xg, sg = ops.conv_transpose_forward(yg, cupy.asarray(w), None, 2)
    _close(xc, xg)
    dx = rng.standard_normal(xc.shape)
    for c, g in zip(ops.conv_transpose_backward(sc, _like(dx, xc))[:2],
                    ops.conv_transpose_backward(sg, _like(dx, xg))[:2]):
        _close(c, g)


@pytest.mark.parametrize("mode,kernel,stride,padding", [("max", 2, 2, 0), ("max", 3, 2, 1),
                                                        ("avg", 3, 1, 1)])
def test_pool_cpu_equals_gpu(mode, kernel, stride, padding):
    rng = np.random.default_rng(3)
    grid, split = _layout()
    x = rng.permutation(2 * 3 * 10 * 7).reshape(2, 3, 10, 7).astype(np.float64)
    xc, xg = _pair(x, grid, split)
    yc, sc = ops.pool_forward(xc, mode, kernel, stride, padding)
    yg, sg = ops.pool_forward(xg, mode, kernel, stride, padding)
    _close(yc, yg)
    dy = rng.standard_normal(yc.shape)
    _close(ops.pool_backward(sc, _like(dy, yc)), ops.pool_backward(sg, _like(dy, yg)))


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_cpu_equals_gpu(mode):
    rng = np.random.default_rng(4)
    grid, split = _layout()
    x = rng.standard_normal((2, 3, 5, 4))
    xc, xg = _pair(x, grid, split)
    yc, sc = ops.upsample_forward(xc, 2, mode)
    yg, sg = ops.upsample_forward(xg, 2, mode)
    _close(yc, yg)
    dy = rng.standard_normal(yc.shape)
    _close(ops.upsample_backward(sc, _like(dy, yc)), ops.upsample_backward(sg, _like(dy, yg)))


def test_batch_norm_activations_losses_cpu_equal_gpu():
    import cupy
    rng = np.random.default_rng(5)
    grid, split = _layout()
    x = rng.standard_normal((2, 3, 6, 5)) * 2 + 1
    gamma, beta = rng.standard_normal(3), rng.standard_normal(3)
    xc, xg = _pair(x, grid, split)
    rmc, rvc = np.zeros(3), np.ones(3)
    rmg, rvg = cupy.zeros(3), cupy.ones(3)
    yc, sc = ops.batch_norm_forward(xc, gamma, beta, rmc, rvc)
    yg, sg = ops.batch_norm_forward(xg, cupy.asarray(gamma), cupy.asarray(beta), rmg, rvg)
    _close(yc, yg)
    _close(rmc, rmg)
    _close(rvc, rvg)
    dy = rng.standard_normal(x.shape)
    for c, g in zip(ops.batch_norm_backward(sc, _like(dy, yc)),
                    ops.batch_norm_backward(sg, _like(dy, yg))):
        _close(c, g)
    for name in ops.ACTIVATIONS:
        ac, ag = ops.activation_forward(name, xc), ops.activation_forward(name, xg)
        _close(ac, ag)
        _close(ops.activation_backward(name, _like(dy, ac), xc, ac),
               ops.activation_backward(name, _like(dy, ag), xg, ag))
    sc_, sg_ = ops.softmax(xc), ops.softmax(xg)
    _close(sc_, sg_)
    labels = rng.integers(0, 3, (2, 6, 5))
    lsplit = tuple(s for i, s in enumerate(split) if i != 1)
    lc = dt.from_global(labels, grid=grid, split=lsplit)
    lg = dt.from_global(labels, grid=grid, split=lsplit, device="cuda")
    (l1, s1), (l2, s2) = ops.cross_entropy_forward(xc, lc), ops.cross_entropy_forward(xg, lg)
    assert_all_ranks(COMM, abs(l1 - l2) <= 1e-12 * abs(l1))
    _close(ops.cross_entropy_backward(s1), ops.cross_entropy_backward(s2))
    dc, _ = ops.dropout_forward(xc, 0.4, 11)
    dg, _ = ops.dropout_forward(xg, 0.4, 11)
    _close(dc, dg)
