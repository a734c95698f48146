"""HybridCosineLinearLR (GroPipe's hybrid cosine + linear decay): values against the formula
written out independently, the warm-up, its two limits (``cosine_weight`` 1 is
CosineAnnealingLR, 0 is LinearLR), argument errors and the state-dict round trip."""
from __future__ import annotations

import math

import numpy as np
import pytest

from disttensor.nn.lr_scheduler import CosineAnnealingLR, HybridCosineLinearLR, LinearLR
from disttensor.nn.optim import SGD


class P:
    """Stand-in for a parameter: data, grad, requires_grad."""

    def __init__(self):
        self.data = np.zeros(3)
        self.grad = None
        self.requires_grad = True


def make_opt(lrs=(0.1,)):
    return SGD([{"params": [P()], "lr": lr} for lr in lrs], lr=1.0)


def rates(sched, steps):
    """The rate of every epoch 0..steps-1 (epoch 0 set by the construction)."""
    out = [sched.get_last_lr()]
    for _ in range(steps - 1):
        sched.step()
        out.append(sched.get_last_lr())
    return out


def expected(base, e, total, warm=0, w=0.5, eta_min=0.0, start=0.0):
    """The documented formula, written out separately from the class."""
    if e < warm:
        return base * start + base * (1 - start) * e / warm
    T = total - warm
    t = min(e - warm, T)
    cos_part = 0.5 * (1.0 + math.cos(math.pi * t / T))
    lin_part = 1.0 - t / T
    return eta_min + (base - eta_min) * (w * cos_part + (1 - w) * lin_part)


