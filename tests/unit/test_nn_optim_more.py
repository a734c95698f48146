"""RMSprop, Adagrad, NAdam and RAdam against plain-Python float64 references written from
PyTorch's documented algorithms, and every optimizer's handling of ``grad is None`` (issue 19,
silent bug 1, optimizer side: a frozen or unused parameter is never decayed nor moved)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor.nn.optim import (SGD, Adagrad, Adam, AdamW, NAdam, RAdam, RMSprop,
                                 flatten_state)

from .test_nn_optim import P, continue_identically, grad_sequence, make_params

seeds = st.integers(0, 2**16)
steps = st.integers(1, 6)
lrs = st.sampled_from([0.0, 1e-3, 0.05, 0.3])


# -- references: one flat list of floats, grads may hold None (skipped) ----------------------
def ref_rmsprop(theta, grads, lr, alpha, eps, weight_decay, momentum, centered, maximize):
    n = len(theta)
    theta, v, a, b = list(theta), [0.0] * n, [0.0] * n, [0.0] * n
    for g in grads:
        if g is None:
            continue
        for k in range(n):
            gk = -g[k] if maximize else g[k]
            gk += weight_decay * theta[k]
            v[k] = alpha * v[k] + (1 - alpha) * gk * gk
            if centered:
                a[k] = alpha * a[k] + (1 - alpha) * gk
                avg = math.sqrt(v[k] - a[k] * a[k]) + eps
            else:
                avg = math.sqrt(v[k]) + eps
            if momentum > 0:
                b[k] = momentum * b[k] + gk / avg
                theta[k] -= lr * b[k]
            else:
                theta[k] -= lr * gk / avg
    return theta


def ref_adagrad(theta, grads, lr, lr_decay, weight_decay, initial_accumulator_value, eps,
                maximize):
    n = len(theta)
    theta, s, t = list(theta), [initial_accumulator_value] * n, 0
    for g in grads:
        if g is None:
            continue
        t += 1
        clr = lr / (1 + (t - 1) * lr_decay)
        for k in range(n):
            gk = (-g[k] if maximize else g[k]) + weight_decay * theta[k]
            s[k] += gk * gk
            theta[k] -= clr * gk / (math.sqrt(s[k]) + eps)
    return theta


def ref_nadam(theta, grads, lr, betas, eps, weight_decay, momentum_decay,
              decoupled_weight_decay, maximize):
    b1, b2 = betas
    n = len(theta)
    theta, m, v, t, prod = list(theta), [0.0] * n, [0.0] * n, 0, 1.0
    for g in grads:
        if g is None:
            continue
        t += 1
        mu = b1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))
        mu1 = b1 * (1 - 0.5 * 0.96 ** ((t + 1) * momentum_decay))
        prod *= mu
        for k in range(n):
            gk = -g[k] if maximize else g[k]
            if decoupled_weight_decay:
                theta[k] *= 1 - lr * weight_decay
            else:
                gk += weight_decay * theta[k]
            m[k] = b1 * m[k] + (1 - b1) * gk
            v[k] = b2 * v[k] + (1 - b2) * gk * gk
            denom = math.sqrt(v[k] / (1 - b2 ** t)) + eps
            theta[k] -= lr * (1 - mu) / (1 - prod) * gk / denom
            theta[k] -= lr * mu1 / (1 - prod * mu1) * m[k] / denom
    return theta


def ref_radam(theta, grads, lr, betas, eps, weight_decay, decoupled_weight_decay, maximize):
    b1, b2 = betas
    n = len(theta)
    theta, m, v, t = list(theta), [0.0] * n, [0.0] * n, 0
    rho_inf = 2 / (1 - b2) - 1
    for g in grads:
        if g is None:
            continue
        t += 1
        rho = rho_inf - 2 * t * b2 ** t / (1 - b2 ** t)
        for k in range(n):
            gk = -g[k] if maximize else g[k]
            if decoupled_weight_decay:
                theta[k] *= 1 - lr * weight_decay
            else:
                gk += weight_decay * theta[k]
            m[k] = b1 * m[k] + (1 - b1) * gk
            v[k] = b2 * v[k] + (1 - b2) * gk * gk
            m_hat = m[k] / (1 - b1 ** t)
            if rho > 5:
                r = math.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2)
                                                                 * rho))
                # PyTorch adds eps to sqrt(v) before the bias correction of v
                theta[k] -= lr * m_hat * r * math.sqrt(1 - b2 ** t) / (math.sqrt(v[k]) + eps)
            else:
                theta[k] -= lr * m_hat
    return theta


def run_and_check(cls, ref, kwargs, seed, nsteps, none_every):
    params = make_params(seed)
    theta0 = [p.data.ravel().tolist() for p in params]
    seq = grad_sequence(seed, nsteps, none_every=none_every)
    opt = cls(params, **kwargs)
    for gs in seq:
        for p, g in zip(params, gs):
            p.grad = None if g is None else g.copy()
        opt.step()
    for i, p in enumerate(params):
        flat = [None if gs[i] is None else gs[i].ravel().tolist() for gs in seq]
        expect = np.array(ref(theta0[i], flat, **kwargs)).reshape(p.data.shape)
        np.testing.assert_allclose(p.data, expect, rtol=1e-12, atol=1e-12)


RMSPROP = [dict(alpha=a, eps=e, weight_decay=w, momentum=m, centered=c, maximize=x)
           for a, e, w, m, c, x in itertools.product([0.99, 0.5], [1e-8, 1e-3], [0.0, 0.05],
                                                     [0.0, 0.9], [False, True], [False, True])]


@pytest.mark.parametrize("options", RMSPROP[::3], ids=str)
@settings(max_examples=6)
@given(lr=lrs, seed=seeds, nsteps=steps, none_every=st.sampled_from([0, 2]))
def test_rmsprop_matches_reference(options, lr, seed, nsteps, none_every):
    run_and_check(RMSprop, ref_rmsprop, dict(lr=lr, **options), seed, nsteps, none_every)


ADAGRAD = [dict(lr_decay=d, weight_decay=w, initial_accumulator_value=i, eps=e, maximize=x)
           for d, w, i, e, x in itertools.product([0.0, 0.1], [0.0, 0.05], [0.0, 0.3],
                                                  [1e-10, 1e-2], [False, True])]


@pytest.mark.parametrize("options", ADAGRAD[::2], ids=str)
@settings(max_examples=6)
@given(lr=lrs, seed=seeds, nsteps=steps, none_every=st.sampled_from([0, 2]))
def test_adagrad_matches_reference(options, lr, seed, nsteps, none_every):
    run_and_check(Adagrad, ref_adagrad, dict(lr=lr, **options), seed, nsteps, none_every)


BETAS = st.sampled_from([(0.9, 0.999), (0.3, 0.9), (0.0, 0.99), (0.9, 0.5)])


@pytest.mark.parametrize("wd, decoupled, maximize, psi",
                         [(0.0, False, False, 4e-3), (0.1, False, True, 4e-3),
                          (0.1, True, False, 0.05), (0.0, True, True, 0.0)])
@settings(max_examples=8)
@given(lr=lrs, seed=seeds, nsteps=steps, none_every=st.sampled_from([0, 2]), betas=BETAS,
       eps=st.sampled_from([1e-8, 1e-3]))
def test_nadam_matches_reference(wd, decoupled, maximize, psi, lr, seed, nsteps, none_every,
                                 betas, eps):
    kw = dict(lr=lr, betas=betas, eps=eps, weight_decay=wd, momentum_decay=psi,
              decoupled_weight_decay=decoupled, maximize=maximize)
    run_and_check(NAdam, ref_nadam, kw, seed, nsteps, none_every)


@pytest.mark.parametrize("wd, decoupled, maximize",
                         [(0.0, False, False), (0.1, False, True), (0.1, True, False)])
@settings(max_examples=8)
@given(lr=lrs, seed=seeds, nsteps=st.integers(1, 9), none_every=st.sampled_from([0, 2]),
       betas=BETAS, eps=st.sampled_from([1e-8, 1e-3]))
def test_radam_matches_reference(wd, decoupled, maximize, lr, seed, nsteps, none_every, betas,
                                 eps):
    kw = dict(lr=lr, betas=betas, eps=eps, weight_decay=wd, decoupled_weight_decay=decoupled,
              maximize=maximize)
    run_and_check(RAdam, ref_radam, kw, seed, nsteps, none_every)


def test_radam_takes_both_branches():
    # rho_t > 5 from step 6 on with beta2 = 0.999: the rectified branch is exercised
    b2 = 0.999
    rho_inf = 2 / (1 - b2) - 1
    rho = [rho_inf - 2 * t * b2 ** t / (1 - b2 ** t) for t in range(1, 9)]
    assert rho[0] <= 5 < rho[-1]
    run_and_check(RAdam, ref_radam, dict(lr=0.01, betas=(0.9, b2), eps=1e-8, weight_decay=0.0,
                                         decoupled_weight_decay=False, maximize=False),
                  0, 8, 0)


def test_defaults_are_pytorchs():
    ps = make_params(0)
    g = RMSprop(ps).param_groups[0]
    assert (g["lr"], g["alpha"], g["eps"], g["momentum"], g["centered"]) == (
        1e-2, 0.99, 1e-8, 0.0, False)
    g = Adagrad(ps).param_groups[0]
    assert (g["lr"], g["lr_decay"], g["eps"], g["initial_accumulator_value"]) == (
        1e-2, 0.0, 1e-10, 0.0)
    g = NAdam(ps).param_groups[0]
    assert (g["lr"], g["betas"], g["eps"], g["momentum_decay"],
            g["decoupled_weight_decay"]) == (2e-3, (0.9, 0.999), 1e-8, 4e-3, False)
    g = RAdam(ps).param_groups[0]
    assert (g["lr"], g["betas"], g["eps"], g["decoupled_weight_decay"]) == (
        1e-3, (0.9, 0.999), 1e-8, False)


@pytest.mark.parametrize("make, message", [
    (lambda ps: RMSprop(ps, lr=-1), "Invalid learning rate"),
    (lambda ps: RMSprop(ps, alpha=-0.1), "Invalid alpha value"),
    (lambda ps: RMSprop(ps, momentum=-0.1), "Invalid momentum value"),
    (lambda ps: Adagrad(ps, lr_decay=-1), "Invalid lr_decay value"),
    (lambda ps: Adagrad(ps, initial_accumulator_value=-1),
     "Invalid initial_accumulator_value value"),
    (lambda ps: Adagrad(ps, eps=-1), "Invalid epsilon value"),
    (lambda ps: NAdam(ps, betas=(1.0, 0.9)), "Invalid beta parameter at index 0"),
    (lambda ps: NAdam(ps, momentum_decay=-1), "Invalid momentum_decay value"),
    (lambda ps: RAdam(ps, betas=(0.9, -0.1)), "Invalid beta parameter at index 1"),
    (lambda ps: RAdam(ps, weight_decay=-1), "Invalid weight_decay value"),
])
def test_bad_options(make, message):
    with pytest.raises(ValueError, match=message):
        make(make_params(0))


def test_adagrad_state_exists_from_the_start():
    ps = make_params(0)
    opt = Adagrad(ps, initial_accumulator_value=0.25)
    sd = opt.state_dict()
    assert set(sd["state"]) == {0, 1, 2}
    assert sd["state"][1]["step"] == 0
    np.testing.assert_array_equal(sd["state"][1]["sum"], np.full(ps[1].data.shape, 0.25))


@pytest.mark.parametrize("make_opt", [
    lambda ps: RMSprop(ps, lr=0.01, momentum=0.9, centered=True, weight_decay=0.1),
    lambda ps: Adagrad([{"params": ps[:1], "lr": 0.05}, {"params": ps[1:]}], lr_decay=0.1),
    lambda ps: NAdam(ps, weight_decay=0.1, decoupled_weight_decay=True),
    lambda ps: RAdam(ps, betas=(0.5, 0.9)),
], ids=["RMSprop", "Adagrad-groups", "NAdam", "RAdam"])
@settings(max_examples=4)
@given(seed=seeds)
def test_state_dict_round_trip_continues_identically(make_opt, seed):
    continue_identically(make_opt, seed)


def test_state_names():
    ps = make_params(0)
    expect = {RMSprop: {"step", "square_avg", "momentum_buffer", "grad_avg"},
              Adagrad: {"step", "sum"}, NAdam: {"step", "mu_product", "exp_avg", "exp_avg_sq"},
              RAdam: {"step", "exp_avg", "exp_avg_sq"}}
    for cls, names in expect.items():
        kw = dict(momentum=0.5, centered=True) if cls is RMSprop else {}
        opt = cls(ps, **kw)
        for p in ps:
            p.grad = np.ones_like(p.data)
        opt.step()
        sd = opt.state_dict()
        assert set(sd["state"][0]) == names
        host, scalars = flatten_state(sd)
        assert isinstance(scalars["optim.state.0.step"], int)


# -- grad None: never moved, never decayed (silent bug 1, optimizer side) -------------------
ALL = [
    lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1),
    lambda ps: Adam(ps, lr=0.1, weight_decay=0.1),
    lambda ps: AdamW(ps, lr=0.1, weight_decay=0.1),
    lambda ps: RMSprop(ps, weight_decay=0.1, momentum=0.9, centered=True),
    lambda ps: Adagrad(ps, weight_decay=0.1),
    lambda ps: NAdam(ps, weight_decay=0.1, decoupled_weight_decay=True),
    lambda ps: RAdam(ps, weight_decay=0.1, decoupled_weight_decay=True),
]
NAMES = ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "NAdam", "RAdam"]


@pytest.mark.parametrize("make", ALL, ids=NAMES)
@pytest.mark.parametrize("path", ["step", "step_parameter"])
def test_none_grad_is_skipped(make, path):
    """A parameter that never gets a gradient (frozen, or unused in forward) stays bit for
    bit where it was, and one whose gradient is None on some steps does not move on them and
    its step count does not advance."""
    ps = [P(np.linspace(-1, 1, 6).reshape(2, 3)), P(np.linspace(1, 2, 4)),
          P(np.linspace(-3, -2, 5))]
    frozen0, later0 = ps[1].data.copy(), ps[2].data.copy()
    opt = make(ps)
    state_before = {k: dict(v) for k, v in opt.state_dict()["state"].items()}
    for t in range(4):
        grads = [np.full(ps[0].data.shape, 0.5), None, None if t < 2 else np.ones(5)]
        if path == "step":
            for p, g in zip(ps, grads):
                p.grad = g
            opt.step()
        else:
            for p, g in zip(ps, grads):
                if g is not None:
                    opt.step_parameter(p, g)
        if t < 2:
            np.testing.assert_array_equal(ps[2].data, later0)
        if t == 2:
            moved = ps[2].data.copy()
    np.testing.assert_array_equal(ps[1].data, frozen0)
    assert not np.array_equal(ps[2].data, moved)
    sd = opt.state_dict()["state"]
    if "step" in sd[0]:
        assert sd[0]["step"] == 4
    if 1 in sd:   # Adagrad: its initial state, untouched
        assert sd[1]["step"] == 0
        np.testing.assert_array_equal(sd[1]["sum"], state_before[1]["sum"])
    if "step" in sd.get(2, {}):
        assert sd[2]["step"] == 2
