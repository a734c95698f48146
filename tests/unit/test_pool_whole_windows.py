"""disttensor.ops.local.cpu.pool: max pooling's fast path for whole 2x2x2 windows at stride 2
(what CNNs pool with) against the one-loop-per-cell reference: ties (first maximum), NaNs
(first NaN), odd extents (trailing cells outside every window), a trailing pad that keeps the
generic kernel, strided inputs, float32 and float64."""
from __future__ import annotations

import numpy as np
import pytest

from disttensor.ops.local.cpu.pool import pool_backward, pool_forward

from .test_local_cpu_pool import naive_pool

K, Z = (2, 2, 2), (0, 0, 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,hi,strided", [
    ((2, 3, 4, 6, 8), Z, False),
    ((1, 2, 5, 7, 9), Z, False),          # odd extents: the last cell of each axis is left out
    ((1, 2, 5, 4, 3), (1, 0, 1), False),  # a trailing pad: windows with padding (generic kernel)
    ((2, 2, 6, 4, 6), Z, True),
])
def test_whole_window_max_pool_matches_reference(shape, hi, strided, dtype):
    if strided and dtype == np.float64:
        pytest.skip("one strided dtype is enough (each compiles its own kernel)")
    rng = np.random.default_rng(sum(shape))
    for kind in ("ties", "nan", "normal"):
        x = (rng.integers(0, 3, shape) if kind != "normal" else rng.standard_normal(shape))
        x = x.astype(dtype)
        if kind == "nan":
            x[rng.random(shape) < 0.15] = np.nan
        if strided:
            x = x[:, :, ::-1, :, ::-1]
        y, am = pool_forward(x, "max", K, K, Z, hi)
        ry, ram = naive_pool(x, "max", K, K, Z, hi, True)
        assert y.dtype == dtype and am.dtype == np.uint8
        np.testing.assert_array_equal(y.astype(np.float64), ry)
        np.testing.assert_array_equal(am, ram)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 3, 4, 6, 8), (1, 2, 5, 7, 9)])
def test_whole_window_max_pool_backward_is_the_adjoint(shape, dtype):
    """Backward of the fast path's argmax: the gradient at each window's argmax cell, 0 at
    the others and at the cells outside every window (odd extents)."""
    rng = np.random.default_rng(len(shape) + sum(shape))
    x = rng.integers(0, 4, shape).astype(dtype)            # ties: the first maximum counts
    y, am = pool_forward(x, "max", K, K, Z, Z)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = pool_backward(dy, am, "max", shape[2:], K, K, Z, Z)
    want = np.zeros(shape)
    for idx in np.ndindex(*y.shape):
        kd, r = divmod(int(am[idx]), 4)
        kh, kw = divmod(r, 2)
        n, c, od, oh, ow = idx
        want[n, c, 2 * od + kd, 2 * oh + kh, 2 * ow + kw] += dy[idx]
    assert dx.dtype == dtype
    np.testing.assert_array_equal(dx.astype(np.float64), want)
    # the adjoint identity <pick(x'), dy> = <x', dx> for the recorded argmax
    x2 = rng.standard_normal(shape)
    picked = naive_pool(x2, "max", K, K, Z, Z, True)[0] * 0
    for idx in np.ndindex(*y.shape):
        kd, r = divmod(int(am[idx]), 4)
        kh, kw = divmod(r, 2)
        n, c, od, oh, ow = idx
        picked[idx] = x2[n, c, 2 * od + kd, 2 * oh + kh, 2 * ow + kw]
    assert np.isclose((picked * dy).sum(), (x2 * dx).sum(), rtol=1e-5)
