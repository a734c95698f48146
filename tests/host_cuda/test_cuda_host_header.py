"""cuda_host.h itself: its binary16 conversions agree bit for bit with NumPy's (round to
nearest even, subnormals, overflow to inf, NaN), and the shim refuses the launches CuPy
would turn into silent garbage (wrong scalar type, wrong dtype, non-contiguous array)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import host_shim
from conftest import VARIANT


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
