"""The schedulers of nn/lr_scheduler_more.py against formulas written out with NumPy and plain
Python (from PyTorch's documentation), and resuming every scheduler in any load order (issue
19, silent bug 2: ``opt.load_state_dict``, then building the scheduler, then
``sched.load_state_dict`` must give the saved rate, not the base one)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from disttensor.io.checkpoint import _from_attr, _scalar_value
from disttensor.nn import lr_scheduler as S
from disttensor.nn.optim import SGD, Adam

from .test_nn_optim import make_params

BASES = (0.1, 0.02)


def two_groups(cls=SGD, **kw):
    ps = make_params(0)
    return cls([{"params": ps[:1], "lr": BASES[0]}, {"params": ps[1:], "lr": BASES[1]}], **kw)


def trajectory(make, n=40, metrics=None, opt_cls=SGD, **opt_kw):
    opt = two_groups(opt_cls, **opt_kw)
    s = make(opt)
    out = [s.get_last_lr()]
    for e in range(n):
        s.step(metrics[e]) if metrics is not None else s.step()
        assert [g["lr"] for g in opt.param_groups] == s.get_last_lr()
        out.append(s.get_last_lr())
    return np.array(out), opt, s


@pytest.mark.parametrize("make, formula", [
    (lambda o: S.ExponentialLR(o, gamma=0.85), lambda b, e: b * 0.85 ** e),
    (lambda o: S.PolynomialLR(o, total_iters=13, power=2.5),
     lambda b, e: b * (1 - min(13, e) / 13) ** 2.5),
    (lambda o: S.PolynomialLR(o), lambda b, e: b * (1 - min(5, e) / 5)),
    (lambda o: S.ConstantLR(o, factor=0.25, total_iters=7),
     lambda b, e: b * (0.25 if e < 7 else 1.0)),
], ids=["exponential", "polynomial", "polynomial-defaults", "constant"])
def test_closed_forms(make, formula):
    lrs, _, _ = trajectory(make)
    expect = [[formula(b, e) for b in BASES] for e in range(41)]
    np.testing.assert_allclose(lrs, expect, rtol=1e-14, atol=0)


def sgdr_position(epoch, T0, Tm):
    """(T_cur, T_i) of SGDR at a (fractional) epoch, by walking the cycles."""
    start, T = 0.0, T0
    while epoch >= start + T:
        start, T = start + T, T * Tm
    return epoch - start, T


def sgdr(b, epoch, T0, Tm, eta):
    t, T = sgdr_position(epoch, T0, Tm)
    return eta + (b - eta) * (1 + math.cos(math.pi * t / T)) / 2


@pytest.mark.parametrize("T0, Tm, eta", [(3, 1, 0.0), (3, 2, 1e-3), (2, 3, 1e-4)])
def test_warm_restarts(T0, Tm, eta):
    make = lambda o: S.CosineAnnealingWarmRestarts(o, T_0=T0, T_mult=Tm, eta_min=eta)  # noqa
    lrs, _, _ = trajectory(make)
    expect = [[sgdr(b, e, T0, Tm, eta) for b in BASES] for e in range(41)]
    np.testing.assert_allclose(lrs, expect, rtol=1e-13, atol=1e-17)
    opt = two_groups()
    s = make(opt)
    for epoch in np.arange(0.0, 30.0, 0.3):     # fractional epochs inside cycles
        s.step(float(epoch))
        np.testing.assert_allclose(s.get_last_lr(), [sgdr(b, epoch, T0, Tm, eta)
                                                     for b in BASES], rtol=1e-12, atol=1e-17)
        assert s.last_epoch == math.floor(epoch)
    with pytest.raises(ValueError, match="non-negative epoch"):
        s.step(-1.0)


def one_cycle_ref(step, n, max_lr, pct, div, final_div, strategy, three, mom=(0.85, 0.95)):
    """(lr, momentum) of the 1cycle policy at ``step`` from its documented phases."""
    lo, hi = mom
    init = max_lr / div
    low = init / final_div
    if strategy == "cos":
        def ann(a, b, p):
            return b + (a - b) * (1 + math.cos(math.pi * p)) / 2
    else:
        def ann(a, b, p):
            return a + (b - a) * p
    e1 = pct * n - 1
    if three:
        e2 = 2 * pct * n - 2
        if step <= e1:
            return ann(init, max_lr, step / e1), ann(hi, lo, step / e1)
        if step <= e2:
            return ann(max_lr, init, (step - e1) / (e2 - e1)), ann(lo, hi, (step - e1) / (e2 - e1))
        p = (step - e2) / (n - 1 - e2)
        return ann(init, low, p), hi
    if step <= e1:
        return ann(init, max_lr, step / e1), ann(hi, lo, step / e1)
    p = (step - e1) / (n - 1 - e1)
    return ann(max_lr, low, p), ann(lo, hi, p)


@pytest.mark.parametrize("strategy", ["cos", "linear"])
@pytest.mark.parametrize("three", [False, True])
@pytest.mark.parametrize("opt_cls", [SGD, Adam])
def test_one_cycle(strategy, three, opt_cls):
    n, maxes = 30, [1.0, 0.4]
    kw = dict(momentum=0.9) if opt_cls is SGD else {}
    opt = two_groups(opt_cls, **kw)
    s = S.OneCycleLR(opt, max_lr=maxes, total_steps=n, anneal_strategy=strategy,
                     three_phase=three, pct_start=0.25, div_factor=10.0, final_div_factor=100.0)
    for step in range(n):
        for i, g in enumerate(opt.param_groups):
            lr, m = one_cycle_ref(step, n, maxes[i], 0.25, 10.0, 100.0, strategy, three)
            assert g["lr"] == pytest.approx(lr, rel=1e-13, abs=1e-16)
            got_m = g["betas"][0] if opt_cls is Adam else g["momentum"]
            assert got_m == pytest.approx(m, rel=1e-13)
        if step < n - 1:
            s.step()
    s.step()                                   # step n: allowed (PyTorch's check is '>')
    with pytest.raises(ValueError, match="Tried to step"):
        s.step()


def test_one_cycle_epochs_and_errors():
    opt = two_groups()
    assert S.OneCycleLR(opt, 1.0, epochs=3, steps_per_epoch=4).total_steps == 12
    with pytest.raises(ValueError, match="total_steps OR"):
        S.OneCycleLR(two_groups(), 1.0)
    with pytest.raises(ValueError, match="anneal_strategy"):
        S.OneCycleLR(two_groups(), 1.0, total_steps=5, anneal_strategy="exp")
    with pytest.raises(ValueError, match="pct_start"):
        S.OneCycleLR(two_groups(), 1.0, total_steps=5, pct_start=1.5)
    with pytest.raises(ValueError, match="expected 2 values"):
        S.OneCycleLR(two_groups(), [1.0], total_steps=5)


def plateau_ref(metrics, lr0, mode, factor, patience, threshold, tmode, cooldown, min_lr, eps):
    best = math.inf if mode == "min" else -math.inf
    bad = cool = 0
    lr, out = lr0, []
    for a in metrics:
        if mode == "min":
            better = a < (best * (1 - threshold) if tmode == "rel" else best - threshold)
        else:
            better = a > (best * (1 + threshold) if tmode == "rel" else best + threshold)
        if better:
            best, bad = a, 0
        else:
            bad += 1
        if cool > 0:
            cool -= 1
            bad = 0
        if bad > patience:
            new = max(lr * factor, min_lr)
            if lr - new > eps:
                lr = new
            cool, bad = cooldown, 0
        out.append(lr)
    return out


@pytest.mark.parametrize("kw", [
    dict(),
    dict(mode="max", threshold_mode="abs", threshold=0.05, patience=2, factor=0.5),
    dict(patience=1, cooldown=2, factor=0.3, min_lr=0.01),
    dict(mode="max", patience=0, min_lr=[0.05, 0.0], eps=1e-3),
])
def test_reduce_on_plateau(kw):
    rng = np.random.default_rng(3)
    metrics = list(np.round(rng.normal(size=60).cumsum() * 0.1, 2))
    lrs, opt, s = trajectory(lambda o: S.ReduceLROnPlateau(o, **kw), n=60, metrics=metrics)
    full = dict(mode="min", factor=0.1, patience=10, threshold=1e-4, threshold_mode="rel",
                cooldown=0, min_lr=0.0, eps=1e-8)
    full.update(kw)
    mins = full.pop("min_lr")
    mins = mins if isinstance(mins, list) else [mins, mins]
    for i, b in enumerate(BASES):
        expect = plateau_ref(metrics, b, full["mode"], full["factor"], full["patience"],
                             full["threshold"], full["threshold_mode"], full["cooldown"],
                             mins[i], full["eps"])
        np.testing.assert_allclose(lrs[1:, i], expect, rtol=1e-15)
    assert len(set(lrs[:, 0])) > 1                # the rate did change


def test_reduce_on_plateau_errors():
    with pytest.raises(ValueError, match="Factor should be < 1.0"):
        S.ReduceLROnPlateau(two_groups(), factor=1.0)
    with pytest.raises(ValueError, match="mode avg is unknown"):
        S.ReduceLROnPlateau(two_groups(), mode="avg")
    with pytest.raises(ValueError, match="threshold mode"):
        S.ReduceLROnPlateau(two_groups(), threshold_mode="x")
    with pytest.raises(ValueError, match="expected 2 min_lrs"):
        S.ReduceLROnPlateau(two_groups(), min_lr=[0.1])


def test_sequential():
    make = lambda o: S.SequentialLR(  # noqa: E731
        o, [S.LinearLR(o, start_factor=0.1, total_iters=4),
            S.ExponentialLR(o, gamma=0.9), S.CosineAnnealingLR(o, T_max=8, eta_min=1e-3)],
        milestones=[6, 15])
    lrs, _, _ = trajectory(make)

    def f(b, e):
        if e < 6:
            return b * (0.1 + 0.9 * min(4, e) / 4)
        if e < 15:
            return b * 0.9 ** (e - 6)
        return 1e-3 + (b - 1e-3) * (1 + math.cos(math.pi * (e - 15) / 8)) / 2
    np.testing.assert_allclose(lrs, [[f(b, e) for b in BASES] for e in range(41)], rtol=1e-14)


def test_chained_multiplies_factors():
    make = lambda o: S.ChainedScheduler(  # noqa: E731
        [S.ConstantLR(o, factor=0.2, total_iters=5), S.ExponentialLR(o, gamma=0.9),
         S.MultiStepLR(o, milestones=[10, 20], gamma=0.5),
         S.LinearLR(o, start_factor=0.5, total_iters=8)])
    lrs, _, _ = trajectory(make)

    def f(b, e):
        return (b * (0.2 if e < 5 else 1.0) * 0.9 ** e * 0.5 ** ((e >= 10) + (e >= 20))
                * (0.5 + 0.5 * min(8, e) / 8))
    np.testing.assert_allclose(lrs, [[f(b, e) for b in BASES] for e in range(41)], rtol=1e-13)


def test_combinator_errors():
    opt, other = two_groups(), two_groups()
    with pytest.raises(ValueError, match="at least one"):
        S.SequentialLR(opt, [], milestones=[])
    with pytest.raises(ValueError, match="one more than the number of milestone"):
        S.SequentialLR(opt, [S.ExponentialLR(opt, 0.9)], milestones=[3])
    with pytest.raises(ValueError, match="same optimizer"):
        S.ChainedScheduler([S.ExponentialLR(opt, 0.9), S.ExponentialLR(other, 0.9)])
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        S.ChainedScheduler([S.ReduceLROnPlateau(opt)])


# -- resume in any load order (silent bug 2) ------------------------------------------------
METRICS = list(np.round(np.random.default_rng(7).normal(size=40).cumsum() * 0.1, 2))
RESUMABLE = {
    "step": lambda o: S.StepLR(o, step_size=4, gamma=0.5),
    "multistep": lambda o: S.MultiStepLR(o, milestones=[3, 9], gamma=0.5),
    "linear": lambda o: S.LinearLR(o, start_factor=0.2, total_iters=10),
    "lambda": lambda o: S.LambdaLR(o, lambda e: 1.0 / (1 + e)),
    "cosine": lambda o: S.CosineAnnealingLR(o, T_max=10),
    "cosmoflow": lambda o: S.CosmoFlowLR(o, warmup_epochs=3, warmup_factor=8.0,
                                         boundaries=(8, 16)),
    "hybrid": lambda o: S.HybridCosineLinearLR(o, total_steps=30, warmup_steps=4),
    "exponential": lambda o: S.ExponentialLR(o, gamma=0.8),
    "polynomial": lambda o: S.PolynomialLR(o, total_iters=25, power=2.0),
    "constant": lambda o: S.ConstantLR(o, factor=0.5, total_iters=8),
    "warm_restarts": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=4, T_mult=2),
    "one_cycle": lambda o: S.OneCycleLR(o, max_lr=1.0, total_steps=40),
    "plateau": lambda o: S.ReduceLROnPlateau(o, patience=1, factor=0.5),
    "sequential": lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.1, total_iters=3),
                                               S.CosineAnnealingLR(o, T_max=20)],
                                           milestones=[5]),
    "chained": lambda o: S.ChainedScheduler([S.CosineAnnealingLR(o, T_max=15, eta_min=0.01),
                                             S.ExponentialLR(o, gamma=0.95)]),
}


def _step(s, e):
    s.step(METRICS[e]) if isinstance(s, S.ReduceLROnPlateau) else s.step()


def _through_checkpoint(sd):
    """A state dict as io.save_checkpoint / load_checkpoint hand its scalars back."""
    return {k: _from_attr(_scalar_value(k, v)) for k, v in sd.items()}


@pytest.mark.parametrize("order", ["opt-build-sched", "build-opt-sched", "build-sched-opt"])
@pytest.mark.parametrize("name", sorted(RESUMABLE))
def test_resume_in_any_load_order(name, order):
    make, at = RESUMABLE[name], 11
    opt = SGD(make_params(0), lr=1e-3, momentum=0.9)
    s = make(opt)
    for e in range(at):
        _step(s, e)
    opt_sd, sched_sd = opt.state_dict(), _through_checkpoint(s.state_dict())
    assert all(isinstance(v, (int, float)) for v in sched_sd.values())
    saved_lr = opt.param_groups[0]["lr"]
    opt2 = SGD(make_params(0), lr=1e-3, momentum=0.9)
    if order == "opt-build-sched":
        opt2.load_state_dict(opt_sd)
        s2 = make(opt2)
        s2.load_state_dict(sched_sd)
    elif order == "build-opt-sched":
        s2 = make(opt2)
        opt2.load_state_dict(opt_sd)
        s2.load_state_dict(sched_sd)
    else:
        s2 = make(opt2)
        s2.load_state_dict(sched_sd)
        opt2.load_state_dict(opt_sd)
    assert opt2.param_groups[0]["lr"] == saved_lr
    assert s2.get_last_lr() == s.get_last_lr()
    for e in range(at, 28):
        _step(s, e)
        _step(s2, e)
        assert s2.get_last_lr() == s.get_last_lr()
        assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
        assert opt2.param_groups[0]["momentum"] == opt.param_groups[0]["momentum"]


def test_silent_bug_2_exact_case():
    """Issue 19's report: Adam at 1e-3, CosineAnnealingLR, resumed at 5e-4."""
    opt = Adam(make_params(0), lr=1e-3)
    s = S.CosineAnnealingLR(opt, T_max=10)
    for _ in range(5):
        s.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(5e-4)
    opt2 = Adam(make_params(0), lr=1e-3)
    opt2.load_state_dict(opt.state_dict())
    s2 = S.CosineAnnealingLR(opt2, T_max=10)
    s2.load_state_dict(s.state_dict())
    assert opt2.param_groups[0]["lr"] == pytest.approx(5e-4)
