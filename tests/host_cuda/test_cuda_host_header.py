"""cuda_host.h itself: its binary16 conversions agree bit for bit with NumPy's (round to
nearest even, subnormals, overflow to inf, NaN), and the shim refuses the launches CuPy
would turn into silent garbage (wrong scalar type, wrong dtype, non-contiguous array)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import host_shim
from host_helpers import VARIANT


def _lib():
    return host_shim.library("pointwise", VARIANT)


def test_half_to_float_matches_numpy_on_every_bit_pattern():
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    out = np.empty(h.size, np.float32)
    _lib().dtk_half_to_float(h.ctypes.data_as(ctypes.c_void_p),
                             out.ctypes.data_as(ctypes.c_void_p), ctypes.c_longlong(h.size))
    ref = h.astype(np.float32)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(out), nan)
    np.testing.assert_array_equal(out[~nan].view(np.uint32), ref[~nan].view(np.uint32))


def test_float_to_half_rounds_like_numpy():
    rng = np.random.default_rng(0)
    # every half value, the midpoints between neighbours (ties), their float neighbours, and
    # random floats over the whole exponent range
    h = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = (h[:-1] + h[1:]) / 2
    f = np.concatenate([h, mids, np.nextafter(mids.astype(np.float32), np.inf),
                        np.nextafter(mids.astype(np.float32), -np.inf),
                        rng.standard_normal(20000) * 10.0 ** rng.uniform(-9, 6, 20000),
                        [65504, 65519.99, 65520, 1e9, np.inf, 2.0**-25, 2.0**-25 * 1.0001,
                         2.0**-26]]).astype(np.float32)
    f = np.concatenate([f, -f, [np.nan]]).astype(np.float32)
    out = np.empty(f.size, np.float16)
    _lib().dtk_float_to_half(f.ctypes.data_as(ctypes.c_void_p),
                             out.ctypes.data_as(ctypes.c_void_p), ctypes.c_longlong(f.size))
    with np.errstate(over="ignore"):
        ref = f.astype(np.float16)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(out), nan)
    np.testing.assert_array_equal(out[~nan].view(np.uint16), ref[~nan].view(np.uint16))


def test_shim_rejects_what_cupy_would_misread():
    k = host_shim.HostModule("pointwise", VARIANT).get_function("activation_forward<float>")
    x = np.ones(8, np.float32)
    y = np.empty_like(x)
    good = (x, y, np.int64(8), np.int32(0), np.float64(0))
    k((1,), (256,), good)
    np.testing.assert_array_equal(y, x)
    with pytest.raises(TypeError, match="int64 scalar"):
        k((1,), (256,), (x, y, 8, np.int32(0), np.float64(0)))        # a Python int
    with pytest.raises(TypeError, match="f32 array"):
        k((1,), (256,), (x.astype(np.float64),) + good[1:])
    with pytest.raises(ValueError, match="C-contiguous"):
        k((1,), (256,), (np.ones(16, np.float32)[::2],) + good[1:])
    with pytest.raises(TypeError, match="arguments"):
        k((1,), (256,), good[:-1])
    with pytest.raises(ValueError, match="CUDA limits"):
        k((1,), (2048,), good)


def _selftest(expr):
    return host_shim.HostModule("selftest", VARIANT).get_function(expr)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32], ids=str)
def test_shared_memory_barriers_and_atomics(dtype):
    """A shared-memory tree reduction per block (8 __syncthreads rounds over 256 real
    threads) and atomicAdd of every element into one total, over 5 blocks (the last partial)."""
    ct = {np.float32: "float", np.float64: "double", np.int32: "int"}[dtype]
    rng = np.random.default_rng(1)
    n = 4 * 256 + 77
    x = rng.integers(-1000, 1000, n).astype(dtype)   # integers: sums exact in any order
    out = np.zeros(5, dtype)
    total = np.zeros(1, dtype)
    count = np.zeros(1, np.int32)
    _selftest(f"block_sum<{ct}>")((5,), (256,), (x, np.int64(n), out, total, count))
    ref = np.add.reduceat(x.astype(np.int64), np.arange(0, n, 256))
    np.testing.assert_array_equal(out, ref.astype(dtype))
    assert total[0] == x.astype(np.int64).sum() and count[0] == n


def test_syncthreads_orders_the_threads_of_a_block():
    x = np.arange(3 * 1024, dtype=np.float64)
    y = np.zeros_like(x)
    _selftest("block_reverse")((3,), (1024,), (x, y))
    np.testing.assert_array_equal(y, x.reshape(3, 1024)[:, ::-1].reshape(-1))


def test_grid_and_block_coordinates():
    grid, block = (3, 2, 2), (4, 3, 2)
    nt, nb = int(np.prod(block)), int(np.prod(grid))
    out = np.full(nt * nb, -1, np.int64)
    _selftest("coordinates")(grid, block, (out,))
    ref = []
    for bz in range(grid[2]):
        for by in range(grid[1]):
            for bx in range(grid[0]):
                for tz in range(block[2]):
                    for ty in range(block[1]):
                        for tx in range(block[0]):
                            v = 0
                            for p in (bx, by, bz, tx, ty, tz) + grid + block[:1]:
                                v = v * 64 + p
                            ref.append(v)
    np.testing.assert_array_equal(out, np.array(ref, np.int64))


def test_divergent_syncthreads_fails_the_launch():
    out = np.zeros(2 * 64, np.int32)
    with pytest.raises(RuntimeError, match="__syncthreads"):
        _selftest("divergent_sync")((2,), (64,), (out,))
    # the pool is usable again afterwards
    test_syncthreads_orders_the_threads_of_a_block()
