"""disttensor.nn optimizers, LR schedulers, gradient clipping and GradScaler against
independent reference implementations (plain Python loops over the elements, float64, written
from PyTorch's documented algorithms)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor.io.checkpoint import _from_attr, _scalar_value
from disttensor.io.layout import check_dataset_name
from disttensor.nn import lr_scheduler as sched
from disttensor.nn.amp import GradScaler
from disttensor.nn.optim import SGD, Adam, AdamW, flatten_state, unflatten_state
from disttensor.nn.utils import clip_grad_norm_, clip_grad_value_

SHAPES = [(3, 4), (5,), (2, 1, 3)]


class P:
    """Stand-in for disttensor.nn.Parameter: data, grad, requires_grad."""

    def __init__(self, data):
        self.data = data
        self.grad = None
        self.requires_grad = True


def make_params(seed, dtype=np.float64, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [P(rng.normal(size=s).astype(dtype)) for s in shapes]


def grad_sequence(seed, steps, shapes=SHAPES, none_every=0):
    """Random gradients per step; with ``none_every`` the last parameter has no gradient on
    every ``none_every``-th step."""
    rng = np.random.default_rng(seed + 1000)
    seq = []
    for t in range(steps):
        gs = [rng.normal(size=s) for s in shapes]
        if none_every and t % none_every == 1:
            gs[-1] = None
        seq.append(gs)
    return seq


# -- references ------------------------------------------------------------------------------
def ref_sgd(theta, grads, lr, momentum, dampening, weight_decay, nesterov, maximize):
    """PyTorch's documented SGD on one flat list of floats; ``grads`` may hold None (skip)."""
    theta = list(theta)
    buf = None
    for g in grads:
        if g is None:
            continue
        new = []
        for k in range(len(theta)):
            gk = -g[k] if maximize else g[k]
            if weight_decay != 0:
                gk = gk + weight_decay * theta[k]
            new.append(gk)
        if momentum != 0:
            if buf is None:
                buf = list(new)
            else:
                buf = [momentum * b + (1 - dampening) * x for b, x in zip(buf, new)]
            if nesterov:
                new = [x + momentum * b for x, b in zip(new, buf)]
            else:
                new = list(buf)
        theta = [th - lr * x for th, x in zip(theta, new)]
    return theta


def ref_adam(theta, grads, lr, betas, eps, weight_decay, amsgrad, maximize, decoupled):
    """PyTorch's documented Adam / AdamW on one flat list of floats."""
    b1, b2 = betas
    n = len(theta)
    theta = list(theta)
    m, v, vmax = [0.0] * n, [0.0] * n, [0.0] * n
    t = 0
    for g in grads:
        if g is None:
            continue
        t += 1
        for k in range(n):
            gk = -g[k] if maximize else g[k]
            if weight_decay != 0:
                if decoupled:
                    theta[k] = theta[k] - lr * weight_decay * theta[k]
                else:
                    gk = gk + weight_decay * theta[k]
            m[k] = b1 * m[k] + (1 - b1) * gk
            v[k] = b2 * v[k] + (1 - b2) * gk * gk
            m_hat = m[k] / (1 - b1 ** t)
            if amsgrad:
                vmax[k] = max(vmax[k], v[k])
                v_hat = vmax[k] / (1 - b2 ** t)
            else:
                v_hat = v[k] / (1 - b2 ** t)
            theta[k] = theta[k] - lr * m_hat / (math.sqrt(v_hat) + eps)
    return theta


def run_and_check(opt_factory, ref, kwargs, seed, steps, none_every=0):
    params = make_params(seed)
    theta0 = [p.data.ravel().tolist() for p in params]
    seq = grad_sequence(seed, steps, none_every=none_every)
    opt = opt_factory(params, **kwargs)
    for gs in seq:
        for p, g in zip(params, gs):
            p.grad = None if g is None else g.copy()
        opt.step()
    for i, p in enumerate(params):
        flat_grads = [None if gs[i] is None else gs[i].ravel().tolist() for gs in seq]
        expect = np.array(ref(theta0[i], flat_grads, **kwargs)).reshape(p.data.shape)
        np.testing.assert_allclose(p.data, expect, rtol=1e-12, atol=1e-12)
    return opt, params


lrs = st.sampled_from([0.0, 1e-3, 0.05, 0.3])
seeds = st.integers(0, 2**16)
steps = st.integers(1, 6)

