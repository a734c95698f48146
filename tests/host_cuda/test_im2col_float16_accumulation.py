"""The float16 filter gradient of gpu/im2col_conv.py sums in float32: partial sums of one
chunk that pass float16's range (65504) must not become inf on the way to a result that fits.

Two samples whose contributions cancel exactly (+1 * 1 and -1 * 1 over 41^3 = 68921 output
positions each): the gradient is exactly 0, and each sample's partial sum (+-68921) is past
float16's largest value, so a float16 GEMM output per chunk (the old code) gives inf - inf =
NaN."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("budget_bytes", [1 << 30, 41 ** 3 * 8])  # one chunk / one per sample
def test_float16_filter_gradient_partial_sums_do_not_overflow(host, budget_bytes):
    from disttensor.ops.local.gpu import im2col_conv
    n = 41
    x = np.ones((2, 1, n, n, n), np.float16)
    dy = np.ones((2, 1, n, n, n), np.float16)
    dy[1] = -1
    one = (1, 1, 1)
    dw = im2col_conv.im2col_backward_filter(np, x, dy, (1, 1, 1, 1, 1), one, one,
                                            (0, 0, 0), 1, budget_bytes)
    assert dw.dtype == np.float16 and dw.shape == (1, 1, 1, 1, 1)
    assert np.all(dw == 0), dw


def test_float16_filter_gradient_is_rounded_once(host):
    """Many chunks of small random terms: the float16 result is the float32 sum rounded once
    (within one float16 ulp of the float64 reference), not a sum of rounded chunk sums."""
    from disttensor.ops.local.gpu import im2col_conv
    rng = np.random.default_rng(7)
    x = rng.uniform(0.5, 1.0, (8, 2, 9, 9, 9)).astype(np.float16)
    dy = rng.uniform(0.5, 1.0, (8, 3, 9, 9, 9)).astype(np.float16)
    one = (1, 1, 1)
    dw = im2col_conv.im2col_backward_filter(np, x, dy, (3, 2, 1, 1, 1), one, one, (0, 0, 0),
                                            1, 9 ** 3 * 2 * 6)  # one chunk per sample
    ref = np.einsum("nkdhw,ncdhw->kc", dy.astype(np.float64), x.astype(np.float64))
    ulp = np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64)
    assert np.all(np.abs(dw.reshape(3, 2).astype(np.float64) - ref) <= ulp), (dw, ref)
