"""The optimizers' compiled passes (``ops/local/cpu/optim_update``) on parameters of every
size give the bits of the plain NumPy expressions (taken through an ndarray subclass, which
the compiled pass and the scratch path leave alone) over the options of every optimizer, in
float32 and float64, including sizes that leave a remainder after the vectorised part of the
loop, and where a division by zero makes ``inf`` or ``nan`` (``eps=0`` with a zero
gradient), as NumPy does."""
from __future__ import annotations

import numpy as np
import pytest

from disttensor.nn.optim import SGD, Adagrad, Adam, AdamW, NAdam, RAdam, RMSprop


class Plain(np.ndarray):
    """An ndarray the optimizers treat as foreign: the plain (allocating) expressions run."""


class Param:
    def __init__(self, data):
        self.data, self.grad, self.requires_grad = data, None, True


SIZES = [(1,), (4099,), (3, 1703)]     # 1 element; above the old small-parameter limit; odd
OPTIONS = {
    "plain": (Adam, dict(lr=0.01, betas=(0.8, 0.95))),
    "l2": (Adam, dict(lr=0.01, weight_decay=0.1)),
    "amsgrad": (Adam, dict(lr=0.01, amsgrad=True)),
    "maximize-l2-amsgrad": (Adam, dict(lr=0.02, weight_decay=0.05, amsgrad=True,
                                       maximize=True)),
    "adamw": (AdamW, dict(lr=0.02, weight_decay=0.05)),
    "adamw-maximize-amsgrad": (AdamW, dict(lr=0.02, weight_decay=0.3, amsgrad=True,
                                           maximize=True)),
    "sgd": (SGD, dict(lr=0.05)),
    "sgd-l2-maximize": (SGD, dict(lr=0.05, weight_decay=0.1, maximize=True)),
    "sgd-momentum-dampening": (SGD, dict(lr=0.05, momentum=0.9, dampening=0.2,
                                         weight_decay=0.01)),
    "sgd-nesterov-maximize": (SGD, dict(lr=0.05, momentum=0.7, nesterov=True,
                                        maximize=True)),
    "rmsprop": (RMSprop, dict(lr=0.01)),
    "rmsprop-centered-momentum-l2": (RMSprop, dict(lr=0.01, alpha=0.9, momentum=0.5,
                                                   centered=True, weight_decay=0.1)),
    "rmsprop-centered-lerp-high-maximize": (RMSprop, dict(lr=0.01, alpha=0.2, centered=True,
                                                          maximize=True)),
    "adagrad-l2-decay": (Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.1)),
    "adagrad-maximize": (Adagrad, dict(lr=0.1, initial_accumulator_value=0.5, maximize=True)),
    "nadam-l2": (NAdam, dict(lr=0.02, weight_decay=0.1)),
    "nadam-decoupled-maximize-lerp-high": (NAdam, dict(lr=0.02, weight_decay=0.1, maximize=True,
                                                       decoupled_weight_decay=True,
                                                       betas=(0.4, 0.99))),
    "radam-l2": (RAdam, dict(lr=0.02, weight_decay=0.1)),   # (rho_t > 5 from step 6)
    "radam-decoupled-maximize-lerp-high": (RAdam, dict(lr=0.02, weight_decay=0.1, maximize=True,
                                                       decoupled_weight_decay=True,
                                                       betas=(0.3, 0.9))),
}


def run(case, dtype, plain, steps=7, zero_every=0):
    cls, kw = OPTIONS[case]
    rng = np.random.default_rng(11)
    params = []
    for s in SIZES:
        d = rng.standard_normal(s).astype(dtype)
        params.append(Param(d.view(Plain) if plain else d))
    opt = cls(params, **kw)
    for k in range(steps):
        for p in params:
            g = rng.standard_normal(p.data.shape).astype(dtype)
            if zero_every and k % zero_every == 0:
                g[..., ::3] = 0       # amsgrad's max then holds where v shrinks
            p.grad = g.view(Plain) if plain else g
        opt.step()
    return params, opt


def assert_same_bits(got, want):
    (pg, og), (pw, ow) = got, want
    for a, b in zip(pg, pw):
        assert a.data.dtype == b.data.dtype and np.asarray(a.data).tobytes() == \
            np.asarray(b.data).tobytes()
    for p, q in zip(og._indexed_params(), ow._indexed_params()):
        s, r = og.state[p], ow.state[q]
        assert sorted(s) == sorted(r)
        for k in s:
            assert np.asarray(s[k]).tobytes() == np.asarray(r[k]).tobytes(), k


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(OPTIONS))
def test_compiled_pass_is_bit_identical_at_every_size(case, dtype):
    got = run(case, dtype, plain=False, zero_every=2)
    want = run(case, dtype, plain=True, zero_every=2)
    assert "_scratch_buffers" not in got[1].__dict__     # the compiled pass ran, every size
    assert_same_bits(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_division_by_zero_gives_numpy_inf_and_nan(dtype):
    """``eps=0`` and a zero gradient: ``m / denom`` is ``0 / 0`` on the first step (nan) as
    in NumPy, on small and large parameters alike, with no exception."""
    def steps(plain):
        ps = [Param(np.ones(s, dtype)) for s in SIZES]
        for p in ps:
            p.data = p.data.view(Plain) if plain else p.data
        opt = Adam(ps, lr=0.1, eps=0.0)
        for k in range(2):
            for p in ps:
                g = np.zeros(p.data.shape, dtype)
                g.reshape(-1)[1::2] = 1.0 if k else 0.0
                p.grad = g.view(Plain) if plain else g
            with np.errstate(divide="ignore", invalid="ignore"):
                opt.step()
        return ps, opt
    got, want = steps(False), steps(True)
    assert np.isnan(got[0][0].data).all()
    assert_same_bits(got, want)