SGD_OPTIONS = [dict(momentum=m, dampening=d, nesterov=n, weight_decay=w, maximize=x)
               for m, d, n, w, x in itertools.product([0.0, 0.9], [0.0, 0.25], [False, True],
                                                      [0.0, 0.01], [False, True])
               if not (n and (m == 0 or d != 0))]


@pytest.mark.parametrize("options", SGD_OPTIONS, ids=str)
@settings(max_examples=8)
@given(lr=lrs, seed=seeds, nsteps=steps, none_every=st.sampled_from([0, 2]))
def test_sgd_matches_reference(options, lr, seed, nsteps, none_every):
    run_and_check(SGD, ref_sgd, dict(lr=lr, **options), seed, nsteps, none_every)


ADAM_OPTIONS = [dict(weight_decay=w, amsgrad=a, maximize=x)
                for w, a, x in itertools.product([0.0, 0.05], [False, True], [False, True])]


@pytest.mark.parametrize("decoupled", [False, True], ids=["Adam", "AdamW"])
@pytest.mark.parametrize("options", ADAM_OPTIONS, ids=str)
@settings(max_examples=8)
@given(lr=lrs, seed=seeds, nsteps=steps, none_every=st.sampled_from([0, 2]),
       betas=st.sampled_from([(0.9, 0.999), (0.5, 0.9), (0.0, 0.99), (0.99, 0.0)]),
       eps=st.sampled_from([1e-8, 1e-3, 0.0]))
def test_adam_matches_reference(decoupled, options, lr, seed, nsteps, none_every, betas, eps):
    cls = AdamW if decoupled else Adam
    kwargs = dict(lr=lr, betas=betas, eps=eps, **options)

    def ref(theta, grads, **kw):
        return ref_adam(theta, grads, decoupled=decoupled, **kw)
    run_and_check(cls, ref, kwargs, seed, nsteps, none_every)


def test_adamw_default_weight_decay():
    assert AdamW(make_params(0)).param_groups[0]["weight_decay"] == 1e-2
    assert Adam(make_params(0)).param_groups[0]["weight_decay"] == 0.0


