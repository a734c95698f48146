"""Shared by the host-kernel tests: the build variant, random operands and the float16
comparison."""
from __future__ import annotations

import os

import numpy as np

# the host build the tests run on: "plain" or "sanitized" (conftest.py)
VARIANT = os.environ.get("DISTTENSOR_HOST_CUDA_VARIANT", "plain")

DTYPES = (np.float32, np.float64, np.float16)
RTOL = {np.float64: 1e-12, np.float32: 2e-6, np.float16: 2e-3}


def rand(rng, shape, dtype, nan=False):
    """Standard normal values in ``dtype`` (a few NaN/inf when ``nan``)."""
    a = rng.standard_normal(shape).astype(dtype)
    if nan and a.size > 3:
        flat = a.reshape(-1)
        flat[rng.integers(0, a.size, 2)] = np.nan
        flat[rng.integers(0, a.size)] = np.inf
    return a


def reference_input(a):
    """What the CPU reference kernels get for an operand of the GPU kernels: float16 is
    widened to float32 (exactly); float32/float64 unchanged."""
    return a.astype(np.float32) if a.dtype == np.float16 else a


def assert_close(got, ref, dtype, scale=None, what=""):
    """``got`` (dtype ``dtype``) against a float32/float64 reference, within ``RTOL[dtype]``
    of ``|ref|`` plus the same relative tolerance of ``scale`` (a magnitude of the summed
    terms; default max |ref|); NaN must match NaN, inf must match exactly."""
    got = np.asarray(got)
    assert got.dtype == dtype, (what, got.dtype, dtype)
    ref = np.asarray(ref, dtype=np.float64)
    g = got.astype(np.float64)
    assert g.shape == ref.shape, (what, g.shape, ref.shape)
    if g.size == 0:
        return
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(ref), err_msg=f"{what}: NaN")
    np.testing.assert_array_equal(g[np.isinf(ref)], ref[np.isinf(ref)], err_msg=f"{what}: inf")
    if scale is None:
        scale = np.max(np.abs(ref[finite]), initial=0.0)
    rtol = RTOL[dtype]
    err = np.abs(g[finite] - ref[finite])
    tol = rtol * (np.abs(ref[finite]) + scale) + 1e-300
    bad = err > tol
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} off, worst "
                           f"{np.max(err - tol)} over tolerance")
