"""Speed of disttensor's GroupNorm, InstanceNorm3d and LayerNorm (forward + backward through
the nn layers) against PyTorch CPU in the same run, and their 2-rank spatial efficiency.

    .venv/bin/python bench/normalization_bench.py [--quick]
    LD_PRELOAD=build/libmpi_idle_sleep.so mpiexec -n 2 .venv/bin/python -m mpi4py \\
        bench/normalization_bench.py

One thread each (``NUMBA_NUM_THREADS=1``, set here if unset; ``torch.set_num_threads(1)``).

**vs PyTorch** (rank 0's one process; the other ranks wait): float32 CosmoFlow/U-Net
activation shapes ``(4, 16, 64, 64, 64)`` and ``(2, 32, 32, 32, 32)``; layers
``GroupNorm(8, C)``, ``InstanceNorm3d(C, affine=True)``, ``LayerNorm((C, D, H, W))``; one step
= layer forward + backward of a fixed output gradient (input, weight and bias gradients),
ours on a one-rank grid over ``MPI.COMM_SELF``.  Medians of ``--repeat`` interleaved runs;
figures ``ratio_vs_torch`` (wall clock) and ``cpu_ratio_vs_torch`` (CPU time of the process,
steadier where other jobs share the cores) = ours / PyTorch's (target <= 1.5).

**2-rank spatial efficiency** (with 2 or more ranks): ``(2, 16, 64, 64, 64)`` float32 split
along D over 2 ranks against the same step on rank 0 alone; ``efficiency`` = t(1) / (2 t(2))
(target >= 0.85), and ``cpu_efficiency`` = CPU seconds of the 1-rank step / CPU seconds of
the 2-rank step summed over its ranks (insensitive to other jobs sharing the cores, which the
wall-clock figure is not).  Figures go to ``$DISTTENSOR_BENCH_CSV`` (bench ``normalization``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

for _v in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor.autograd import Tensor  # noqa: E402
from disttensor.nn import normalization as N  # noqa: E402

from _results import record  # noqa: E402
from _timing import compare, timed  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()

LAYERS = {  # name -> (ours(C, spatial), PyTorch's(C, spatial))
    "GroupNorm(8)": (lambda c, s: N.GroupNorm(8, c), lambda c, s: torch.nn.GroupNorm(8, c)),
    "InstanceNorm3d": (lambda c, s: N.InstanceNorm3d(c, affine=True),
                       lambda c, s: torch.nn.InstanceNorm3d(c, affine=True)),
    "LayerNorm(CDHW)": (lambda c, s: N.LayerNorm((c,) + s),
                        lambda c, s: torch.nn.LayerNorm((c,) + s)),
}


def our_step(layer, x, dy):
    def step():
        xt = Tensor(x, requires_grad=True)
        layer(xt).backward(dy)
        layer.zero_grad()
    return step


def torch_step(layer, x, dy):
    def step():
        xt = x.detach().requires_grad_()
        layer(xt).backward(dy)
        layer.zero_grad()
    return step


def both_times(fns: dict, reps: int) -> dict:
    """``{name: (median wall seconds, median CPU seconds)}`` of this process, the functions
    called interleaved (rotating who goes first) after one warm-up call each."""
    for f in fns.values():
        f()
    keys = list(fns)
    got = {k: ([], []) for k in keys}
    for i in range(reps):
        for k in keys[i % len(keys):] + keys[:i % len(keys)]:
            w0, c0 = time.perf_counter(), time.process_time()
            fns[k]()
            got[k][0].append(time.perf_counter() - w0)
            got[k][1].append(time.process_time() - c0)
    return {k: (float(np.median(w)), float(np.median(c))) for k, (w, c) in got.items()}


def versus_torch(shapes, reps):
    """Rank 0: ours vs PyTorch per layer and shape (the other ranks skip).  Wall-clock and
    CPU-time medians: on a machine shared with other jobs the CPU time (one thread each) is
    the steadier figure; both are recorded."""
    torch.set_num_threads(1)
    grid = dt.ProcessGrid((1,), comm=MPI.COMM_SELF)
    rows = []
    for shape in shapes:
        rng = np.random.default_rng(0)
        x = rng.standard_normal(shape).astype(np.float32)
        dy = rng.standard_normal(shape).astype(np.float32)
        split = (0,) + (None,) * (len(shape) - 1)
        xd, dyd = (dt.from_global(a, grid=grid, split=split) for a in (x, dy))
        for name, (ours, theirs) in LAYERS.items():
            c, s = shape[1], tuple(shape[2:])
            t = both_times({"ours": our_step(ours(c, s), xd, dyd),
                            "torch": torch_step(theirs(c, s), torch.from_numpy(x),
                                                torch.from_numpy(dy))}, reps)
            (w_o, c_o), (w_t, c_t) = t["ours"], t["torch"]
            rows.append((name, shape, w_o / w_t, c_o / c_t))
            print(f"{name:16s} {str(shape):22s} wall: ours {w_o * 1e3:7.1f} ms torch "
                  f"{w_t * 1e3:7.1f} ms ratio {w_o / w_t:5.2f} | cpu: ours {c_o * 1e3:7.1f} ms "
                  f"torch {c_t * 1e3:7.1f} ms ratio {c_o / c_t:5.2f}", flush=True)
            case = f"{name} {shape} float32 fwd+bwd"
            record("normalization", case, "ratio_vs_torch", w_o / w_t, "x", target=1.5,
                   better="lower")
            record("normalization", case, "cpu_ratio_vs_torch", c_o / c_t, "x", target=1.5,
                   better="lower")
    return rows


def efficiency(shape, reps):
    """Every rank: the 2-rank spatial split against rank 0 alone."""
    two = COMM.Split(0 if RANK < 2 else MPI.UNDEFINED, RANK)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    split = (None, None, 0, None, None)
    cases = {}
    cpu = {}
    if RANK < 2:
        g2 = dt.ProcessGrid((2,), comm=two)
        x2, dy2 = (dt.from_global(a, grid=g2, split=split) for a in (x, dy))
    if RANK == 0:
        g1 = dt.ProcessGrid((1,), comm=MPI.COMM_SELF)
        x1, dy1 = (dt.from_global(a, grid=g1, split=split) for a in (x, dy))
    out = []
    for name, (ours, _) in LAYERS.items():
        c, s = shape[1], tuple(shape[2:])
        step1 = our_step(ours(c, s), x1, dy1) if RANK == 0 else None
        step2 = our_step(ours(c, s), x2, dy2) if RANK < 2 else None

        def one(step1=step1):
            t0 = time.process_time()
            if step1 is not None:
                step1()
            cpu.setdefault(("1", name), []).append(
                COMM.allreduce(time.process_time() - t0, op=MPI.SUM))

        def pair(step2=step2):
            t0 = time.process_time()
            if step2 is not None:
                step2()
            cpu.setdefault(("2", name), []).append(
                COMM.allreduce(time.process_time() - t0, op=MPI.SUM))
        cases = compare({"1": one, "2": pair}, reps, warmup=1, timer=timed)
        eff = cases["1"] / (2 * cases["2"])
        cpu_eff = float(np.median(cpu[("1", name)]) / np.median(cpu[("2", name)]))
        out.append((name, cases["1"], cases["2"], eff, cpu_eff))
        if RANK == 0:
            print(f"{name:16s} {str(shape):22s} 1 rank {cases['1'] * 1e3:8.1f} ms  2 ranks "
                  f"{cases['2'] * 1e3:8.1f} ms  efficiency {eff:5.2f}  cpu_efficiency "
                  f"{cpu_eff:5.2f}", flush=True)
        record("normalization", f"{name} {shape} float32 D split", "efficiency", eff,
               "fraction", target=0.85, better="higher", ranks=2, rank=RANK)
        record("normalization", f"{name} {shape} float32 D split", "cpu_efficiency", cpu_eff,
               "fraction", ranks=2, rank=RANK)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="small shapes, 3 repetitions")
    args = p.parse_args()
    reps = 3 if args.quick else args.repeat
    shapes = [(2, 8, 32, 32, 32)] if args.quick else [(4, 16, 64, 64, 64), (2, 32, 32, 32, 32)]
    if RANK == 0:
        print(f"forward + backward, float32, 1 thread each, PyTorch {torch.__version__}, "
              f"median of {reps}")
        versus_torch(shapes, reps)
    COMM.Barrier()
    if SIZE >= 2:
        efficiency((2, 8, 32, 32, 32) if args.quick else (2, 16, 64, 64, 64), reps)


if __name__ == "__main__":
    main()
