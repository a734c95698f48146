"""kernels/normalization.cu on the host through the real wrapper (gpu/normalization.py) against
the CPU kernels (ops/local/cpu/normalization.py): per-row moments (one and several chunks per
row, a mean far from 0), the group-norm data gradient, layer norm's apply, sums and data
gradient; empty rows and columns, three dtypes, and both index widths."""
from __future__ import annotations

import numpy as np
import pytest

from disttensor.ops.local.cpu import normalization as cpu
from host_helpers import DTYPES, assert_close, rand, reference_input

import host_shim

SHAPES = [(3, 7), (2, 5000), (1, 1), (0, 4), (3, 0), (70, 3)]
IDS = ["x".join(map(str, s)) for s in SHAPES]
DT = dict(argnames="dtype", argvalues=DTYPES, ids=lambda d: np.dtype(d).name)


def _scale(a):
    a = np.abs(reference_input(a).astype(np.float64))
    return float(a.sum(axis=1).max()) if a.size else 0.0


@pytest.mark.parametrize(**DT)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_row_moments_match_cpu(host, shape, dtype):
    from disttensor.ops.local.gpu import normalization as gpu
    rng = np.random.default_rng(shape[1] + 1)
    x = (rand(rng, shape, np.float64) + 20).astype(dtype)
    mean, m2 = gpu.row_moments(x)
    rmean, rm2 = cpu.row_moments(reference_input(x))
    assert_close(mean, rmean, np.float64, scale=float(np.abs(rmean).max(initial=0)), what="mean")
    assert_close(m2, rm2, np.float64, scale=float(np.abs(rm2).max(initial=0)) * 10, what="m2")


@pytest.mark.parametrize(**DT)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_backward_and_layer_norm_match_cpu(host, shape, dtype):
    from disttensor.ops.local.gpu import normalization as gpu
    rng = np.random.default_rng(shape[0] * 5 + 2)
    R, L = shape
    x, dy = rand(rng, shape, dtype), rand(rng, shape, dtype)
    xr, dyr = reference_input(x), reference_input(dy)
    a, m, b, d = (rng.standard_normal(R) for _ in range(4))
    for g, w, what in zip(gpu.rows_backward_sums(dy, x, m), cpu.rows_backward_sums(dyr, xr, m),
                          ("sum dy", "sum dy*(x - m)")):
        assert_close(g, w, np.float64, scale=_scale(dy) * 16 + 1e-300, what=what)
    assert_close(gpu.rows_backward_apply(dy, x, a, m, b, d),
                 cpu.rows_backward_apply(dyr, xr, a, m, b, d), dtype, scale=8.0,
                 what="rows_backward_apply")
    mean, invstd = rng.standard_normal(R), rng.uniform(0.5, 2, R)
    gamma, beta = rng.standard_normal(L), rng.standard_normal(L)
    assert_close(gpu.ln_forward_apply(x, mean, invstd, gamma, beta),
                 cpu.ln_forward_apply(xr, mean, invstd, gamma, beta), dtype, scale=8.0,
                 what="ln_forward_apply")
    sa, sb, cols = gpu.ln_backward_sums(dy, x, mean, invstd, gamma)
    got = (sa, sb, cols[0], cols[1])
    sa, sb, cols = cpu.ln_backward_sums(dyr, xr, mean, invstd, gamma)
    want = (sa, sb, cols[0], cols[1])
    for g, w, what in zip(got, want, ("sum dy*g", "sum dy*g*xhat", "dgamma", "dbeta")):
        assert_close(g, w, np.float64, scale=_scale(dy) * 16 + 1e-300, what=what)
    ma, mb = rng.standard_normal(R), rng.standard_normal(R)
    assert_close(gpu.ln_backward_apply(dy, x, mean, invstd, gamma, ma, mb),
                 cpu.ln_backward_apply(dyr, xr, mean, invstd, gamma, ma, mb), dtype,
                 scale=16.0, what="ln_backward_apply")


def test_normalization_64bit_index_path_matches(host):
    """The 64-bit index path forced on small sizes gives the results of the 32-bit path."""
    from disttensor.ops.local.gpu import normalization as gpu
    rng = np.random.default_rng(9)
    x, dy = rng.standard_normal((4, 300)), rng.standard_normal((4, 300))
    p = [rng.standard_normal(4) for _ in range(4)]
    g = [rng.standard_normal(300) for _ in range(2)]

    def run():
        return (*gpu.row_moments(x), gpu.rows_backward_apply(dy, x, *p),
                gpu.ln_forward_apply(x, p[0], np.abs(p[1]), *g),
                *gpu.ln_backward_sums(dy, x, p[0], np.abs(p[1]), g[0]),
                gpu.ln_backward_apply(dy, x, p[0], np.abs(p[1]), g[0], p[2], p[3]))

    r32 = run()
    host_shim.set_index32_limit(0)
    r64 = run()
    for a, b in zip(r32, r64):
        np.testing.assert_array_equal(a, b)
