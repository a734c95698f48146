"""The gradients DistributedDataParallel hands out are views of its host buckets (no copy out
of the summed bucket), with PyTorch's semantics of ``.grad`` kept: against a float64 NumPy
reference of two linear layers (one used in some steps only), over several buckets on a
sample grid of all the ranks:

* after backward each ``.grad`` is a view of its bucket's buffer, equal to the reference;
* a ``.grad`` (or an array made from it) held across the next step never changes, and the
  next step's gradients are still right;
* backward twice without ``zero_grad`` adds (accumulation), so does
  ``zero_grad(set_to_none=False)`` followed by backward;
* a parameter used in one step and unused in the next keeps ``.grad`` ``None`` after
  ``zero_grad`` (the bucket's old sums are not handed out again).
"""
from __future__ import annotations

import numpy as np

import disttensor as dt
from disttensor import nn
from disttensor.autograd import Tensor
from disttensor.nn import functional as F

from checks import SIZE, expect, grid
from gradchecks import close, guarded

FIN, FOUT, ROWS = 3, 2, 2 * SIZE + 1


class _TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(11)
        self.a = nn.Linear(FIN, FOUT, dtype="float64", rng=rng)
        self.b = nn.Linear(FIN, FOUT, dtype="float64", rng=rng)
        self.use_b = True

    def forward(self, x):
        y = self.a(x)
        return y + self.b(x) if self.use_b else y


def _reference(net, x, y, use_b):
    """float64 NumPy gradients of ``mean((x A^T + a (+ x B^T + b) - y)^2)``."""
    p = {n: np.asarray(q.data, np.float64) for n, q in net.named_parameters()}
    out = x @ p["a.weight"].T + p["a.bias"]
    if use_b:
        out = out + x @ p["b.weight"].T + p["b.bias"]
    d = 2.0 * (out - y) / out.size
    g = {"a.weight": d.T @ x, "a.bias": d.sum(axis=0)}
    if use_b:
        g.update({"b.weight": d.T @ x, "b.bias": d.sum(axis=0)})
    return g


def _backward(ddp, g, rng, use_b):
    x = rng.standard_normal((ROWS, FIN))
    y = rng.standard_normal((ROWS, FOUT))
    ddp.module.use_b = use_b
    xt = Tensor(dt.from_global(x, grid=g, split=(0, None)))
    yt = Tensor(dt.from_global(y, grid=g, split=(0, None)))
    F.mse_loss(ddp(xt), yt).backward()
    return _reference(ddp.module, x, y, use_b)


@guarded
def test_grads_are_bucket_views_with_pytorch_semantics():
    g = grid((SIZE,))
    net = _TwoLayers()
    ddp = nn.DistributedDataParallel(net, g, bucket_bytes=64)  # several buckets
    params = dict(net.named_parameters())
    rng = np.random.default_rng(5)
    try:
        expect(len(ddp.reducer.buckets) > 1, "the test needs several buckets")
        # 1. views of the buckets, equal to the reference
        ref = _backward(ddp, g, rng, True)
        buffers = [b.buffer for b in ddp.reducer.buckets]
        for n, p in params.items():
            close(p.grad, ref[n], f"step 1 {n}", rtol=1e-12, atol=1e-15)
            if SIZE > 1:
                expect(any(np.shares_memory(p.grad, buf) for buf in buffers),
                       f"{n}: .grad is not a view of a bucket")
        # 2. held gradients never change; the next step's are right
        held = {n: p.grad for n, p in params.items()}
        part = params["a.weight"].grad[0]
        kept = {n: h.copy() for n, h in held.items()}
        kept_part = part.copy()
        net.zero_grad()
        ref = _backward(ddp, g, rng, True)
        for n, p in params.items():
            close(p.grad, ref[n], f"step 2 {n}", rtol=1e-12, atol=1e-15)
            expect(np.array_equal(held[n], kept[n]), f"{n}: a held .grad changed")
        expect(np.array_equal(part, kept_part), "an array made from a held .grad changed")
        del held, part
        # 3. accumulation: backward again without zero_grad, then after set_to_none=False
        first = {n: p.grad.copy() for n, p in params.items()}
        ref = _backward(ddp, g, rng, True)
        for n, p in params.items():
            close(p.grad, first[n] + ref[n], f"accumulated {n}", rtol=1e-12, atol=1e-15)
        net.zero_grad(set_to_none=False)
        ref = _backward(ddp, g, rng, True)
        for n, p in params.items():
            close(p.grad, ref[n], f"after zero_grad(set_to_none=False) {n}", rtol=1e-12,
                  atol=1e-15)
        # 4. used, then unused: None again after zero_grad
        net.zero_grad()
        ref = _backward(ddp, g, rng, True)
        net.zero_grad()
        ref = _backward(ddp, g, rng, False)
        for n, p in params.items():
            if n.startswith("b."):
                expect(p.grad is None, f"{n}: unused in this step but got {p.grad}")
            else:
                close(p.grad, ref[n], f"a step without b {n}", rtol=1e-12, atol=1e-15)
    finally:
        ddp.reducer.release()
