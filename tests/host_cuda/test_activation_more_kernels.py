"""kernels/activations_more.cu on the host through the real wrappers
(gpu/activations_more.py) against the CPU kernels (ops/local/cpu/activations_more.py): GELU
(exact and tanh), SiLU, Softplus, Mish, Hardswish, Hardsigmoid forward and backward, PReLU
with one and per-channel weights; kinks, NaN/inf, empty arrays, three dtypes."""
from __future__ import annotations

import numpy as np
import pytest

from disttensor.ops.local.cpu import activations_more as cpu_am
from host_helpers import DTYPES, assert_close, rand, reference_input



@pytest.fixture
def am_host(host, monkeypatch):
    """The host build, with gpu/activations_more.py's ``cupy`` giving NumPy too (host_shim
    patches the wrappers it knows)."""
    from disttensor.ops.local.gpu import activations_more as gpu_am
    monkeypatch.setattr(gpu_am, "cupy", lambda: np)
    return host


DT = dict(argnames="dtype", argvalues=DTYPES, ids=lambda d: np.dtype(d).name)
# the GPU computes float32 (and float16) in float32, the CPU reference in float64: a few ulp
# of float32 transcendentals on top of the common tolerance
TOL_SCALE = {np.float64: 1.0, np.float32: 4.0, np.float16: 1.0}


@pytest.mark.parametrize(**DT)
@pytest.mark.parametrize("name", cpu_am.POINTWISE_ACTIVATIONS)
@pytest.mark.parametrize("shape", [(3, 4, 5), (1, 1), (2, 3, 300), (0, 4)], ids=str)
def test_pointwise_activations_match_cpu(am_host, name, shape, dtype):
    from disttensor.ops.local.gpu import activations_more as gpu_am
    rng = np.random.default_rng(shape[-1] + len(name))
    x = rand(rng, shape, dtype, nan=True) * 4
    if x.size > 8:
        x.reshape(-1)[:5] = (0.0, -3.0, 3.0, 25.0, -25.0)   # kinks, thresholds, tails
    kw = dict(beta=1.5, threshold=10.0) if name == "softplus" else {}
    y = gpu_am.pointwise_activation_forward(name, x, **kw)
    yr = cpu_am.pointwise_activation_forward(name, reference_input(x), **kw)
    xr = reference_input(x)
    # the terms' magnitude is |x| (x/2 * (1 + tanh(...)) cancels in the negative tail)
    scale = np.abs(xr[np.isfinite(xr)]).max(initial=0) * TOL_SCALE[dtype]
    assert_close(y, yr.astype(reference_input(x).dtype), dtype, scale=scale,
                 what=f"{name} forward")
    dy = rand(rng, shape, dtype)
    dx = gpu_am.pointwise_activation_backward(name, dy, x, **kw)
    dxr = cpu_am.pointwise_activation_backward(name, reference_input(dy), reference_input(x),
                                               **kw)
    assert_close(dx, dxr, dtype, scale=np.abs(reference_input(dy)).max(initial=0) * 4
                 * TOL_SCALE[dtype], what=f"{name} backward")


@pytest.mark.parametrize(**DT)
@pytest.mark.parametrize("shape, nw", [((3, 4, 5), 4), ((2, 3, 7, 2), 1), ((2, 5), 5),
                                       ((0, 3, 4), 3), ((4, 2, 300), 2)], ids=str)
def test_prelu_matches_cpu(am_host, shape, nw, dtype):
    from disttensor.ops.local.gpu import activations_more as gpu_am
    rng = np.random.default_rng(nw + len(shape))
    x = rand(rng, shape, dtype) * 2
    if x.size:
        x.reshape(-1)[0] = 0.0
    w = rng.uniform(-0.5, 0.5, nw)
    y = gpu_am.prelu_forward(x, w)
    assert_close(y, cpu_am.prelu_forward(reference_input(x), w), dtype, what="prelu forward")
    dy = rand(rng, shape, dtype)
    dx, dw = gpu_am.prelu_backward(dy, x, w)
    dxr, dwr = cpu_am.prelu_backward(reference_input(dy), reference_input(x), w)
    assert_close(dx, dxr, dtype, what="prelu dx")
    terms = np.abs(reference_input(x).astype(np.float64) * reference_input(dy)).sum()
    assert_close(dw, dwr, np.float64, scale=terms, what="prelu dw")
