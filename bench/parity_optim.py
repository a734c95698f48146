"""Parity (not a benchmark, not a test): every disttensor.nn optimizer and LR scheduler against
PyTorch 2.13 CPU in float64, 20 steps on the same random gradients from the same start.

One line per configuration: the largest relative difference over the 20 steps,
``max_t max_i |ours - torch| / max_i |torch|`` (parameters for optimizers, learning rates and
momenta for schedulers), and for schedulers the same after a resume mid-run (optimizer state
loaded, scheduler rebuilt, scheduler state loaded, in that order: issue 19's silent bug 2).
PyTorch is an oracle only here (``.venv`` has it for this); PyTorch's scalar state is float64
under ``torch.set_default_dtype(torch.float64)`` (NAdam's ``mu_product`` is float32
otherwise)::

    .venv/bin/python bench/parity_optim.py
"""
from __future__ import annotations

import os
import warnings
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from disttensor.nn import lr_scheduler as S  # noqa: E402
from disttensor.nn import optim as O  # noqa: E402

torch.set_default_dtype(torch.float64)
warnings.filterwarnings("ignore", category=UserWarning)
SHAPES = [(4, 3, 3), (5,), (6, 2)]
STEPS = 20


class P:
    def __init__(self, data):
        self.data, self.grad, self.requires_grad = data, None, True


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.abs(b).max()
    return float(np.abs(a - b).max() / scale) if scale > 0 else float(np.abs(a - b).max())


OPTIMIZERS = [
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("Adam", dict(lr=0.01, amsgrad=True, weight_decay=0.01)),
    ("AdamW", dict(lr=0.01)),
    ("RMSprop", {}),
    ("RMSprop", dict(momentum=0.9, centered=True, weight_decay=0.1)),
    ("RMSprop", dict(alpha=0.3, maximize=True)),
    ("Adagrad", {}),
    ("Adagrad", dict(lr_decay=0.05, weight_decay=0.1, initial_accumulator_value=0.3)),
    ("NAdam", {}),
    ("NAdam", dict(weight_decay=0.1, decoupled_weight_decay=True, momentum_decay=0.01)),
    ("NAdam", dict(weight_decay=0.1, betas=(0.3, 0.9), maximize=True)),
    ("RAdam", {}),
    ("RAdam", dict(weight_decay=0.1, decoupled_weight_decay=True)),
    ("RAdam", dict(betas=(0.3, 0.9), weight_decay=0.1)),
]


def compare_optimizer(name, kwargs, seed=0):
    rng = np.random.default_rng(seed)
    init = [rng.normal(size=s) for s in SHAPES]
    ours = [P(a.copy()) for a in init]
    theirs = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in init]
    o = getattr(O, name)(ours, **kwargs)
    t = getattr(torch.optim, name)(theirs, foreach=False, **kwargs)
    worst = 0.0
    for step in range(STEPS):
        for k, (p, q) in enumerate(zip(ours, theirs)):
            g = None if (k == 2 and step % 3 == 1) else rng.normal(size=p.data.shape)
            p.grad = None if g is None else g.copy()
            q.grad = None if g is None else torch.from_numpy(g)
        o.step()
        t.step()
        worst = max(worst, max(rel(p.data, q.detach().numpy()) for p, q in zip(ours, theirs)))
    return worst


def _sched_pair(make, opt_name="SGD", opt_kw=None):
    opt_kw = opt_kw or dict(lr=0.1, momentum=0.9)
    ours_p, theirs_p = [P(np.zeros(3)), P(np.zeros(2))], [torch.nn.Parameter(torch.zeros(3)),
                                                          torch.nn.Parameter(torch.zeros(2))]
    oo = getattr(O, opt_name)([{"params": ours_p[:1]}, {"params": ours_p[1:], "lr": 0.05}],
                              **opt_kw)
    to = getattr(torch.optim, opt_name)([{"params": theirs_p[:1]},
                                         {"params": theirs_p[1:], "lr": 0.05}], **opt_kw)
    return oo, make(S, oo), to, make(torch.optim.lr_scheduler, to)


def _momenta(opt):
    return [g["betas"][0] if "betas" in g else g.get("momentum", 0.0) for g in opt.param_groups]


def _sched_step(s, metric):
    if type(s).__name__ == "ReduceLROnPlateau":
        s.step(metric)
    else:
        s.step()


