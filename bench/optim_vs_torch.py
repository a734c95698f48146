"""Verification (not a benchmark, not a test): disttensor.nn's optimizers, LR schedulers,
gradient clipping and GradScaler against PyTorch's, on the same random gradients.

For every configuration both run 100 steps from the same start on the same gradients; one line
per configuration gives the largest difference over all steps and parameters, relative to the
largest magnitude of the reference::

    max_t max_i |ours_i - torch_i| / max_i |torch_i|

PyTorch is not a dependency of disttensor; install it in a throw-away environment and point
this script at it (its site-packages is appended to ``sys.path``, after ours)::

    python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch==2.13.0 numpy
    .venv/bin/python bench/optim_vs_torch.py --torch-site /tmp/torchenv/lib/python3.11/site-packages

Seen with torch 2.13.0 (CPU): optimizers within 7e-16 in float64 and 3e-7 in float32 (PyTorch's
``lerp`` and fused ``addcdiv`` round differently from the documented formulas we follow);
schedulers within 4e-14 (PyTorch updates the rate recursively, we use closed forms); the
clipping norm within 1e-6 in float32 (PyTorch accumulates float32 gradients in float32, we in
float64) and 1e-15 in float64; GradScaler's scale identical at every step.
"""
from __future__ import annotations

import argparse
import itertools
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = [(8, 4, 3, 3, 3), (8,), (10, 20)]
STEPS = 100


class P:
    def __init__(self, data):
        self.data = data
        self.grad = None
        self.requires_grad = True


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.abs(b).max()
    return float(np.abs(a - b).max() / scale) if scale > 0 else float(np.abs(a - b).max())


def compare_optimizer(torch, ours_cls, torch_cls, kwargs, dtype, seed=0):
    rng = np.random.default_rng(seed)
    init = [rng.normal(size=s).astype(dtype) for s in SHAPES]
    ours = [P(a.copy()) for a in init]
    theirs = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in init]
    o = ours_cls(ours, **kwargs)
    t = torch_cls(theirs, foreach=False, **kwargs)
    worst = 0.0
    for _ in range(STEPS):
        for p, q in zip(ours, theirs):
            g = rng.normal(size=p.data.shape).astype(dtype)
            p.grad = g.copy()
            q.grad = torch.from_numpy(g.copy())
        o.step()
        t.step()
        worst = max(worst, *(rel(p.data, q.detach().numpy()) for p, q in zip(ours, theirs)))
    return worst


def optimizer_configs():
    for m, d, n, w, x in itertools.product([0.0, 0.9], [0.0, 0.1], [False, True], [0.0, 1e-2],
                                           [False, True]):
        if n and (m == 0 or d != 0):
            continue
        yield "SGD", dict(lr=0.01, momentum=m, dampening=d, nesterov=n, weight_decay=w,
                          maximize=x)
    for name in ("Adam", "AdamW"):
        for w, a, x in itertools.product([0.0, 1e-2], [False, True], [False, True]):
            yield name, dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=w, amsgrad=a,
                             maximize=x)


def compare_schedulers(torch):
    from disttensor.nn import lr_scheduler as ours
    from disttensor.nn.optim import SGD
    tls = torch.optim.lr_scheduler

    def cosmo(epoch, warm=4, factor=8.0, schedule={32: 0.25, 64: 0.125}):
        lr0 = 1.0 / factor  # the MLPerf reference's _lr_schedule as a multiplier of peak lr 1
        if epoch < warm:
            return epoch * (1.0 - lr0) / warm + lr0
        decay_factor, decay_epoch = 1.0, 0
        for e, d in schedule.items():
            if e >= decay_epoch and e < epoch:
                decay_epoch, decay_factor = e, d
        return decay_factor

    cases = [
        ("LambdaLR", lambda o: ours.LambdaLR(o, lambda e: 0.97 ** e),
         lambda o: tls.LambdaLR(o, lambda e: 0.97 ** e)),
        ("LinearLR", lambda o: ours.LinearLR(o, 0.1, 1.0, 30),
         lambda o: tls.LinearLR(o, 0.1, 1.0, 30)),
        ("StepLR", lambda o: ours.StepLR(o, 7, 0.5), lambda o: tls.StepLR(o, 7, 0.5)),
        ("MultiStepLR", lambda o: ours.MultiStepLR(o, [10, 30, 30, 70], 0.3),
         lambda o: tls.MultiStepLR(o, [10, 30, 30, 70], 0.3)),
        ("CosineAnnealingLR", lambda o: ours.CosineAnnealingLR(o, 40, 1e-4),
         lambda o: tls.CosineAnnealingLR(o, 40, 1e-4)),
        ("CosmoFlowLR vs LambdaLR(MLPerf reference fn)",
         lambda o: ours.CosmoFlowLR(o, warmup_epochs=4, warmup_factor=8.0),
         lambda o: tls.LambdaLR(o, cosmo)),
    ]
    for name, mk_ours, mk_torch in cases:
        o = SGD([P(np.zeros(2))], lr=0.1)
        t = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
        so, st = mk_ours(o), mk_torch(t)
        a, b = [], []
        for _ in range(STEPS):
            a.append(so.get_last_lr()[0])
            b.append(st.get_last_lr()[0])
            t.step()
            so.step()
            st.step()
        elementwise = max(abs(x - y) / abs(y) for x, y in zip(a, b) if y != 0)
        print(f"scheduler {name:46s} max rel diff {elementwise:.2e}")


