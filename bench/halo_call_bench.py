"""CPU cost of a window op's halo machinery per call: the forward halo (copy into a halo'd
buffer + exchange) and the reverse exchange of the window's gradient, on the layouts of a
CosmoFlow step's convolutions (run: mpiexec -n 2 python bench/halo_call_bench.py).

Layouts: ``(batch, C, n, n, n)`` float32 for ``(C, n)`` in ``--layers`` (default CosmoFlow
32^3, widths 16,32,64,128: (4, 32), (16, 16), (32, 8), (64, 4)), depth split over all
ranks (``--split-axis 4``: the width axis instead), 3^3 kernel with padding 1 (halo 1 on both depth sides).  Per layout and rep, each
rank runs ``--calls`` calls of

* ``forward``: :func:`disttensor.ops._spatial.halo_input` (what a convolution's forward does
  before its kernel; the result dropped at once, as a step's backward drops it), and
* ``reverse``: :func:`disttensor.ops._spatial.halo_gradient` of a read-window gradient (the
  convolution's backward after its data kernel),

and the figure is the CPU time (``time.process_time``) per call, summed over the layouts,
median over ``--reps`` reps, the largest over the ranks.  Preload the repository's
``build/libmpi_idle_sleep.so`` so that a rank waiting for its peer sleeps: the CPU time is
then the work of the calls (Python, copies, posting the messages), insensitive to other jobs
taking the cores, which wall time on a shared machine is not.  The script imports whichever
disttensor the interpreter has: run it with two trees' environments to compare them (same
session, alternating).  Figures go to ``$DISTTENSOR_BENCH_CSV`` (bench ``halo_call``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402
from _timing import cpu_per_call  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor.ops._spatial import (halo_gradient, halo_input, spatial_windows,  # noqa: E402
                                     window_plan)

COMM = MPI.COMM_WORLD


def layout(grid, batch, c, n, axis=2):
    split = [None] * 5
    split[axis] = 0
    x = dt.from_global(np.random.default_rng(c).standard_normal(
        (batch, c, n, n, n)).astype(np.float32), grid=grid, split=tuple(split))
    windows = spatial_windows(3, (3, 3, 3), (1, 1, 1), (1, 1, 1), ((1, 1),) * 3)
    plan = window_plan(x.distribution, windows, grid.coords)
    win = x.with_halo(plan.halo).buffer[plan.read]
    grad = np.random.default_rng(1).standard_normal(win.shape).astype(np.float32)
    return x, plan, grad


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="4:32,16:16,32:8,64:4", help="C:n,...")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--split-axis", type=int, default=2, choices=(2, 3, 4),
                    help="the spatial axis split over the ranks (2: depth, 4: width)")
    args = ap.parse_args()
    grid = dt.ProcessGrid((COMM.size,), comm=COMM)
    cases = [layout(grid, args.batch, *(int(v) for v in s.split(":")), axis=args.split_axis)
             for s in args.layers.split(",")]

    def forward():
        for x, plan, _ in cases:
            halo_input(x, plan)

    def reverse():
        for x, plan, g in cases:
            halo_gradient(g, x.distribution, grid, plan)
    fns = {"forward": forward, "reverse": reverse}
    times = cpu_per_call(fns, COMM, args.reps, args.calls)
    if COMM.rank == 0:
        print(f"# halo_call_bench: {COMM.size} ranks, layers {args.layers}, batch {args.batch}, "
              f"split axis {args.split_axis}, "
              f"{args.calls} calls x {args.reps} reps; load {os.getloadavg()[0]:.2f}")
        for name, ts in times.items():
            med = statistics.median(ts) * 1e6
            print(f"  {name:8s} CPU us per call of every layer: median {med:.1f} "
                  f"(range {min(ts) * 1e6:.1f}-{max(ts) * 1e6:.1f})")
            axis = "" if args.split_axis == 2 else f" axis {args.split_axis}"
            record("halo_call", f"{name} {args.layers}{axis}", "cpu_us_per_step", med, "us",
                   better="lower", ranks=COMM.size)


if __name__ == "__main__":
    main()
