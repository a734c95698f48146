"""The optimizers' NumPy paths, the one-pass compiled update (``ops/local/cpu/optim_update``,
C-contiguous parameters) and the one whose temporaries live in scratch buffers shared by the
parameters (coefficients in 0-d arrays; strided parameters), give bit-for-bit the parameters
and state of the plain expressions (taken here through an ndarray subclass, which both leave
alone), and all match a float64 reference of PyTorch's Adam formula; the scratch never enters
the state dict, and a steady step of either allocates no NumPy array."""
from __future__ import annotations

import math

import numpy as np
import pytest

from disttensor.nn.optim import SGD, Adagrad, Adam, AdamW, NAdam, RAdam, RMSprop
from disttensor.testing.allocations import numpy_allocations


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
    "rmsprop": (RMSprop, dict(lr=0.01)),
    "rmsprop-centered-mom-wd-max": (RMSprop, dict(lr=0.01, alpha=0.9, momentum=0.5,
                                                  centered=True, weight_decay=0.1,
                                                  maximize=True)),
    "rmsprop-centered-lerp-high": (RMSprop, dict(lr=0.01, alpha=0.3, centered=True)),
    "adagrad": (Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.1)),
    "adagrad-max": (Adagrad, dict(lr=0.1, initial_accumulator_value=0.5, maximize=True)),
    "nadam": (NAdam, dict(lr=0.02, weight_decay=0.1)),
    "nadam-decoupled-max": (NAdam, dict(lr=0.02, weight_decay=0.1, decoupled_weight_decay=True,
                                        maximize=True, betas=(0.4, 0.99))),
    "radam": (RAdam, dict(lr=0.02, weight_decay=0.1)),
    "radam-decoupled-max": (RAdam, dict(lr=0.02, weight_decay=0.1, decoupled_weight_decay=True,
                                        maximize=True, betas=(0.3, 0.9))),
}
SHAPES = [(3, 4, 5), (7,), (2, 50)]   # different sizes: the shared scratch grows and is reused
PATHS = ("compiled", "scratch")       # C-contiguous parameters; strided views of a larger array


def run(case, dtype, path, steps=8):
    """``path``: "compiled" (C-contiguous NumPy parameters: the one-pass update), "scratch"
    (strided views, which the compiled pass refuses) or "plain" (an ndarray subclass)."""
    cls, kw = CASES[case]
    rng = np.random.default_rng(5)
    params = []
    for s in SHAPES:
        d = rng.standard_normal(s).astype(dtype)
        if path == "scratch":
            wide = np.zeros(s + (2,), dtype)
            wide[..., 0] = d
            d = wide[..., 0]
        params.append(Param(d.view(Plain) if path == "plain" else d))
    opt = cls(params, **kw)
    for _ in range(steps):
        for p in params:
            g = rng.standard_normal(p.data.shape).astype(dtype)
            p.grad = g.view(Plain) if path == "plain" else g
        opt.step()
    return [np.asarray(p.data) for p in params], opt


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("path", PATHS)
def test_scratch_path_is_bit_identical(case, dtype, path):
    got, opt = run(case, dtype, path)
    want, ref = run(case, dtype, "plain")
    for a, b in zip(got, want):
        assert a.dtype == dtype and a.tobytes() == b.tobytes()
    for p, q in zip(opt._indexed_params(), ref._indexed_params()):
        s, r = opt.state[p], ref.state[q]
        assert sorted(s) == sorted(r)
        for k in s:
            assert np.asarray(s[k]).tobytes() == np.asarray(r[k]).tobytes(), k
    if path == "compiled":   # the compiled pass ran (the scratch path would have made buffers)
        assert "_scratch_buffers" not in opt.__dict__
    else:
        assert opt.__dict__.get("_scratch_buffers")       # the scratch path ran
    assert "_scratch_buffers" not in ref.__dict__         # the plain one did not
    sd = opt.state_dict()
    assert all(set(v) <= {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq",
                          "momentum_buffer", "square_avg", "grad_avg", "sum", "mu_product"}
               for v in sd["state"].values())


@pytest.mark.parametrize("case", sorted(CASES))
def test_steady_step_allocates_no_array(case):
    """After the first step (state and scratch made), a step on NumPy parameters (compiled
    pass or scratch path) asks NumPy for no data buffer; the plain path (an ndarray
    subclass) asks for some, which shows the count sees the update's temporaries."""
    for path in PATHS + ("plain",):
        _, opt = run(case, np.float32, path, steps=2)
        with numpy_allocations() as seen:
            opt.step()
        assert (seen.count == 0) != (path == "plain"), (case, path, seen)


def test_strided_adam_parameters_take_the_scratch_path():
    """A parameter that is a strided view (not C-contiguous) takes the scratch path, with
    the bits of the compiled pass on a contiguous copy."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal((6, 8)).astype(np.float32)
    strided, contiguous = Param(base[:, ::2]), Param(base[:, ::2].copy())
    opts = [Adam([p], lr=0.1, amsgrad=True) for p in (strided, contiguous)]
    for _ in range(3):
        g = rng.standard_normal(contiguous.data.shape).astype(np.float32)
        strided.grad, contiguous.grad = g, g.copy()
        for o in opts:
            o.step()
    assert opts[0].__dict__.get("_scratch_buffers")        # the NumPy passes ran
    assert "_scratch_buffers" not in opts[1].__dict__       # the compiled pass ran
    assert strided.data.tobytes() == contiguous.data.tobytes()


def test_adam_matches_float64_reference():
    got, _ = run("adam", np.float64, "compiled", steps=3)
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
