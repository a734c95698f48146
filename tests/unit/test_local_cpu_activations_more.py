"""The CPU kernels of ops/local/cpu/activations_more.py without MPI: against the float64 NumPy
re-implementations of tests/activation_reference.py, in float64 (tight) and float32 (computed in
float32: a few float32 ulp of the terms), with NaN/inf, the kinks and thresholds, blocks of
several threads' work, empty arrays; bad input."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from disttensor.ops.local.cpu import activations_more as K

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from activation_reference import prelu_reference, reference  # noqa: E402

TOL = {np.float64: 2e-14, np.float32: 3e-6}


def _x(shape, dtype, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape) * 4
    flat = x.reshape(-1)
    special = (0.0, -3.0, 3.0, 30.0, -30.0, 1e-4, -1e-4, 100.0, -100.0, 19.9)
    flat[:min(len(special), flat.size)] = special[:flat.size]
    return x.astype(dtype)


def _check(got, want, scale, dtype, what):
    assert got.dtype == dtype, what
    want = np.asarray(want, dtype=np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
    fin = np.isfinite(want)
    np.testing.assert_array_equal(got[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)])
    err = np.abs(got[fin].astype(np.float64) - want[fin])
    bound = TOL[dtype] * (np.abs(want[fin]) + scale[fin])
    assert (err <= bound).all(), (what, float(np.max(err - bound)))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name, kw", [(n, {}) for n in K.POINTWISE_ACTIVATIONS]
                         + [("softplus", dict(beta=0.5, threshold=4.0)),
                            ("softplus", dict(beta=3.0, threshold=1.0))])
@pytest.mark.parametrize("shape", [(3, 4, 5), (40000,), (0, 3)], ids=str)
def test_pointwise_matches_reference(name, kw, shape, dtype):
    x = _x(shape, dtype)
    dy = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    xr = x.astype(np.float64)
    want_y, want_d = reference(name, xr, **kw)
    y = K.pointwise_activation_forward(name, x, **kw)
    scale = np.abs(xr)                  # the terms' magnitude (gelu's tail cancels)
    _check(y, want_y, scale, dtype, f"{name} forward")
    dx = K.pointwise_activation_backward(name, dy, x, **kw)
    dyr = dy.astype(np.float64)
    _check(dx, dyr * want_d, np.abs(dyr) * (1 + scale * scale), dtype, f"{name} backward")


@np.errstate(invalid="ignore")
def test_nan_and_inf():
    x = np.array([np.nan, np.inf, -np.inf, 0.0])
    for name in K.POINTWISE_ACTIVATIONS:
        y = K.pointwise_activation_forward(name, x)
        assert np.isnan(y[0]), name
        want, _ = reference(name, x[1:])
        np.testing.assert_array_equal(y[1:], want, err_msg=name)
    d = K.pointwise_activation_backward("hardsigmoid", np.ones(4), x)
    assert d[0] == 0.0                   # PyTorch: 0 at NaN
    assert np.isnan(K.pointwise_activation_backward("hardswish", np.ones(4), x)[0])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape, nw", [((3, 4, 5), 4), ((2, 3, 70, 300), 3), ((5, 2), 1),
                                       ((0, 3, 4), 3), ((4, 3, 2), 1)], ids=str)
def test_prelu_matches_reference(shape, nw, dtype):
    x = _x(shape, dtype, 3)
    dy = np.random.default_rng(4).standard_normal(shape).astype(dtype)
    w = np.random.default_rng(5).uniform(-0.5, 0.5, nw)
    want_y, want_dx, want_dw = prelu_reference(x.astype(np.float64),
                                               w.astype(dtype).astype(np.float64),
                                               dy.astype(np.float64))
    y = K.prelu_forward(x, w.astype(dtype))
    dx, dw = K.prelu_backward(dy, x, w.astype(dtype))
    np.testing.assert_allclose(y, want_y, rtol=TOL[dtype])
    np.testing.assert_allclose(dx, want_dx, rtol=TOL[dtype])
    assert dw.dtype == np.float64 and dw.shape == (nw,)
    terms = np.abs(x.astype(np.float64) * dy).sum()
    np.testing.assert_allclose(dw, want_dw, rtol=1e-12, atol=1e-13 * terms)


def test_bad_input():
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        K.pointwise_activation_forward("swish", np.zeros(3))
    with pytest.raises(TypeError, match="float32 or float64"):
        K.pointwise_activation_forward("gelu", np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="shape"):
        K.pointwise_activation_backward("gelu", np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="2 weights for 3 channels"):
        K.prelu_forward(np.zeros((2, 3, 4)), np.ones(2))
