"""kernels/resample.cu on the host through the real wrappers (gpu/resample.py) against the CPU
kernels (ops/local/cpu/resample.py): the CSR map along every axis of random shapes
(interpolation-like taps, bins, empty rows, the transpose), adaptive max pooling forward and
backward (ties, NaN, bins sharing cells, more bins than cells), three dtypes."""
from __future__ import annotations

import numpy as np
import pytest

from disttensor.ops.local.cpu import resample as cpu
from disttensor.ops.resample_index import adaptive_map
from host_helpers import DTYPES, assert_close, rand, reference_input


def _csr(rng, rows, cols):
    out = []
    for _ in range(rows):
        k = int(rng.integers(0, 4))   # empty rows too
        out.append((rng.integers(0, cols, k), rng.standard_normal(k)))
    return cpu.csr_from_rows(out)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", range(6))
def test_csr_apply_matches_cpu(host, case, dtype):
    from disttensor.ops.local.gpu import resample as gpu
    rng = np.random.default_rng(case)
    shape = tuple(int(v) for v in rng.integers(1, 6, int(rng.integers(2, 6))))
    if case == 5:
        shape = (0,) + shape[1:]
    t = int(rng.integers(0, len(shape)))
    rows = int(rng.integers(1, 7))
    csr = _csr(rng, rows, shape[t])
    a = rand(rng, shape, dtype)
    y = gpu.apply_axis(a, t, csr, rows)
    yr = cpu.apply_axis(reference_input(a).astype(np.float64), t, csr, rows)
    assert y.shape == yr.shape
    assert_close(y, yr, dtype, scale=np.abs(reference_input(a)).max(initial=0) * 8, what="y")
    g = rand(rng, y.shape, dtype)
    tcsr = cpu.transpose_csr(csr, shape[t])
    dx = gpu.apply_axis(g, t, tcsr, shape[t])
    dxr = cpu.apply_axis(reference_input(g).astype(np.float64), t, tcsr, shape[t])
    assert_close(dx, dxr, dtype, scale=np.abs(reference_input(g)).max(initial=0) * 8,
                 what="dx")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", range(6))
def test_adaptive_max_matches_cpu(host, case, dtype):
    from disttensor.ops.local.gpu import resample as gpu
    rng = np.random.default_rng(10 + case)
    spatial = tuple(int(v) for v in rng.integers(1, 6, 3))
    out = tuple(int(v) for v in rng.integers(1, 8, 3))   # more bins than cells too
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 3))) + spatial
    x = rand(rng, shape, dtype, nan=(case == 2))
    if case == 3:
        x = np.round(x).astype(dtype)   # ties: the first maximum wins
    bins = [(np.array(adaptive_map(n, m).lo), np.array(adaptive_map(n, m).hi))
            for n, m in zip(spatial, out)]
    y, am = gpu.adaptive_max_forward(x, bins)
    yr, amr = cpu.adaptive_max_forward(reference_input(x), bins)
    assert_close(y, yr, dtype, what="y")
    np.testing.assert_array_equal(am, amr)
    dy = rand(rng, y.shape, dtype)
    dx = gpu.adaptive_max_backward(dy, am, spatial)
    dxr = cpu.adaptive_max_backward(reference_input(dy), amr, spatial)
    assert_close(dx, dxr, dtype, scale=np.abs(reference_input(dy)).max(initial=0) * 8,
                 what="dx")
