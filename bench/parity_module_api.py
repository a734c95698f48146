"""Parity (not a benchmark, not a test): the tensor reductions of
``disttensor.autograd.reductions``, a custom ``Function``, module backward hooks
(``grad_input``/``grad_output``) and ``retain_grad`` against PyTorch 2.13 CPU in float64, on a
row split and a column split of the same arrays (uneven blocks; a 2-D grid on 4 ranks).

One line per case: ``max |ours - torch| / max |torch|`` of the value and of every gradient
(the backward of a fixed random weighting of the output).  PyTorch is an oracle only here::

    mpiexec -n 1 .venv/bin/python bench/parity_module_api.py
    mpiexec -n 2 .venv/bin/python bench/parity_module_api.py
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor import autograd as ag  # noqa: E402
from disttensor import nn  # noqa: E402
from disttensor.autograd import Function, Tensor  # noqa: E402

COMM = MPI.COMM_WORLD
SIZE, RANK = COMM.Get_size(), COMM.Get_rank()
SHAPE = (5, 7)
LAYOUTS = {"rows": ((SIZE,), (0, None)), "cols": ((SIZE,), (None, 0))}
if SIZE == 4:
    LAYOUTS["2x2"] = ((2, 2), (0, 1))


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    scale = np.abs(b).max(initial=0.0)
    err = np.abs(a - b).max(initial=0.0)
    return float(err / scale) if scale > 0 else float(err)


def val(t):
    d = t.data if isinstance(t, Tensor) else t
    return d.to_numpy() if isinstance(d, dt.DistArray) else np.asarray(d)


def dist(a, layout, grad=True):
    dims, split = layout
    return Tensor(dt.from_global(np.ascontiguousarray(a), grid=dt.ProcessGrid(dims),
                                 split=split), requires_grad=grad)


def weight(y, seed):
    """A fixed random weighting ``r`` of output ``y`` (ours and torch's) for the backward."""
    shape = tuple(np.shape(val(y)))
    r = np.random.default_rng(seed).standard_normal(shape)
    d = y.data
    ours = float(r) if not shape else Tensor(
        dt.from_global(r, grid=d.grid, split=d.split) if isinstance(d, dt.DistArray) else r)
    return ours, torch.tensor(r)


def case(name, ours_fn, torch_fn, arrays, layout, rows):
    xs = [dist(a, layout) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    y, ty = ours_fn(*xs), torch_fn(*ts)
    r, tr = weight(y, 7)
    (y * r).sum().backward()
    (ty * tr).sum().backward()
    errs = [rel(val(y), ty.detach().numpy())]
    errs += [rel(val(x.grad), t.grad.numpy()) for x, t in zip(xs, ts)]
    rows.append((name, errs))


class Cube(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.power(x.data, 3)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * np.power(x.data, 2)


class TCube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x ** 2


def hooks_case(layout, rows):
    """A Linear with a full backward pre-hook (x0.5) and hook (x10 on grad_input), the output
    retained: what the hooks see and the gradients, ours vs torch."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((SIZE + 3, 4))
    lin = nn.Linear(4, 3, dtype="float64", rng=rng)
    tl = torch.nn.Linear(4, 3).double()
    with torch.no_grad():
        tl.weight.copy_(torch.tensor(lin.weight.data))
        tl.bias.copy_(torch.tensor(lin.bias.data))
    seen, tseen = {}, {}
    for mod, store, wrap in ((lin, seen, val), (tl, tseen, lambda t: t.detach().numpy())):
        mod.register_full_backward_pre_hook(
            lambda m, go, s=store, w=wrap: (s.__setitem__("go", w(go[0])), (go[0] * 0.5,))[1])
        mod.register_full_backward_hook(
            lambda m, gi, go, s=store, w=wrap: (s.__setitem__("gi", w(gi[0])),
                                                (gi[0] * 10.0,))[1])
    dims, split = layout
    x = Tensor(dt.from_global(a, grid=dt.ProcessGrid(dims), split=(split[0], None)),
               requires_grad=True)
    tx = torch.tensor(a, requires_grad=True)
    y, ty = lin(x), tl(tx)
    y.retain_grad()
    ty.retain_grad()
    r, tr = weight(y, 5)
    (y * r).sum().backward()
    (ty * tr).sum().backward()
    rows.append(("Linear + backward hooks", [
        rel(val(y), ty.detach().numpy()), rel(seen["go"], tseen["go"]),
        rel(seen["gi"], tseen["gi"]), rel(val(x.grad), tx.grad.numpy()),
        rel(lin.weight.grad, tl.weight.grad.numpy()), rel(val(y.grad), ty.grad.numpy())]))


def main():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 4, SHAPE).astype(np.float64)          # ties for max/min
    b, lo, hi = (rng.standard_normal(SHAPE), rng.standard_normal(SHAPE) - 0.4,
                 rng.standard_normal(SHAPE) + 0.4)
    cond = b > 0
    cases = [
        ("sum(dim=1, keepdim)", lambda x: x.sum(1, keepdim=True),
         lambda x: x.sum(1, keepdim=True), [b]),
        ("mean(dim=0)", lambda x: x.mean(0), lambda x: x.mean(0), [b]),
        ("max() ties", lambda x: x.max(), lambda x: x.max(), [a]),
        ("max(dim=1).values", lambda x: x.max(1).values, lambda x: x.max(1).values, [a]),
        ("min(dim=0, keepdim)", lambda x: x.min(0, keepdim=True)[0],
         lambda x: x.min(0, keepdim=True)[0], [a]),
        ("amax(dim=1) ties", lambda x: x.amax(1), lambda x: x.amax(1), [a]),
        ("var(dim=1)", lambda x: x.var(1), lambda x: x.var(1), [b]),
        ("var(correction=0)", lambda x: x.var(correction=0),
         lambda x: x.var(correction=0), [b]),
        ("std(dim=0, keepdim)", lambda x: x.std(0, keepdim=True),
         lambda x: x.std(0, keepdim=True), [b]),
        ("clamp(-0.5, 0.5)", lambda x: x.clamp(-0.5, 0.5), lambda x: x.clamp(-0.5, 0.5),
         [b]),
        ("clamp(tensor, tensor)", lambda x, l, h: x.clamp(l, h),
         lambda x, l, h: x.clamp(l, h), [b, lo, hi]),
        ("clamp(crossed bounds)", lambda x, l, h: x.clamp(h, l),
         lambda x, l, h: x.clamp(h, l), [b, lo, hi]),
        ("Function (cube)", lambda x: Cube.apply(x), lambda x: TCube.apply(x), [b]),
    ]
    for lname, layout in LAYOUTS.items():
        rows = []
        for name, ours, theirs, arrays in cases:
            case(name, ours, theirs, arrays, layout, rows)
        c = dist(cond, layout, grad=False)
        case("where", lambda x, y: ag.where(c, x, y),
             lambda x, y: torch.where(torch.tensor(cond), x, y), [b, lo], layout, rows)
        hooks_case(layout, rows)
        if RANK == 0:
            print(f"\n{SIZE} rank(s), {lname} layout, shape {SHAPE}: max relative error")
            print(f"{'case':28s} value      gradients")
            for name, errs in rows:
                print(f"{name:28s} " + " ".join(f"{e:9.2e}" for e in errs))


if __name__ == "__main__":
    main()
