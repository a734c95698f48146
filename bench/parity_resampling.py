"""Parity and speed of disttensor's resampling ops (interpolate, adaptive avg/max pooling,
pad, pooling with ceil_mode / dilation / divisor_override) against PyTorch 2.13 CPU.

Parity (float64): forward and input gradient (of ``sum(y * dy)`` for a random ``dy``) on a few
shapes, the array cut along its first spatial axis over all ranks (uneven blocks; more ranks
than cells gives empty ones), gathered and compared on rank 0 with PyTorch's:
``max |ours - torch| / max |torch|`` per array.  Speed (float32, one process, the median of
``--repeat`` runs): forward + backward of ours against PyTorch's on U-Net / ResNet activation
shapes, PyTorch on as many threads as Numba.  Spatial efficiency (``--scaling``, 2+ ranks):
forward + backward at ``(1, 8, 64, 64, 64)`` float32 split along D over all ranks against the
same on rank 0 alone (the others waiting), ``t1 / (P * tP)``.  PyTorch is an oracle only here::

    .venv/bin/python bench/parity_resampling.py
    mpiexec -n 2 .venv/bin/python -m mpi4py bench/parity_resampling.py
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
from disttensor.autograd import Tensor  # noqa: E402
from disttensor.nn import resampling as R  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
LIN = {3: "linear", 4: "bilinear", 5: "trilinear"}


def cases():
    out = []
    for shape in ((2, 3, 7), (2, 2, 5, 6), (1, 2, 4, 5, 3)):
        k = len(shape)
        for mode, ac in (("nearest", None), ("nearest-exact", None), (LIN[k], False),
                         (LIN[k], True), ("area", None)):
            for kw in (dict(scale_factor=1.5), dict(scale_factor=2), dict(scale_factor=0.6),
                       dict(size=tuple(n + 3 for n in shape[2:]))):
                if mode == "area" and "scale_factor" in kw:
                    continue
                name = f"interpolate {mode} ac={ac} {kw}"
                out.append((name, shape,
                            lambda x, m=mode, a=ac, kw=kw: R.interpolate(x, mode=m,
                                                                         align_corners=a, **kw),
                            lambda t, m=mode, a=ac, kw=kw: TF.interpolate(t, mode=m,
                                                                          align_corners=a,
                                                                          **kw)))
        nd = k - 2
        for size in (1, 3, tuple(n + 2 for n in shape[2:])):
            for kind in ("avg", "max"):
                ours = getattr(R, f"adaptive_{kind}_pool{nd}d")
                theirs = getattr(TF, f"adaptive_{kind}_pool{nd}d")
                out.append((f"adaptive_{kind}_pool{nd}d {size}", shape,
                            lambda x, f=ours, s=size: f(x, s),
                            lambda t, f=theirs, s=size: f(t, s)))
        mp, tmp = getattr(R, f"max_pool{nd}d"), getattr(TF, f"max_pool{nd}d")
        out.append((f"max_pool{nd}d k3 s2 p1 dilation 2 ceil_mode", shape,
                    lambda x, f=mp: f(x, 3, 2, 1, 2, True),
                    lambda t, f=tmp: f(t, 3, 2, 1, 2, True)))
        ap, tap = getattr(R, f"avg_pool{nd}d"), getattr(TF, f"avg_pool{nd}d")
        for incl in (True, False):
            out.append((f"avg_pool{nd}d k3 s2 p1 ceil_mode include_pad={incl}", shape,
                        lambda x, f=ap, i=incl: f(x, 3, 2, 1, True, i),
                        lambda t, f=tap, i=incl: f(t, 3, 2, 1, True, i)))
        if nd > 1:
            out.append((f"avg_pool{nd}d k2 ceil_mode divisor_override=3", shape,
                        lambda x, f=ap: f(x, 2, 2, 0, True, True, 3),
                        lambda t, f=tap: f(t, 2, 2, 0, True, True, 3)))
        for mode in ("constant", "reflect", "replicate", "circular"):
            p = tuple(v for _ in range(nd) for v in (2, 1))
            out.append((f"pad {mode} {p}", shape, lambda x, m=mode, p=p: R.pad(x, p, m),
                        lambda t, m=mode, p=p: TF.pad(t, p, m)))
    return out


def rel(a, b) -> float:
    scale = np.abs(b).max() if b.size else 0.0
    d = np.abs(a - b).max() if b.size else 0.0
    return float(d / scale) if scale > 0 else float(d)


def parity():
    rng = np.random.default_rng(0)
    grid = dt.ProcessGrid((SIZE,))
    rows = []
    for name, shape, ours, theirs in cases():
        xg = rng.normal(size=shape)
        split = (None, None, 0) + (None,) * (len(shape) - 3)
        x = Tensor(dt.from_global(xg, grid=grid, split=split), requires_grad=True)
        y = ours(x)
        t = torch.tensor(xg, requires_grad=True)
        ty = theirs(t)
        dyg = rng.normal(size=tuple(ty.shape))
        ty.backward(torch.tensor(dyg))
        y.backward(dt.from_global(dyg.astype(np.float64), grid=grid, split=y.data.split,
                                  sizes=y.data.distribution.split_sizes))
        yn, gn = y.data.to_numpy(), x.grad.to_numpy()
        if RANK == 0:
            fwd = rel(yn, ty.detach().numpy()) if yn.shape == tuple(ty.shape) else float("inf")
            rows.append((name, shape, fwd, rel(gn, t.grad.numpy())))
    if RANK == 0:
        print(f"parity vs torch {torch.__version__} float64, {SIZE} rank(s): max relative error")
        print(f"{'op':58s} {'shape':18s} {'forward':>9s} {'grad':>9s}")
        for name, shape, f, g in rows:
            print(f"{name:58s} {str(shape):18s} {f:9.1e} {g:9.1e}")
        worst = max(max(f, g) for _, _, f, g in rows)
        print(f"worst: {worst:.1e} over {len(rows)} cases")


def speed(repeat: int):
    if RANK != 0:
        return
    from numba import get_num_threads
    torch.set_num_threads(get_num_threads())
    grid = dt.ProcessGrid((1,), comm=MPI.COMM_SELF)
    rng = np.random.default_rng(1)
    runs = [("trilinear x2 (U-Net up)", (2, 16, 24, 24, 24),
             lambda x: R.interpolate(x, scale_factor=2, mode="trilinear"),
             lambda t: TF.interpolate(t, scale_factor=2, mode="trilinear")),
            ("nearest x2", (2, 16, 24, 24, 24),
             lambda x: R.interpolate(x, scale_factor=2),
             lambda t: TF.interpolate(t, scale_factor=2)),
            ("adaptive_avg_pool3d(1) (ResNet head)", (8, 256, 8, 8, 8),
             lambda x: R.adaptive_avg_pool3d(x, 1), lambda t: TF.adaptive_avg_pool3d(t, 1)),
            ("adaptive_max_pool3d(3)", (2, 32, 24, 24, 24),
             lambda x: R.adaptive_max_pool3d(x, 3), lambda t: TF.adaptive_max_pool3d(t, 3)),
            ("pad reflect 1", (2, 16, 32, 32, 32),
             lambda x: R.pad(x, (1,) * 6, "reflect"), lambda t: TF.pad(t, (1,) * 6, "reflect"))]
    print(f"\nspeed, float32 forward+backward, one process, {get_num_threads()} thread(s), "
          f"median of {repeat}")
    for name, shape, ours, theirs in runs:
        xg = rng.normal(size=shape).astype(np.float32)

        def run_ours():
            x = Tensor(dt.from_global(xg, grid=grid), requires_grad=True)
            y = ours(x)
            y.backward(dt.from_global(np.ones(y.data.shape, np.float32), grid=grid))

        def run_torch():
            t = torch.tensor(xg, requires_grad=True)
            y = theirs(t)
            y.backward(torch.ones_like(y))
        times = {}
        for label, fn in (("ours", run_ours), ("torch", run_torch)):
            fn()
            ts = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            times[label] = float(np.median(ts))
        print(f"{name:40s} {str(shape):22s} ours {times['ours'] * 1e3:8.2f} ms  torch "
              f"{times['torch'] * 1e3:8.2f} ms  ratio {times['ours'] / times['torch']:5.2f}")


SCALING = [("interpolate trilinear x2", lambda x: R.interpolate(x, scale_factor=2,
                                                                  mode="trilinear")),
           ("interpolate nearest x2", lambda x: R.interpolate(x, scale_factor=2)),
           ("adaptive_avg_pool3d(1)", lambda x: R.adaptive_avg_pool3d(x, 1)),
           ("adaptive_max_pool3d(4)", lambda x: R.adaptive_max_pool3d(x, 4)),
           ("pad reflect 2", lambda x: R.pad(x, (2,) * 6, "reflect")),
           ("max_pool3d 3 s2 ceil", lambda x: R.max_pool3d(x, 3, 2, 1, ceil_mode=True))]


def _step(fn, x):
    t = Tensor(x, requires_grad=True)
    y = fn(t)
    y.backward(dt.ones(y.data.shape, dtype=y.data.dtype, grid=y.data.grid, split=y.data.split,
                       sizes=y.data.distribution.split_sizes))


def _median_time(fn, x, repeat, comm):
    _step(fn, x)
    ts = []
    for _ in range(repeat):
        comm.Barrier()
        t0 = time.perf_counter()
        _step(fn, x)
        comm.Barrier()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def scaling(repeat: int):
    shape = (1, 8, 64, 64, 64)
    xg = np.random.default_rng(2).normal(size=shape).astype(np.float32)
    grid = dt.ProcessGrid((SIZE,))
    x = dt.from_global(xg, grid=grid, split=(None, None, 0, None, None))
    if RANK == 0:
        one = dt.ProcessGrid((1,), comm=MPI.COMM_SELF)
        x1 = dt.from_global(xg, grid=one)
    lines = []
    for name, fn in SCALING:
        t1 = _median_time(fn, x1, repeat, MPI.COMM_SELF) if RANK == 0 else 0.0
        COMM.Barrier()
        tp = _median_time(fn, x, repeat, COMM)
        lines.append((name, t1, tp))
    if RANK == 0:
        print(f"\nspatial efficiency, {shape} float32 forward+backward, split along D over "
              f"{SIZE} ranks, median of {repeat}")
        for name, t1, tp in lines:
            print(f"{name:30s} 1 rank {t1 * 1e3:8.1f} ms  {SIZE} ranks {tp * 1e3:8.1f} ms  "
                  f"efficiency {t1 / (SIZE * tp):5.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--no-parity", action="store_true")
    ap.add_argument("--scaling", action="store_true")
    args = ap.parse_args()
    if not args.no_parity:
        parity()
    if not args.no_speed:
        speed(args.repeat)
    if args.scaling and SIZE > 1:
        scaling(args.repeat)


if __name__ == "__main__":
    main()
