"""kernels/pool.cu on the host through the real wrapper (gpu/pooling.py) against the CPU
kernels (ops/local/cpu/pool.py): max/avg, forward/backward, random shapes, strides,
asymmetric pads (wider than the window too), empty extents, three dtypes."""
from __future__ import annotations

import numpy as np
import pytest

from disttensor.ops.local.cpu import pool as cpu_pool
from host_helpers import DTYPES, assert_close, rand, reference_input

import host_shim


def _case(seed):
    rng = np.random.default_rng(seed)
    k = tuple(int(v) for v in rng.integers(1, 4, 3))
    s = tuple(int(v) for v in rng.integers(1, 4, 3))
    lo = tuple(int(rng.integers(0, kk + 1)) for kk in k)   # up to k: windows of padding only
    hi = tuple(int(rng.integers(0, kk)) for kk in k)
    spatial = tuple(int(v) for v in rng.integers(1, 8, 3))
    n, c = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    return rng, (n, c) + spatial, k, s, lo, hi


CASES = list(range(8)) + ["empty-batch", "empty-depth", "one-cell"]


# (shape, kernel, stride, pad_lo, pad_hi) of the fixed cases
FIXED = {
    "empty-batch": ((0, 2, 3, 4, 5), (2, 2, 2), (1, 1, 1), (0, 0, 0), (0, 0, 0)),
    "empty-depth": ((2, 2, 0, 4, 5), (1, 2, 2), (1, 2, 1), (0, 0, 0), (0, 0, 0)),
    "one-cell": ((1, 1, 1, 1, 1), (3, 3, 3), (2, 2, 2), (2, 1, 0), (0, 1, 2)),
}


def _geometry(case):
    if case in FIXED:
        return (np.random.default_rng(len(case)),) + FIXED[case]
    return _case(case)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES)
def test_max_pool_matches_cpu(host, case, dtype):
    from disttensor.ops.local.gpu import pooling
    rng, shape, k, s, lo, hi = _geometry(case)
    x = rand(rng, shape, dtype, nan=(case == 3))
    if case == 5 and x.size:
        x.reshape(-1)[::3] = 0.5   # ties: the first maximal cell wins
    y, am = pooling.pool_forward(x, "max", k, s, lo, hi)
    yr, amr = cpu_pool.pool_forward(reference_input(x), "max", k, s, lo, hi)
    assert_close(y, yr, dtype, what="y")
    np.testing.assert_array_equal(am, amr)
    assert am.dtype == cpu_pool.argmax_dtype(k)   # uint8 for windows of <= 256 cells
    dy = rand(rng, y.shape, dtype)
    dx = pooling.pool_backward(dy, am, "max", shape[2:], k, s, lo, hi)
    dxr = cpu_pool.pool_backward(reference_input(dy), amr, "max", shape[2:], k, s, lo, hi)
    assert_close(dx, dxr, dtype, scale=np.abs(reference_input(dy)).max(initial=0) * 4, what="dx")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("include_pad", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_avg_pool_matches_cpu(host, case, include_pad, dtype):
    from disttensor.ops.local.gpu import pooling
    rng, shape, k, s, lo, hi = _geometry(case)
    x = rand(rng, shape, dtype)
    y, am = pooling.pool_forward(x, "avg", k, s, lo, hi, count_include_pad=include_pad)
    assert am is None
    yr, _ = cpu_pool.pool_forward(reference_input(x), "avg", k, s, lo, hi,
                                  count_include_pad=include_pad)
    assert_close(y, yr, dtype, scale=np.abs(reference_input(x)).max(initial=0), what="y")
    dy = rand(rng, y.shape, dtype)
    dx = pooling.pool_backward(dy, None, "avg", shape[2:], k, s, lo, hi,
                               count_include_pad=include_pad)
    dxr = cpu_pool.pool_backward(reference_input(dy), None, "avg", shape[2:], k, s, lo, hi,
                                 count_include_pad=include_pad)
    assert_close(dx, dxr, dtype, scale=np.abs(reference_input(dy)).max(initial=0) * 8,
                 what="dx")


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_pool_64bit_index_path_matches(host, mode):
    """The kernels' 64-bit index path (taken above 2^31 elements on a GPU) forced on small
    sizes gives the same results as the 32-bit path."""
    from disttensor.ops.local.gpu import pooling
    rng, shape, k, s, lo, hi = _case(11)
    x = rand(rng, shape, np.float64)
    y32, am32 = pooling.pool_forward(x, mode, k, s, lo, hi)
    dx32 = pooling.pool_backward(y32, am32, mode, shape[2:], k, s, lo, hi)
    host_shim.set_index32_limit(0)
    y64, am64 = pooling.pool_forward(x, mode, k, s, lo, hi)
    dx64 = pooling.pool_backward(y64, am64, mode, shape[2:], k, s, lo, hi)
    np.testing.assert_array_equal(y32, y64)
    np.testing.assert_array_equal(dx32, dx64)
    if mode == "max":
        np.testing.assert_array_equal(am32, am64)