SCHEDULERS = [
    ("ExponentialLR", lambda M, o: M.ExponentialLR(o, gamma=0.8)),
    ("PolynomialLR", lambda M, o: M.PolynomialLR(o, total_iters=12, power=2.0)),
    ("ConstantLR", lambda M, o: M.ConstantLR(o, factor=0.2, total_iters=4)),
    ("CosineAnnealingLR", lambda M, o: M.CosineAnnealingLR(o, T_max=7, eta_min=0.001)),
    ("CosineAnnealingWarmRestarts T_mult=2",
     lambda M, o: M.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2, eta_min=0.001)),
    ("OneCycleLR cos", lambda M, o: M.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=25)),
    ("OneCycleLR linear three_phase",
     lambda M, o: M.OneCycleLR(o, max_lr=1.0, total_steps=25, anneal_strategy="linear",
                               three_phase=True, pct_start=0.25)),
    ("ReduceLROnPlateau min rel",
     lambda M, o: M.ReduceLROnPlateau(o, patience=1, cooldown=1, factor=0.5, min_lr=0.01)),
    ("ReduceLROnPlateau max abs",
     lambda M, o: M.ReduceLROnPlateau(o, mode="max", threshold_mode="abs", threshold=0.05,
                                      patience=2)),
    ("SequentialLR Linear->Cosine",
     lambda M, o: M.SequentialLR(o, [M.LinearLR(o, start_factor=0.1, total_iters=4),
                                     M.CosineAnnealingLR(o, T_max=10)], milestones=[5])),
    ("SequentialLR Const->Exp->Step",
     lambda M, o: M.SequentialLR(o, [M.ConstantLR(o, factor=0.5, total_iters=3),
                                     M.ExponentialLR(o, gamma=0.9),
                                     M.StepLR(o, step_size=3, gamma=0.5)], milestones=[4, 9])),
    ("ChainedScheduler Const*Exp",
     lambda M, o: M.ChainedScheduler([M.ConstantLR(o, factor=0.1, total_iters=3),
                                      M.ExponentialLR(o, gamma=0.9)])),
    ("ChainedScheduler Linear*Cosine*MultiStep",
     lambda M, o: M.ChainedScheduler([M.LinearLR(o, start_factor=0.5, total_iters=5),
                                      M.CosineAnnealingLR(o, T_max=9, eta_min=0.001),
                                      M.MultiStepLR(o, milestones=[6, 12], gamma=0.5)])),
]
ONECYCLE_ADAM = ("OneCycleLR on Adam (betas)",
                 lambda M, o: M.OneCycleLR(o, max_lr=0.5, total_steps=22))


def compare_scheduler(make, opt_name="SGD", opt_kw=None, resume_at=8):
    metrics = np.random.default_rng(5).normal(size=STEPS).cumsum() * 0.1
    oo, os_, to, ts = _sched_pair(make, opt_name, opt_kw)
    worst = rel(os_.get_last_lr(), ts.get_last_lr())
    saved = None
    for step in range(STEPS):
        _sched_step(os_, metrics[step])
        _sched_step(ts, metrics[step])
        worst = max(worst, rel(os_.get_last_lr(), ts.get_last_lr()),
                    rel([g["lr"] for g in oo.param_groups], [g["lr"] for g in to.param_groups]),
                    rel(_momenta(oo), _momenta(to)))
        if step == resume_at:
            saved = (oo.state_dict(), dict(os_.state_dict()), step)
    # resume: a fresh optimizer loads its state, a scheduler is built, then loads its state
    opt_sd, sched_sd, at = saved
    oo2, _, to2, ts2 = _sched_pair(make, opt_name, opt_kw)
    oo2.load_state_dict(opt_sd)
    os2 = make(S, oo2)
    os2.load_state_dict(sched_sd)
    # the oracle replays the run up to the same point
    for step in range(at + 1):
        _sched_step(ts2, metrics[step])
    resumed = rel([g["lr"] for g in oo2.param_groups], [g["lr"] for g in to2.param_groups])
    for step in range(at + 1, STEPS):
        _sched_step(os2, metrics[step])
        _sched_step(ts2, metrics[step])
        resumed = max(resumed, rel(os2.get_last_lr(), ts2.get_last_lr()),
                      rel([g["lr"] for g in oo2.param_groups],
                          [g["lr"] for g in to2.param_groups]))
    return worst, resumed


def main():
    print(f"torch {torch.__version__}, float64, {STEPS} steps")
    print(f"{'optimizer':<16} {'options':<64} {'max rel err':>12}")
    for name, kw in OPTIMIZERS:
        print(f"{name:<16} {str(kw):<64} {compare_optimizer(name, kw):12.2e}")
    print()
    print(f"{'scheduler':<42} {'max rel err':>12} {'after resume':>13}")
    for name, make in SCHEDULERS:
        w, r = compare_scheduler(make)
        print(f"{name:<42} {w:12.2e} {r:13.2e}")
    w, r = compare_scheduler(ONECYCLE_ADAM[1], "Adam", dict(lr=0.1))
    print(f"{ONECYCLE_ADAM[0]:<42} {w:12.2e} {r:13.2e}")
    sw = S.CosineAnnealingWarmRestarts
    ours = sw(O.SGD([P(np.zeros(2))], lr=0.1), T_0=3, T_mult=2)
    theirs = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1), T_0=3, T_mult=2)
    worst = 0.0
    for e in np.arange(0, 12, 0.25):
        ours.step(float(e))
        theirs.step(float(e))
        worst = max(worst, rel(ours.get_last_lr(), theirs.get_last_lr()))
    print(f"{'CosineAnnealingWarmRestarts step(epoch)':<42} {worst:12.2e} {'-':>13}")


if __name__ == "__main__":
    main()
