"""kernels/losses.cu on the host through the real wrapper (gpu/losses.py) against the CPU
kernels (ops/local/cpu/losses.py): cross-entropy / NLL with labels (weights, ignore index,
labels out of range, smoothing), with probabilities, the six elementwise losses with weights,
the soft Dice sums (one and several blocks per sample) and backward; layouts (N, C) to
(N, C, D, H, W), empty batches and channels, three dtypes (float16 against the CPU kernels
on the exactly widened float32 input)."""
from __future__ import annotations

import numpy as np
import pytest

from disttensor.ops.local.cpu import losses as cpu
from host_helpers import DTYPES, assert_close, rand, reference_input

SHAPES = [(3, 4), (2, 3, 5), (2, 3, 700), (1, 2, 3, 4, 5), (0, 3, 4), (2, 3, 0)]
IDS = ["x".join(map(str, s)) for s in SHAPES]
DT = dict(argnames="dtype", argvalues=DTYPES, ids=lambda d: np.dtype(d).name)


def _labels(rng, shape, ignore):
    lab = rng.integers(0, shape[1], (shape[0],) + shape[2:]) if shape[1] else \
        np.zeros((shape[0],) + shape[2:], np.int64)
    flat = lab.reshape(-1)
    if flat.size > 4:
        flat[0] = ignore
        flat[1] = shape[1] + 2          # out of range: contributes nothing
    return lab


def _scale(a):
    return float(np.abs(np.asarray(a, np.float64)).max(initial=0.0)) * 4 + 1e-300


@pytest.mark.parametrize(**DT)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("eps,log_input", [(0.0, False), (0.2, False), (0.0, True)])
def test_class_ce_matches_cpu(host, shape, dtype, eps, log_input):
    from disttensor.ops.local.gpu import losses as gpu
    rng = np.random.default_rng(len(shape) * 11 + shape[-1])
    x = rand(rng, shape, dtype) * 3
    w = rng.uniform(0.5, 2.0, shape[1])
    xr = reference_input(x)
    for ignore in (-7, 1):      # below the classes, and one of them
        lab = _labels(rng, shape, ignore)
        loss, den = gpu.class_ce_forward(x, lab, w, ignore, eps, log_input)
        lr, dr = cpu.class_ce_forward(xr, lab, w, ignore, eps, log_input)
        assert_close(loss, lr, np.float64, scale=_scale(lr), what="loss")
        np.testing.assert_array_equal(den, dr)
        gv = rng.uniform(0.5, 1.5, lr.shape)
        for gvox in (None, gv):
            dx = gpu.class_ce_backward(x, lab, w, ignore, eps, log_input, gvox, 0.7)
            dxr = cpu.class_ce_backward(xr, lab, w, ignore, eps, log_input, gvox, 0.7)
            assert_close(dx, dxr, dtype, scale=_scale(dxr), what="dx")


@pytest.mark.parametrize(**DT)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_prob_ce_matches_cpu(host, shape, dtype):
    from disttensor.ops.local.gpu import losses as gpu
    rng = np.random.default_rng(shape[0] + 5 * len(shape))
    x = rand(rng, shape, dtype) * 3
    t = rng.uniform(0, 1, shape)
    w = rng.uniform(0.5, 2.0, shape[1])
    xr = reference_input(x)
    loss = gpu.prob_ce_forward(x, t, w, 0.1)
    lr = cpu.prob_ce_forward(xr, t, w, 0.1)
    assert_close(loss, lr, np.float64, scale=_scale(lr), what="loss")
    gv = rng.uniform(0.5, 1.5, lr.shape)
    dx = gpu.prob_ce_backward(x, t, w, 0.1, gv, 1.3)
    dxr = cpu.prob_ce_backward(xr, t, w, 0.1, gv, 1.3)
    assert_close(dx, dxr, dtype, scale=_scale(dxr), what="dx")


@pytest.mark.parametrize(**DT)
@pytest.mark.parametrize("name", cpu.POINTWISE_LOSSES)
@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 3, 300), (0, 4)], ids=str)
def test_pointwise_losses_match_cpu(host, name, shape, dtype):
    from disttensor.ops.local.gpu import losses as gpu
    rng = np.random.default_rng(shape[-1] + len(name))
    if name == "bce":
        x = rng.uniform(0.01, 0.99, shape).astype(dtype)
        if x.size > 2 and dtype != np.float16:   # (1e12 gradients overflow float16)
            x.reshape(-1)[:2] = (0, 1)          # the clamped logs
        t = rng.uniform(0, 1, shape)
    else:
        x = rand(rng, shape, dtype) * 3
        t = rng.standard_normal(shape) * (1 if name != "bce_with_logits" else 0) + \
            (rng.uniform(0, 1, shape) if name == "bce_with_logits" else 0)
        if x.size > 2:
            t.reshape(-1)[0] = float(x.reshape(-1)[0])   # d == 0 (sign conventions)
    w = rng.uniform(0.5, 2.0, shape) if name.startswith("bce") else None
    pw = rng.uniform(0.5, 3.0, shape) if name == "bce_with_logits" else None
    xr = reference_input(x)
    for param in ((0.0, 0.6) if name == "smooth_l1" else (0.6,)):
        out = gpu.pointwise_loss_forward(name, x, t, param, w, pw)
        ref = cpu.pointwise_loss_forward(name, xr, t, param, w, pw)
        assert_close(out, ref, np.float64, scale=_scale(ref), what=f"{name} loss")
        gv = rng.uniform(0.5, 1.5, shape)
        for gvox in (None, gv):
            dx = gpu.pointwise_loss_backward(name, x, t, param, w, pw, gvox, 0.9)
            dxr = cpu.pointwise_loss_backward(name, xr, t, param, w, pw, gvox, 0.9)
            assert_close(dx, dxr, dtype, scale=_scale(dxr), what=f"{name} dx")


@pytest.mark.parametrize(**DT)
@pytest.mark.parametrize("shape", SHAPES + [(2, 3, 40, 30)], ids=IDS + ["2x3x40x30"])
@pytest.mark.parametrize("activation", cpu.DICE_ACTIVATIONS)
@pytest.mark.parametrize("labels", [True, False], ids=["labels", "float"])
def test_dice_matches_cpu(host, shape, dtype, activation, labels):
    from disttensor.ops.local.gpu import losses as gpu
    rng = np.random.default_rng(shape[-1] + len(shape) + len(activation))
    x = rand(rng, shape, dtype) * 2
    target = _labels(rng, shape, 0) if labels else rng.uniform(0, 1, shape)
    xr = reference_input(x)
    for squared in (False, True):
        s = gpu.dice_sums(x, target, activation, squared)
        sr = cpu.dice_sums(xr, target, activation, squared)
        assert_close(s, sr, np.float64,
                     scale=_scale(sr) * max(1, int(np.prod(shape[2:]))), what="sums")
        alpha = rng.standard_normal(shape[:2])
        beta = rng.standard_normal(shape[:2])
        dx = gpu.dice_backward(x, target, alpha, beta, activation, squared)
        dxr = cpu.dice_backward(xr, target, alpha, beta, activation, squared)
        assert_close(dx, dxr, dtype, scale=_scale(dxr), what="dice dx")
