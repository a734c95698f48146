"""Parity and speed of disttensor.nn.activation (GELU, SiLU, Softplus, Mish, Hardswish,
Hardsigmoid, PReLU) against PyTorch 2.13 CPU.

Parity (float64): forward, input gradient and PReLU's weight gradient of each activation on a
few shapes, the array cut along its last axis over all ranks (uneven blocks; more ranks than
rows gives empty ones), gathered and compared on rank 0 with PyTorch's:
``max |ours - torch| / max |torch|`` per array.  Speed (float32, rank 0's one process):
forward + backward of ours against PyTorch's on a U-Net activation shape, the median of
``--repeat`` runs, PyTorch on as many threads as Numba.  PyTorch is an oracle only here::

    .venv/bin/python bench/parity_activations.py
    mpiexec -n 2 .venv/bin/python -m mpi4py bench/parity_activations.py
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as TF  # noqa: E402
from mpi4py import MPI  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor import nn  # noqa: E402
from disttensor.autograd import Tensor  # noqa: E402
from disttensor.nn import activation as A  # noqa: E402

from _results import record  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()

CASES = [  # name, ours, torch's
    ("gelu", lambda x: A.gelu(x), lambda t: TF.gelu(t)),
    ("gelu tanh", lambda x: A.gelu(x, "tanh"), lambda t: TF.gelu(t, approximate="tanh")),
    ("silu", A.silu, TF.silu),
    ("softplus", A.softplus, TF.softplus),
    ("softplus b=2 t=3", lambda x: A.softplus(x, 2.0, 3.0),
     lambda t: TF.softplus(t, beta=2.0, threshold=3.0)),
    ("mish", A.mish, TF.mish),
    ("hardswish", A.hardswish, TF.hardswish),
    ("hardsigmoid", A.hardsigmoid, TF.hardsigmoid),
]
SHAPES = [(2, 3, 6, 5, 4), (3, 4, 5, 6), (4, 5, 7)]


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.abs(b).max() if b.size else 0.0
    diff = np.abs(a - b).max() if b.size else 0.0
    return float(diff / scale) if scale > 0 else float(diff)


def _dist(a, grid):
    split = (None,) * (a.ndim - 1) + (0,)
    return dt.from_global(np.ascontiguousarray(a), grid=grid, split=split)


def parity():
    grid = dt.ProcessGrid((SIZE,))
    rows = []
    for shape in SHAPES:
        rng = np.random.default_rng(len(shape))
        x = rng.standard_normal(shape) * 3
        x.reshape(-1)[:4] = (0.0, -3.0, 3.0, 25.0)
        dy = rng.standard_normal(shape)
        for name, ours, theirs in CASES:
            t = Tensor(_dist(x, grid), requires_grad=True)
            y = ours(t)
            y.backward(_dist(dy, grid))
            y_np, dx_np = y.data.to_numpy(), t.grad.to_numpy()
            if RANK == 0:
                tt = torch.tensor(x, requires_grad=True)
                ty = theirs(tt)
                ty.backward(torch.tensor(dy))
                rows.append((name, shape, rel(y_np, ty.detach().numpy()),
                             rel(dx_np, tt.grad.numpy()), None))
        for nw in (1, shape[1]):
            w0 = rng.uniform(-0.5, 0.5, nw)
            t = Tensor(_dist(x, grid), requires_grad=True)
            w = nn.Parameter(w0.copy())
            y = A.prelu(t, w)
            y.backward(_dist(dy, grid))
            y_np, dx_np = y.data.to_numpy(), t.grad.to_numpy()
            if RANK == 0:
                tt, tw = torch.tensor(x, requires_grad=True), torch.tensor(w0, requires_grad=True)
                ty = TF.prelu(tt, tw)
                ty.backward(torch.tensor(dy))
                rows.append((f"prelu({nw})", shape, rel(y_np, ty.detach().numpy()),
                             rel(dx_np, tt.grad.numpy()), rel(np.asarray(w.grad),
                                                              tw.grad.numpy())))
    if RANK == 0:
        print(f"parity vs torch {torch.__version__}, float64, {SIZE} rank(s), last axis split")
        print(f"{'activation':<18} {'shape':<16} {'forward':>9} {'dx':>9} {'dweight':>9}")
        for name, shape, ey, edx, edw in rows:
            dw = f"{edw:9.1e}" if edw is not None else f"{'-':>9}"
            print(f"{name:<18} {str(shape):<16} {ey:9.1e} {edx:9.1e} {dw}")
        worst = max(max(r[2], r[3], r[4] or 0.0) for r in rows)
        print(f"worst: {worst:.1e}")
        record("parity_activations", f"all, {SIZE} ranks", "max_rel_err", worst, "fraction",
               better="lower", ranks=SIZE)


def _median_time(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def speed(shape, repeat):
    import numba
    threads = numba.get_num_threads()
    torch.set_num_threads(threads)
    grid = dt.ProcessGrid((1,), comm=MPI.COMM_SELF)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    xd, dyd = _dist(x, grid), _dist(dy, grid)
    tx, tdy = torch.tensor(x), torch.tensor(dy)
    print(f"\nspeed, float32 {shape}, forward + backward, median of {repeat}, "
          f"{threads} thread(s)")
    print(f"{'activation':<18} {'ours ms':>9} {'torch ms':>9} {'ratio':>7}")
    cases = CASES + [("prelu(C)", lambda t: A.prelu(t, w), lambda t: TF.prelu(t, tw))]
    w = nn.Parameter(np.full(shape[1], 0.25, np.float32))
    tw = torch.full((shape[1],), 0.25, requires_grad=True)
    for name, ours, theirs in cases:
        def run_ours():
            t = Tensor(xd, requires_grad=True)
            ours(t).backward(dyd)

        def run_torch():
            t = tx.clone().requires_grad_(True)
            theirs(t).backward(tdy)
        run_ours()
        run_torch()
        a, b = _median_time(run_ours, repeat), _median_time(run_torch, repeat)
        print(f"{name:<18} {a * 1e3:9.2f} {b * 1e3:9.2f} {a / b:7.2f}")
        record("parity_activations", f"{name} {shape} fwd+bwd", "ratio_vs_torch", a / b, "x",
               better="lower", ranks=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="2,32,32,32,32", help="speed shape N,C,D,H,W")
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    parity()
    if RANK == 0:
        speed(tuple(int(v) for v in args.shape.split(",")), args.repeat)
    COMM.Barrier()


if __name__ == "__main__":
    main()
