"""The CPU normalization kernels (ops/local/cpu/normalization.py) and the pure helpers of
ops/group_norm.py and ops/layer_norm.py, without MPI: against NumPy float64 and the
re-implementations of tests/normalization_reference.py."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from disttensor.ops.group_norm import stats_axes
from disttensor.ops.layer_norm import normalized_tuple
from disttensor.ops.local.cpu import normalization as K

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import normalization_reference as ref  # noqa: E402

SHAPES = [(3, 7), (2, 40000), (1, 1), (0, 5), (4, 0), (5, 16385)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_moments(shape, dtype):
    rng = np.random.default_rng(shape[1])
    x = (rng.standard_normal(shape) * 3 + 1e3).astype(dtype)   # a mean far from 0
    mean, m2 = K.row_moments(x)
    x64 = x.astype(np.float64)
    assert mean.dtype == np.float64 and mean.shape == (shape[0],)
    if shape[1]:
        np.testing.assert_allclose(mean, x64.mean(axis=1), rtol=1e-14)
        np.testing.assert_allclose(m2, ((x64 - x64.mean(axis=1, keepdims=True)) ** 2).sum(1),
                                   rtol=1e-11)
    else:
        assert not mean.any() and not m2.any()


@pytest.mark.parametrize("block", [1, 3, 7, 64])
def test_row_moments_merges_blocks_in_order(block):
    """Chan's merge of many unequal blocks (the kernel's block size as an argument)."""
    x = np.random.default_rng(block).standard_normal((3, 101)) + 50
    mean, m2 = K._moments_kernel(x, block)
    np.testing.assert_allclose(mean, x.mean(axis=1), rtol=1e-14)
    np.testing.assert_allclose(m2, x.var(axis=1) * 101, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_backward_apply(dtype):
    rng = np.random.default_rng(1)
    dy, x = (rng.standard_normal((4, 33)).astype(dtype) for _ in range(2))
    a, m, b, d = (rng.standard_normal(4) for _ in range(4))
    s_dy, s_dyx = K.rows_backward_sums(dy, x, m)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    np.testing.assert_allclose(s_dy, dy64.sum(axis=1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s_dyx, (dy64 * (x64 - m[:, None])).sum(axis=1), rtol=1e-12,
                               atol=1e-12)
    got = K.rows_backward_apply(dy, x, a, m, b, d)
    want = a[:, None] * dy + b[:, None] * (x.astype(np.float64) - m[:, None]) + d[:, None]
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == np.float32 else 1e-14,
                               atol=1e-6 if dtype == np.float32 else 1e-14)


@pytest.mark.parametrize("shape", [(4, 9), (2, 40000), (0, 3), (3, 0)], ids=str)
def test_layer_norm_kernels_match_reference(shape):
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal(shape) * 2 + 1, rng.standard_normal(shape)
    gamma, beta = rng.standard_normal(shape[1]), rng.standard_normal(shape[1])
    if shape[0] == 4:     # float32 parameters are read as they are
        gamma, beta = gamma.astype(np.float32), beta.astype(np.float32)
    mean, m2 = K.row_moments(x)
    invstd = 1 / np.sqrt(m2 / max(shape[1], 1) + 1e-5)
    y = K.ln_forward_apply(x, mean, invstd, gamma, beta)
    want = ref.layer_norm(x, (shape[1],), gamma, beta, 1e-5, dy)
    np.testing.assert_allclose(y, want[0], rtol=1e-12, atol=1e-12)
    sa, sb, cols = K.ln_backward_sums(dy, x, mean, invstd, gamma)
    assert cols.shape == (2, shape[1]) and cols.dtype == np.float64
    cols32 = K.ln_backward_sums(dy, x, mean, invstd, gamma, np.float32)[2]
    assert cols32.dtype == np.float32
    np.testing.assert_array_equal(cols32, cols.astype(np.float32))   # rounded once
    dg, db = cols
    np.testing.assert_allclose(dg, want[2], rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(db, want[3], rtol=1e-11, atol=1e-11)
    n = max(shape[1], 1)
    dx = K.ln_backward_apply(dy, x, mean, invstd, gamma, sa / n, sb / n)
    np.testing.assert_allclose(dx, want[1], rtol=1e-10, atol=1e-11)


def test_kernels_refuse_bad_operands():
    with pytest.raises(TypeError, match="float32 or float64"):
        K.row_moments(np.ones((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="2-D"):
        K.row_moments(np.ones(3))
    with pytest.raises(ValueError, match="gamma must have 3 values, got 2"):
        K.ln_forward_apply(np.ones((2, 3)), np.ones(2), np.ones(2), np.ones(2), np.ones(3))
    with pytest.raises(ValueError, match="dy shape"):
        K.rows_backward_apply(np.ones((2, 3)), np.ones((3, 2)), *([np.ones(2)] * 4))


def test_stats_axes_and_normalized_tuple():
    assert stats_axes((0, None, 1, None, 2), 2) == (1, 2)
    assert stats_axes((0, None, None), 2) == ()
    assert stats_axes((None, 0, 1), 1) == (0, 1)
    assert normalized_tuple(5) == (5,)
    assert normalized_tuple([3, np.int64(4)]) == (3, 4)
    for bad in ("ab", 2.5, [1.5], True):
        with pytest.raises(TypeError, match="normalized_shape"):
            normalized_tuple(bad)
