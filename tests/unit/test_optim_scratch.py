"""The optimizers' NumPy paths, the one whose temporaries live in scratch buffers shared by
the parameters and Adam's one compiled pass (``ops/local/cpu/optim_update``: no amsgrad, no
maximize, no coupled weight decay), give bit-for-bit the parameters and state of the plain
expressions (taken here through an ndarray subclass, which both leave alone), and all match a
float64 reference of PyTorch's Adam formula; the scratch never enters the state dict."""
from __future__ import annotations

import math

import numpy as np
import pytest

from disttensor.nn import optim
from disttensor.nn.optim import SGD, Adam, AdamW


class Plain(np.ndarray):
    """An ndarray the optimizers treat as foreign: the plain (allocating) expressions run."""


class Param:
    def __init__(self, data):
        self.data, self.grad, self.requires_grad = data, None, True


CASES = {
    "adam": (Adam, dict(lr=0.01, betas=(0.9, 0.99))),
    "adam-wd-ams-max": (Adam, dict(lr=0.01, weight_decay=0.1, amsgrad=True, maximize=True)),
    "adamw": (AdamW, dict(lr=0.02, weight_decay=0.05)),
    "sgd": (SGD, dict(lr=0.05)),
    "sgd-mom-wd": (SGD, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-2)),
    "sgd-nesterov-max": (SGD, dict(lr=0.05, momentum=0.8, nesterov=True, maximize=True)),
}
FUSED = {"adam", "adamw"}   # Adam's compiled pass (no scratch); the others take the scratch
SHAPES = [(3, 4, 5), (7,), (2, 50)]   # different sizes: the shared scratch grows and is reused


def run(case, dtype, plain, steps=4):
    cls, kw = CASES[case]
    rng = np.random.default_rng(5)
    params = []
    for s in SHAPES:
        d = rng.standard_normal(s).astype(dtype)
        params.append(Param(d.view(Plain) if plain else d))
    opt = cls(params, **kw)
    for _ in range(steps):
        for p in params:
            g = rng.standard_normal(p.data.shape).astype(dtype)
            p.grad = g.view(Plain) if plain else g
        opt.step()
    return [np.asarray(p.data) for p in params], opt


@pytest.fixture
def scratch_for_all(monkeypatch):
    """The scratch path for parameters of any size (by default only from 4096 elements)."""
    monkeypatch.setattr(optim, "_SCRATCH_MIN_SIZE", 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_scratch_path_is_bit_identical(case, dtype, scratch_for_all):
    got, opt = run(case, dtype, plain=False)
    want, ref = run(case, dtype, plain=True)
    for a, b in zip(got, want):
        assert a.dtype == dtype and a.tobytes() == b.tobytes()
    for p, q in zip(opt._indexed_params(), ref._indexed_params()):
        s, r = opt.state[p], ref.state[q]
        assert sorted(s) == sorted(r)
        for k in s:
            assert np.asarray(s[k]).tobytes() == np.asarray(r[k]).tobytes(), k
    if case in FUSED:   # the compiled pass ran (the scratch path would have made buffers)
        assert "_scratch_buffers" not in opt.__dict__
    else:
        assert opt.__dict__.get("_scratch_buffers")       # the scratch path ran
    assert "_scratch_buffers" not in ref.__dict__         # the plain one did not
    sd = opt.state_dict()
    assert all(set(v) <= {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq",
                          "momentum_buffer"} for v in sd["state"].values())


def test_small_parameters_take_the_plain_path():
    _, opt = run("adam-wd-ams-max", np.float32, plain=False, steps=1)
    assert "_scratch_buffers" not in opt.__dict__       # all under 4096 elements
    big = Param(np.ones(optim._SCRATCH_MIN_SIZE, np.float32))
    big.grad = np.full(big.data.shape, 0.5, np.float32)
    opt = Adam([big], lr=0.1, amsgrad=True)
    opt.step()
    assert opt.__dict__.get("_scratch_buffers")           # a large one takes the scratch
    np.testing.assert_allclose(big.data, 0.9, rtol=1e-6)   # first Adam step: lr * sign


def test_adam_matches_float64_reference(scratch_for_all):
    got, _ = run("adam", np.float64, plain=False, steps=3)
    rng = np.random.default_rng(5)
    ps = [rng.standard_normal(s) for s in SHAPES]
    m = [np.zeros_like(p) for p in ps]
    v = [np.zeros_like(p) for p in ps]
    lr, b1, b2, eps = 0.01, 0.9, 0.99, 1e-8
    for t in range(1, 4):
        for i, p in enumerate(ps):
            g = rng.standard_normal(p.shape)
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            denom = np.sqrt(v[i]) / math.sqrt(1 - b2 ** t) + eps
            ps[i] = p - lr / (1 - b1 ** t) * (m[i] / denom)
    for a, b in zip(got, ps):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