def compare_clipping(torch):
    from disttensor.nn.utils import clip_grad_norm_
    rng = np.random.default_rng(5)
    for dtype, norm_type, max_norm in itertools.product([np.float32, np.float64],
                                                        [1.0, 2.0, 3.0, math.inf], [0.5, 1e3]):
        grads = [rng.normal(size=s).astype(dtype) for s in SHAPES]
        ours = [P(np.zeros(s, dtype)) for s in SHAPES]
        theirs = [torch.nn.Parameter(torch.zeros(s, dtype=torch.from_numpy(g).dtype))
                  for s, g in zip(SHAPES, grads)]
        for p, q, g in zip(ours, theirs, grads):
            p.grad, q.grad = g.copy(), torch.from_numpy(g.copy())
        n1 = clip_grad_norm_(ours, max_norm, norm_type)
        n2 = float(torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type, foreach=False))
        gdiff = max(rel(p.grad, q.grad.numpy()) for p, q in zip(ours, theirs))
        print(f"clip_grad_norm_ {np.dtype(dtype).name} norm={norm_type} max_norm={max_norm:g}: "
              f"norm rel diff {abs(n1 - n2) / n2:.2e}, clipped grads {gdiff:.2e}")


def compare_grad_scaler(torch):
    from disttensor.nn.amp import GradScaler
    from disttensor.nn.optim import SGD
    rng = np.random.default_rng(7)
    init = [rng.normal(size=s).astype(np.float32) for s in SHAPES]
    ours = [P(a.copy()) for a in init]
    theirs = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in init]
    so, st = GradScaler(init_scale=2.0 ** 10, growth_interval=5), \
        torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=5)
    oo, ot = SGD(ours, lr=0.01, momentum=0.9), torch.optim.SGD(theirs, lr=0.01, momentum=0.9,
                                                               foreach=False)
    scales_equal, worst = True, 0.0
    for step in range(STEPS):
        bad = step % 13 == 3 or step % 17 == 0
        so.scale(1.0)  # scaling a loss (torch creates its scale tensor on the first one)
        st.scale(torch.ones(()))
        for p, q in zip(ours, theirs):
            g = rng.normal(size=p.data.shape).astype(np.float32)
            if bad and p is ours[0]:
                g[0] = np.inf
            p.grad = g * np.float32(so.get_scale())
            q.grad = torch.from_numpy(g * np.float32(st.get_scale()))
        so.step(oo)
        st.step(ot)
        so.update()
        st.update()
        scales_equal &= so.get_scale() == st.get_scale()
        worst = max(worst, *(rel(p.data, q.detach().numpy()) for p, q in zip(ours, theirs)))
    print(f"GradScaler (SGD momentum, float32, infs injected): scales identical every step: "
          f"{scales_equal}, final scale {so.get_scale():g}, params max rel diff {worst:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch-site", help="a site-packages holding torch (appended to sys.path)")
    args = ap.parse_args()
    if args.torch_site:
        sys.path.append(args.torch_site)
    import torch
    torch.set_num_threads(1)
    from disttensor.nn import optim as ours
    print(f"torch {torch.__version__}, numpy {np.__version__}, {STEPS} steps, "
          f"shapes {SHAPES}")
    for name, kwargs in optimizer_configs():
        opts = ", ".join(f"{k}={v}" for k, v in kwargs.items() if k not in ("lr", "eps"))
        diffs = [compare_optimizer(torch, getattr(ours, name), getattr(torch.optim, name),
                                   kwargs, dtype) for dtype in (np.float64, np.float32)]
        print(f"{name:5s} {opts:80s} float64 {diffs[0]:.2e}  float32 {diffs[1]:.2e}")
    compare_schedulers(torch)
    compare_clipping(torch)
    compare_grad_scaler(torch)


if __name__ == "__main__":
    main()