def test_param_groups_have_their_own_options():
    params = make_params(3)
    seq = grad_sequence(3, 4)
    opt = SGD([{"params": params[:2], "lr": 0.1, "momentum": 0.9},
               {"params": params[2:], "weight_decay": 0.5}], lr=0.01)
    theta0 = [p.data.ravel().tolist() for p in params]
    for gs in seq:
        for p, g in zip(params, gs):
            p.grad = g.copy()
        opt.step()
    opts = [dict(lr=0.1, momentum=0.9, weight_decay=0.0)] * 2 + [
        dict(lr=0.01, momentum=0.0, weight_decay=0.5)]
    for i, p in enumerate(params):
        expect = ref_sgd(theta0[i], [gs[i].ravel().tolist() for gs in seq], dampening=0.0,
                         nesterov=False, maximize=False, **opts[i])
        np.testing.assert_allclose(p.data.ravel(), expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_update_is_in_place_and_keeps_dtype(dtype):
    params = make_params(1, dtype)
    ids = [id(p.data) for p in params]
    for cls in (SGD, Adam, AdamW):
        opt = cls(params, lr=0.1, **({"momentum": 0.9} if cls is SGD else {}))
        for p in params:
            p.grad = np.ones_like(p.data)
        opt.step()
        assert [id(p.data) for p in params] == ids
        assert all(p.data.dtype == dtype for p in params)
        assert all(a.dtype == dtype for s in opt.state.values() for a in s.values()
                   if isinstance(a, np.ndarray))


def test_zero_grad():
    params = make_params(0)
    opt = SGD(params, lr=0.1)
    for p in params:
        p.grad = np.ones_like(p.data)
    g0 = params[0].grad
    opt.zero_grad(set_to_none=False)
    assert params[0].grad is g0 and not g0.any()
    opt.zero_grad()
    assert all(p.grad is None for p in params)


def test_closure_is_called_and_returned():
    params = make_params(0)
    opt = SGD(params, lr=0.1)
    assert opt.step(lambda: 42.0) == 42.0


@pytest.mark.parametrize("make, message", [
    (lambda ps: SGD(ps, lr=-0.1), "Invalid learning rate: -0.1"),
    (lambda ps: SGD(ps, momentum=-1), "Invalid momentum value"),
    (lambda ps: SGD(ps, weight_decay=-1), "Invalid weight_decay value"),
    (lambda ps: SGD(ps, momentum=0.9, dampening=0.1, nesterov=True), "Nesterov momentum"),
    (lambda ps: SGD(ps, nesterov=True), "Nesterov momentum"),
    (lambda ps: Adam(ps, lr=-1.0), "Invalid learning rate"),
    (lambda ps: Adam(ps, eps=-1e-8), "Invalid epsilon value"),
    (lambda ps: Adam(ps, betas=(1.0, 0.999)), "Invalid beta parameter at index 0: 1.0"),
    (lambda ps: Adam(ps, betas=(0.9, -0.1)), "Invalid beta parameter at index 1"),
    (lambda ps: AdamW(ps, weight_decay=-0.01), "Invalid weight_decay value"),
    (lambda ps: SGD([], lr=0.1), "empty parameter list"),
    (lambda ps: SGD([{"params": ps[:1]}, {"params": ps[:2]}], lr=0.1),
     "more than one parameter group"),
    (lambda ps: SGD([{"params": ps, "lr": -2.0}]), "Invalid learning rate"),
])
def test_bad_options(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        make(make_params(0))


def test_bad_params():
    ps = make_params(0)
    with pytest.raises(TypeError):
        SGD(ps[0])
    with pytest.raises(TypeError):
        SGD(set(ps))
    with pytest.raises(TypeError):
        SGD([np.zeros(3)])


def continue_identically(make_opt, seed, before=3, after=3):
    """Run ``before`` steps, checkpoint through flatten/unflatten (with the checkpoint's own
    scalar conversion), resume a fresh optimizer on copies of the parameters, and check the
    next ``after`` steps give exactly the same parameters."""
    params = make_params(seed)
    seq = grad_sequence(seed, before + after, none_every=2)
    opt = make_opt(params)
    for gs in seq[:before]:
        for p, g in zip(params, gs):
            p.grad = None if g is None else g.copy()
        opt.step()
    host, scalars = flatten_state(opt.state_dict())
    for name, a in host.items():
        assert check_dataset_name(name) == name and isinstance(a, np.ndarray)
    stored = {n: _from_attr(_scalar_value(n, v)) for n, v in scalars.items()}
    twins = [P(p.data.copy()) for p in params]
    opt2 = make_opt(twins)
    opt2.load_state_dict(unflatten_state({n: a.copy() for n, a in host.items()}, stored))
    assert opt2.param_groups[0].keys() == opt.param_groups[0].keys()
    for gs in seq[before:]:
        for ps in (params, twins):
            for p, g in zip(ps, gs):
                p.grad = None if g is None else g.copy()
        opt.step()
        opt2.step()
    for p, q in zip(params, twins):
        np.testing.assert_array_equal(p.data, q.data)


@pytest.mark.parametrize("make_opt", [
    lambda ps: SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
    lambda ps: Adam(ps, lr=0.01, betas=(0.8, 0.9), amsgrad=True, weight_decay=0.1),
    lambda ps: AdamW([{"params": ps[:1], "lr": 0.05}, {"params": ps[1:]}], lr=0.01),
], ids=["SGD", "Adam", "AdamW-groups"])
@settings(max_examples=5)
@given(seed=seeds)
def test_state_dict_round_trip_continues_identically(make_opt, seed):
    continue_identically(make_opt, seed)


def test_state_dict_layout():
    params = make_params(0)
    opt = Adam([{"params": params[:1]}, {"params": params[1:], "lr": 0.5}], betas=(0.8, 0.9))
    for p in params:
        p.grad = np.ones_like(p.data)
    opt.step()
    sd = opt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [[0], [1, 2]]
    assert sd["param_groups"][0]["betas"] == (0.8, 0.9)
    assert sd["param_groups"][1]["lr"] == 0.5
    assert set(sd["state"]) == {0, 1, 2}
    assert sd["state"][1]["step"] == 1
    assert set(sd["state"][1]) == {"step", "exp_avg", "exp_avg_sq"}
    host, scalars = flatten_state(sd, prefix="opt2")
    assert "opt2.state.1.exp_avg" in host and scalars["opt2.state.1.step"] == 1
    back = unflatten_state(host, scalars, prefix="opt2")
    assert back["param_groups"] == sd["param_groups"]
    with pytest.raises(ValueError, match="no optimizer state"):
        unflatten_state(host, scalars)


def test_load_state_dict_checks_structure():
    params = make_params(0)
    opt = SGD(params, lr=0.1, momentum=0.9)
    sd = SGD([{"params": params[:1]}, {"params": params[1:]}], lr=0.1).state_dict()
    with pytest.raises(ValueError, match="number of parameter groups"):
        opt.load_state_dict(sd)
    sd = SGD(params[:2], lr=0.1).state_dict()
    with pytest.raises(ValueError, match="doesn't match the size"):
        opt.load_state_dict(sd)


# -- schedulers ------------------------------------------------------------------------------
def closed_forms():
    """(name, factory, lr(base, epoch)) triples, formulas written out with NumPy."""
    def cosmo_ref(base, epoch, warm=4, factor=8.0, schedule={32: 0.25, 64: 0.125}):
        # the MLPerf HPC CosmoFlow reference's _lr_schedule, transcribed
        lr0 = base / factor
        if epoch < warm:
            return epoch * (base - lr0) / warm + lr0
        decay_factor, decay_epoch = 1.0, 0
        for e, d in schedule.items():
            if e >= decay_epoch and e < epoch:
                decay_epoch, decay_factor = e, d
        return base * decay_factor

    return [
        ("lambda", lambda o: sched.LambdaLR(o, lambda e: min(1.0, (e + 1) / 7)),
         lambda b, e: b * min(1.0, (e + 1) / 7)),
        ("linear", lambda o: sched.LinearLR(o, start_factor=0.1, end_factor=0.9,
                                            total_iters=40),
         lambda b, e: b * (0.1 + 0.8 * min(40, e) / 40)),
        ("step", lambda o: sched.StepLR(o, step_size=7, gamma=0.5),
         lambda b, e: b * 0.5 ** (e // 7)),
        ("multistep", lambda o: sched.MultiStepLR(o, milestones=[50, 10, 30, 30], gamma=0.3),
         lambda b, e: b * 0.3 ** int(np.sum(np.array([10, 30, 30, 50]) <= e))),
        ("cosine", lambda o: sched.CosineAnnealingLR(o, T_max=60, eta_min=1e-4),
         lambda b, e: 1e-4 + (b - 1e-4) * (1 + np.cos(np.pi * e / 60)) / 2),
        ("cosmoflow", lambda o: sched.CosmoFlowLR(o, warmup_epochs=4, warmup_factor=8.0),
         cosmo_ref),
    ]


@pytest.mark.parametrize("name, make, formula", closed_forms(), ids=lambda x: x
                         if isinstance(x, str) else None)
def test_scheduler_closed_forms(name, make, formula):
    params = make_params(0)
    opt = SGD([{"params": params[:1], "lr": 0.1}, {"params": params[1:], "lr": 0.02}])
    s = make(opt)
    for epoch in range(100):
        expect = [formula(0.1, epoch), formula(0.02, epoch)]
        np.testing.assert_allclose(s.get_last_lr(), expect, rtol=1e-14, atol=0)
        assert [g["lr"] for g in opt.param_groups] == s.get_last_lr()
        opt.step()
        s.step()
    assert all(g["initial_lr"] in (0.1, 0.02) for g in opt.param_groups)


def test_cosmoflow_defaults():
    opt = SGD(make_params(0), lr=1.0)
    s = sched.CosmoFlowLR(opt)
    lrs = []
    for _ in range(70):
        lrs.append(s.get_last_lr()[0])
        s.step()
    assert lrs[:33] == [1.0] * 33       # warmup_factor 1: flat; boundary 32 acts after it
    assert lrs[33:65] == [0.25] * 32     # not cumulative: 0.125 replaces 0.25
    assert lrs[65:] == [0.125] * 5


@pytest.mark.parametrize("name, make, formula", closed_forms(), ids=lambda x: x
                         if isinstance(x, str) else None)
def test_scheduler_state_dict_resume(name, make, formula):
    opt = SGD(make_params(0), lr=0.1)
    s = make(opt)
    for _ in range(37):
        s.step()
    sd = s.state_dict()
    assert all(isinstance(v, (int, float)) for v in sd.values())
    opt2 = SGD(make_params(0), lr=0.1)
    opt2.load_state_dict(opt.state_dict())
    s2 = make(opt2)
    s2.load_state_dict(sd)
    assert s2.get_last_lr() == s.get_last_lr() and s2.last_epoch == 37
    for _ in range(20):
        s.step()
        s2.step()
        assert s2.get_last_lr() == s.get_last_lr()
        assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_scheduler_resume_needs_initial_lr():
    opt = SGD(make_params(0), lr=0.1)
    with pytest.raises(KeyError, match="initial_lr"):
        sched.StepLR(opt, step_size=3, last_epoch=5)
    sched.StepLR(opt, step_size=3)
    s = sched.StepLR(opt, step_size=3, last_epoch=5)
    assert s.last_epoch == 6 and s.get_last_lr() == [0.1 * 0.1 ** 2]


@pytest.mark.parametrize("make", [
    lambda o: sched.StepLR(o, step_size=0),
    lambda o: sched.LinearLR(o, start_factor=0.0),
    lambda o: sched.CosineAnnealingLR(o, T_max=-1),
    lambda o: sched.MultiStepLR(o, milestones=[-1]),
    lambda o: sched.CosmoFlowLR(o, boundaries=(3,), factors=(0.1, 0.2)),
    lambda o: sched.CosmoFlowLR(o, warmup_factor=0.0),
    lambda o: sched.LambdaLR(o, [lambda e: 1.0] * 2),
])
def test_scheduler_bad_options(make):
    with pytest.raises(ValueError):
        make(SGD(make_params(0), lr=0.1))


# -- clipping --------------------------------------------------------------------------------
@settings(max_examples=30)
@given(seed=seeds, max_norm=st.sampled_from([1e-3, 0.5, 2.0, 1e3]),
       norm_type=st.sampled_from([1.0, 2.0, 3.0, math.inf]),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_clip_grad_norm_matches_numpy(seed, max_norm, norm_type, dtype):
    params = make_params(seed, dtype)
    for p, g in zip(params, grad_sequence(seed, 1)[0]):
        p.grad = g.astype(dtype)
    params.append(P(np.zeros(3, dtype)))  # no grad: skipped
    grads = [p.grad.astype(np.float64) for p in params[:-1]]
    flat = np.concatenate([g.ravel() for g in grads])
    expect = np.linalg.norm(flat, ord=norm_type)
    total = clip_grad_norm_(params, max_norm, norm_type)
    assert isinstance(total, float)
    np.testing.assert_allclose(total, expect, rtol=1e-12)
    coef = min(1.0, max_norm / (expect + 1e-6))
    for p, g in zip(params, grads):
        assert p.grad.dtype == dtype
        np.testing.assert_allclose(p.grad, (g * coef).astype(dtype),
                                   rtol=1e-12 if dtype == np.float64 else 1e-6)


def test_clip_grad_norm_edge_cases():
    p = P(np.zeros(4))
    assert clip_grad_norm_([p], 1.0) == 0.0
    p.grad = np.array([3.0, 4.0, 0.0, 0.0])
    assert clip_grad_norm_(p, 10.0) == 5.0                       # a single parameter
    ones = [P(np.zeros((3, 4))), P(np.zeros(4))]
    for o in ones:
        o.grad = np.ones_like(o.data)
    assert clip_grad_norm_(ones, 8.0) == 4.0                     # sum of squares, one sqrt
    np.testing.assert_array_equal(p.grad, [3.0, 4.0, 0.0, 0.0])  # below max_norm: untouched
    p.grad = np.array([1.0, np.inf, 0.0, 0.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    q = P(np.zeros(2))
    q.grad = np.array([np.nan, 1.0])
    assert math.isnan(clip_grad_norm_([p, q], 1.0, norm_type=math.inf))
    with pytest.raises(ValueError):
        clip_grad_norm_([p], 1.0, norm_type=0)


def test_clip_grad_value():
    params = make_params(2)
    for p in params:
        p.grad = p.data * 3
    expect = [np.clip(p.grad, -0.7, 0.7) for p in params]
    clip_grad_value_(params, 0.7)
    for p, e in zip(params, expect):
        np.testing.assert_array_equal(p.grad, e)


# -- GradScaler ------------------------------------------------------------------------------
def scaled_step(scaler, opt, params, grads):
    for p, g in zip(params, grads):
        p.grad = g * scaler.get_scale()
    return scaler.step(opt)


def test_grad_scaler_unscales_and_steps():
    params = make_params(0)
    twins = [P(p.data.copy()) for p in params]
    scaler = GradScaler()
    assert scaler.get_scale() == 2.0 ** 16 and scaler.scale(1.5) == 1.5 * 2 ** 16
    opt, ref = SGD(params, lr=0.1, momentum=0.9), SGD(twins, lr=0.1, momentum=0.9)
    for gs in grad_sequence(0, 3):
        scaled_step(scaler, opt, params, gs)
        scaler.update()
        for p, g in zip(twins, gs):
            p.grad = g.copy()
        ref.step()
    for p, q in zip(params, twins):
        np.testing.assert_allclose(p.data, q.data, rtol=1e-14)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_grad_scaler_skips_and_backs_off(bad):
    params = make_params(0)
    before = [p.data.copy() for p in params]
    scaler = GradScaler(init_scale=1024.0)
    opt = Adam(params, lr=0.1)
    gs = grad_sequence(0, 1)[0]
    gs[1] = gs[1].copy()
    gs[1][2] = bad
    assert scaled_step(scaler, opt, params, gs) is None
    scaler.update()
    assert scaler.get_scale() == 512.0
    for p, b in zip(params, before):
        np.testing.assert_array_equal(p.data, b)
    assert len(opt.state) == 0
    assert scaler.state_dict()["_growth_tracker"] == 0


def test_grad_scaler_grows_after_interval():
    params = make_params(0)
    scaler = GradScaler(init_scale=4.0, growth_interval=3)
    opt = SGD(params, lr=0.01)
    seen = []
    for t, gs in enumerate(grad_sequence(0, 8)):
        if t == 4:
            gs[0] = gs[0] * np.inf
        scaled_step(scaler, opt, params, gs)
        scaler.update()
        seen.append(scaler.get_scale())
    # 3 good steps -> 8; step 4 bad -> 4 (tracker reset); 3 more good (5,6,7) -> 8
    assert seen == [4.0, 4.0, 8.0, 8.0, 4.0, 4.0, 4.0, 8.0]


def test_grad_scaler_growth_stops_at_float32_max():
    scaler = GradScaler(init_scale=2.0 ** 127, growth_interval=1)
    params = make_params(0)
    opt = SGD(params, lr=0.0)
    for p in params:
        p.grad = np.zeros_like(p.data)
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0 ** 127


def test_grad_scaler_protocol_errors():
    params = make_params(0)
    opt = SGD(params, lr=0.1)
    scaler = GradScaler()
    with pytest.raises(RuntimeError, match="No inf checks"):
        scaler.update()
    for p in params:
        p.grad = np.ones_like(p.data)
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    scaler.update()
    with pytest.raises(ValueError):
        GradScaler(growth_factor=1.0)
    with pytest.raises(ValueError):
        GradScaler(backoff_factor=1.0)
    with pytest.raises(ValueError):
        GradScaler(growth_interval=0)


def test_grad_scaler_unscale_then_clip():
    params = make_params(0)
    scaler = GradScaler(init_scale=8.0)
    opt = SGD(params, lr=0.1)
    gs = grad_sequence(0, 1)[0]
    for p, g in zip(params, gs):
        p.grad = g * 8.0
    scaler.unscale_(opt)
    for p, g in zip(params, gs):
        np.testing.assert_array_equal(p.grad, g)
    clip_grad_norm_(params, 0.1)
    scaler.step(opt)  # does not unscale again
    scaler.update()
    assert scaler.get_scale() == 8.0


def test_grad_scaler_disabled_and_state_dict():
    params = make_params(0)
    opt = SGD(params, lr=0.1)
    off = GradScaler(enabled=False)
    for p in params:
        p.grad = np.full_like(p.data, np.inf)
    assert off.scale(2.5) == 2.5 and off.get_scale() == 1.0 and off.state_dict() == {}
    off.step(opt)  # plain step, no check
    off.update()
    assert all(np.isinf(p.data).all() for p in params)
    on = GradScaler(init_scale=32.0, growth_interval=5)
    on._growth_tracker = 3
    sd = on.state_dict()
    assert sd == {"scale": 32.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                  "growth_interval": 5, "_growth_tracker": 3}
    other = GradScaler()
    other.load_state_dict(sd)
    assert other.state_dict() == sd
    with pytest.raises(RuntimeError, match="empty"):
        other.load_state_dict({})
