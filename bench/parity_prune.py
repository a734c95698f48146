"""Parity of nn.prune and the sparse layers with PyTorch 2.13 (CPU, float64): pruning masks
(l1/ln-structured/global, repeated pruning), pruned training under SGD momentum, Adam with
weight decay and AdamW (the effective weight ``weight_orig * weight_mask`` against ours), and
SparseLinear / SparseConv3d forward and every gradient against ``F.linear`` / ``F.conv3d`` with
the masked weight.  Prints a table of max relative errors (masks: number of differing
entries).  PyTorch is the oracle here only.

    mpiexec -n 1 python -m mpi4py bench/parity_prune.py      (or -n 2: samples split)
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.utils.prune as tprune
from mpi4py import MPI

import disttensor as dt
from disttensor import nn
from disttensor.autograd import Tensor
from disttensor.nn import prune
from disttensor.nn.sparse_layers import SparseConv3d, SparseLinear

COMM = MPI.COMM_WORLD
ROWS = []


def rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)) if b.size else 0.0


def row(what, value, unit="max rel err"):
    ROWS.append((what, value, unit))


def twin_linear(fin, fout, seed):
    ours = nn.Linear(fin, fout, dtype="float64", rng=np.random.default_rng(seed))
    theirs = torch.nn.Linear(fin, fout).double()
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(ours.weight.data))
        theirs.bias.copy_(torch.from_numpy(ours.bias.data))
    return ours, theirs


def masks():
    for amount in (0.3, 0.5, 7):
        a, b = twin_linear(12, 9, 1)
        prune.l1_unstructured(a, "weight", amount)
        tprune.l1_unstructured(b, "weight", amount)
        row(f"l1_unstructured amount={amount}", int((prune.mask_of(a, "weight") !=
                                                     b.weight_mask.numpy()).sum()), "entries")
    a, b = twin_linear(12, 9, 2)
    for amount in (0.5, 0.5, 3):
        prune.l1_unstructured(a, "weight", amount)
        tprune.l1_unstructured(b, "weight", amount)
    row("l1 repeated 0.5, 0.5, 3", int((prune.mask_of(a, "weight") !=
                                        b.weight_mask.numpy()).sum()), "entries")
    for n, dim in ((1, 0), (2, 1), (float("inf"), 0)):
        c = nn.Conv3d(4, 6, 3, dtype="float64", rng=np.random.default_rng(3))
        t = torch.nn.Conv3d(4, 6, 3).double()
        with torch.no_grad():
            t.weight.copy_(torch.from_numpy(c.weight.data))
        prune.ln_structured(c, "weight", 0.5, n, dim)
        tprune.ln_structured(t, "weight", 0.5, n, dim)
        row(f"ln_structured n={n} dim={dim}", int((prune.mask_of(c, "weight") !=
                                                   t.weight_mask.numpy()).sum()), "entries")
    (a1, b1), (a2, b2) = twin_linear(10, 8, 4), twin_linear(8, 5, 5)
    prune.global_unstructured([(a1, "weight"), (a2, "weight")], prune.L1Unstructured,
                              amount=0.6)
    tprune.global_unstructured([(b1, "weight"), (b2, "weight")], tprune.L1Unstructured,
                               amount=0.6)
    row("global_unstructured 0.6", int(sum((prune.mask_of(a, "weight") !=
                                            b.weight_mask.numpy()).sum()
                                           for a, b in ((a1, b1), (a2, b2)))), "entries")


def training():
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((9, 12)) for _ in range(100)]
    for name, ours_opt, their_opt in (
            ("SGD momentum 0.9 wd 0.1", lambda p: nn.optim.SGD(p, lr=0.05, momentum=0.9,
                                                               weight_decay=0.1),
             lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.1)),
            ("Adam wd 0.1", lambda p: nn.optim.Adam(p, lr=0.01, weight_decay=0.1),
             lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1)),
            ("AdamW wd 0.1", lambda p: nn.optim.AdamW(p, lr=0.01, weight_decay=0.1),
             lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1))):
        a, b = twin_linear(12, 9, 6)
        prune.l1_unstructured(a, "weight", 0.7)
        tprune.l1_unstructured(b, "weight", 0.7)
        oa, ob = ours_opt([a.weight]), their_opt([b.weight_orig])
        for g in grads:
            a.weight.grad = g.copy()
            oa.step()
            ob.zero_grad()
            (b.weight_orig * b.weight_mask * torch.from_numpy(g)).sum().backward()
            ob.step()
        row(f"100 pruned steps, {name}", rel(a.weight.data, (b.weight_orig *
                                                              b.weight_mask).detach().numpy()))


def layers():
    size = COMM.size
    g1 = dt.ProcessGrid((size,))
    a, b = twin_linear(20, 7, 7)
    prune.l1_unstructured(a, "weight", 0.8)
    sp = SparseLinear.from_dense(a)
    x = np.random.default_rng(1).standard_normal((5, 20))
    gy = np.random.default_rng(2).standard_normal((5, 7))
    xt = Tensor(dt.from_global(x, grid=g1, split=(0, None)), requires_grad=True)
    y = sp(xt)
    y.backward(dt.from_global(gy, grid=g1, split=(0, None)))
    tx = torch.from_numpy(x).requires_grad_()
    w = torch.from_numpy(a.weight.data).requires_grad_()
    tb = torch.from_numpy(a.bias.data).requires_grad_()
    ty = torch.nn.functional.linear(tx, w, tb)
    ty.backward(torch.from_numpy(gy))
    r, c = sp.weight_indices
    row(f"SparseLinear y ({size} rank(s))", rel(y.data.to_numpy(), ty.detach().numpy()))
    row("SparseLinear dx", rel(xt.grad.to_numpy(), tx.grad.numpy()))
    row("SparseLinear dW (kept entries)", rel(sp.weight_values.grad, w.grad.numpy()[r, c]))
    row("SparseLinear db", rel(sp.bias.grad, tb.grad.numpy()))
    g3 = dt.ProcessGrid((1, size, 1, 1))
    for k, stride, pad in ((1, 1, 0), (3, 1, 1), (3, 2, 1)):
        conv = nn.Conv3d(3, 5, k, stride=stride, padding=pad, dtype="float64",
                         rng=np.random.default_rng(k))
        prune.l1_unstructured(conv, "weight", 0.7)
        sc = SparseConv3d.from_dense(conv)
        x = np.random.default_rng(3).standard_normal((2, 3, 6, 5, 4))
        xt = Tensor(dt.from_global(x, grid=g3, split=(0, None, 1, 2, 3)), requires_grad=True)
        y = sc(xt)
        gy = np.cos(y.data.to_numpy())
        y.backward(dt.from_global(gy, grid=g3, split=y.data.split,
                                  sizes=y.data.distribution.split_sizes))
        tx = torch.from_numpy(x).requires_grad_()
        w = torch.from_numpy(conv.weight.data).requires_grad_()
        tb = torch.from_numpy(conv.bias.data).requires_grad_()
        ty = torch.nn.functional.conv3d(tx, w, tb, stride, pad)
        ty.backward(torch.from_numpy(gy))
        r, c = sc.weight_indices
        tag = f"SparseConv3d k={k} s={stride} p={pad}"
        row(f"{tag} y", rel(y.data.to_numpy(), ty.detach().numpy()))
        row(f"{tag} dx", rel(xt.grad.to_numpy(), tx.grad.numpy()))
        row(f"{tag} dW", rel(sc.weight_values.grad, w.grad.numpy().reshape(5, -1)[r, c]))
        row(f"{tag} db", rel(sc.bias.grad, tb.grad.numpy()))


def main():
    masks()
    training()
    layers()
    if COMM.rank == 0:
        print(f"parity with PyTorch {torch.__version__} (float64), {COMM.size} rank(s)")
        print(f"{'case':48s} {'value':>12s}  unit")
        for what, v, unit in ROWS:
            print(f"{what:48s} {v:12.3g}  {unit}")


if __name__ == "__main__":
    main()