@pytest.mark.parametrize("w", [0.0, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("eta_min", [0.0, 0.01])
def test_key_points(w, eta_min):
    base, T = 0.1, 20
    s = HybridCosineLinearLR(make_opt((base,)), total_steps=T, cosine_weight=w,
                             eta_min=eta_min)
    got = [r[0] for r in rates(s, T + 5)]
    assert got[0] == pytest.approx(base, rel=1e-15)                     # t = 0: the base rate
    assert got[T // 2] == pytest.approx((base + eta_min) / 2, rel=1e-14)  # middle: halfway
    assert got[T] == pytest.approx(eta_min, abs=1e-16)                 # t = T: eta_min
    assert got[T + 4] == got[T]                                        # and stays there
    assert all(a >= b for a, b in zip(got, got[1:]))                   # monotone decay
    for e, r in enumerate(got):
        assert r == pytest.approx(expected(base, e, T, w=w, eta_min=eta_min), rel=1e-14,
                                  abs=1e-17)


def test_mix_lies_between_cosine_and_linear():
    base, T = 1.0, 40
    s = HybridCosineLinearLR(make_opt((base,)), total_steps=T, cosine_weight=0.3)
    for e, (r,) in enumerate(rates(s, T + 1)):
        cos_part = 0.5 * (1 + math.cos(math.pi * e / T))
        lin_part = 1 - e / T
        assert r == pytest.approx(0.3 * cos_part + 0.7 * lin_part, rel=1e-14, abs=1e-16)
        assert min(cos_part, lin_part) - 1e-15 <= r <= max(cos_part, lin_part) + 1e-15
    # not a trivial mix: away from 0, T/2 and T the two parts differ
    assert abs(0.5 * (1 + math.cos(math.pi * 10 / T)) - (1 - 10 / T)) > 0.1


@pytest.mark.parametrize("start", [0.0, 0.2])
def test_warmup(start):
    base, T, W = 0.4, 30, 5
    s = HybridCosineLinearLR(make_opt((base,)), total_steps=T, warmup_steps=W,
                             cosine_weight=0.6, eta_min=0.004, warmup_start_factor=start)
    got = [r[0] for r in rates(s, T + 2)]
    assert got[0] == pytest.approx(base * start, abs=1e-17)
    for e in range(W):
        assert got[e] == pytest.approx(base * (start + (1 - start) * e / W), rel=1e-14,
                                       abs=1e-17)
    assert all(a < b for a, b in zip(got[:W], got[1:W + 1]))   # rising during the warm-up
    assert got[W] == pytest.approx(base, rel=1e-15)            # the peak right after it
    # the decay spans the T - W steps after the warm-up
    assert got[W + (T - W) // 2] == pytest.approx(
        expected(base, W + (T - W) // 2, T, W, 0.6, 0.004, start), rel=1e-14)
    assert got[T] == pytest.approx(0.004, rel=1e-14)
    assert got[T + 1] == got[T]


def test_weight_one_is_cosine_annealing():
    lrs = (0.1, 0.03)
    T = 17
    a = HybridCosineLinearLR(make_opt(lrs), total_steps=T, cosine_weight=1.0, eta_min=0.002)
    b = CosineAnnealingLR(make_opt(lrs), T_max=T, eta_min=0.002)
    assert rates(a, T + 1) == rates(b, T + 1)   # bit for bit, every group


def test_weight_zero_is_linear():
    lrs = (0.1, 0.03)
    T = 13
    a = HybridCosineLinearLR(make_opt(lrs), total_steps=T, cosine_weight=0.0)
    b = LinearLR(make_opt(lrs), start_factor=1.0, end_factor=0.0, total_iters=T)
    assert rates(a, T + 3) == rates(b, T + 3)
    # with eta_min: linear from base to eta_min
    c = HybridCosineLinearLR(make_opt((1.0,)), total_steps=4, cosine_weight=0.0, eta_min=0.2)
    assert [r[0] for r in rates(c, 5)] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2], rel=1e-15)


def test_sets_the_optimizer_groups():
    opt = make_opt((0.1, 0.2))
    s = HybridCosineLinearLR(opt, total_steps=10)
    for _ in range(3):
        s.step()
    assert [g["lr"] for g in opt.param_groups] == s.get_last_lr()
    assert s.get_last_lr() == pytest.approx([expected(0.1, 3, 10), expected(0.2, 3, 10)],
                                             rel=1e-15)


@pytest.mark.parametrize("kwargs, message", [
    (dict(total_steps=0), "total_steps must be a positive integer"),
    (dict(total_steps=2.5), "total_steps must be a positive integer"),
    (dict(total_steps=True), "total_steps must be a positive integer"),
    (dict(total_steps=10, warmup_steps=10), r"warmup_steps must be an integer in \[0, "),
    (dict(total_steps=10, warmup_steps=-1), r"warmup_steps must be an integer in \[0, "),
    (dict(total_steps=10, warmup_steps=1.0), r"warmup_steps must be an integer in \[0, "),
    (dict(total_steps=10, cosine_weight=1.5), r"cosine_weight must be in \[0, 1\]"),
    (dict(total_steps=10, cosine_weight=-0.1), r"cosine_weight must be in \[0, 1\]"),
    (dict(total_steps=10, cosine_weight=float("nan")), "cosine_weight must be a real"),
    (dict(total_steps=10, cosine_weight="0.5"), "cosine_weight must be a real"),
    (dict(total_steps=10, eta_min=-1e-3), "eta_min must be a finite number >= 0"),
    (dict(total_steps=10, eta_min=float("inf")), "eta_min must be a finite number >= 0"),
    (dict(total_steps=10, warmup_steps=2, warmup_start_factor=2.0),
     r"warmup_start_factor must be in \[0, 1\]"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HybridCosineLinearLR(make_opt(), **kwargs)


def test_not_an_optimizer():
    with pytest.raises(TypeError, match="is not an Optimizer"):
        HybridCosineLinearLR(object(), total_steps=10)


def test_state_round_trip_continues_identically():
    kw = dict(total_steps=25, warmup_steps=4, cosine_weight=0.7, eta_min=1e-4)
    a_opt = make_opt((0.3, 0.05))
    a = HybridCosineLinearLR(a_opt, **kw)
    for _ in range(9):
        a.step()
    sd = a.state_dict()
    assert all(isinstance(v, (int, float)) for v in sd.values())   # checkpoint scalars
    b_opt = make_opt((0.3, 0.05))
    b_opt.load_state_dict(a_opt.state_dict())       # the optimizer restores the groups' lr
    b = HybridCosineLinearLR(b_opt, **kw, last_epoch=-1)
    b.load_state_dict(sd)
    assert b.last_epoch == a.last_epoch and b.get_last_lr() == a.get_last_lr()
    for _ in range(20):
        a.step()
        b.step()
        assert b.get_last_lr() == a.get_last_lr()
        assert [g["lr"] for g in b_opt.param_groups] == a.get_last_lr()
    # resuming from the optimizer's saved initial_lr with last_epoch also continues
    c_opt = make_opt((0.3, 0.05))
    c_opt.load_state_dict(a_opt.state_dict())
    c = HybridCosineLinearLR(c_opt, **kw, last_epoch=a.last_epoch - 1)
    assert c.get_last_lr() == a.get_last_lr()
