"""Per-call fixed cost of an aligned elementwise call on small arrays (run under mpiexec).

``x + y`` on two DistArrays of the same layout with ``--n`` elements in all (1000 by
default, so each rank's block is a few hundred elements and the time is the call's fixed
cost), against NumPy's ``a + b`` on blocks of the same size in the same run.  Reported: the
median per-call time of each (a loop of ``--inner`` calls per sample, medians of ``--reps``
samples, interleaved) and the overhead, ours minus NumPy's, in microseconds, by the wall
clock (the figure the targets are about) and by the process's CPU clock (``process_time``:
on a machine shared with other jobs it leaves out the time this process waited for a core,
which the wall clock of a microsecond call mostly measures there).  The issue's
targets: at most 5 us over NumPy on 1 rank and 15 us on 2.  Also: ``x * 2.0`` (a scalar
operand), ``np.sqrt(x)`` (a unary call) and ``x + y`` with agreement disabled (what the
agreement itself costs).

    mpiexec -n 2 python -m mpi4py bench/elementwise_overhead_bench.py [--n 1000] [--reps 15]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))
from _results import record  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor.core import agreement  # noqa: E402


def per_call(fn, inner: int) -> tuple[float, float]:
    """Wall and CPU seconds per call of ``fn`` over ``inner`` calls (this process)."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner, (time.process_time() - c0) / inner


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="global elements")
    ap.add_argument("--inner", type=int, default=2000, help="calls per sample")
    ap.add_argument("--reps", type=int, default=15, help="samples (median)")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    x = dt.arange(args.n, dtype=np.float64)
    y = dt.arange(args.n, dtype=np.float64) * 0.5
    a, b = x.local.copy(), y.local.copy()

    def off():
        with agreement.disabled():
            return x + y
    cases = {
        "numpy a + b": lambda: a + b,
        "x + y": lambda: x + y,
        "x * 2.0": lambda: x * 2.0,
        "np.sqrt(x)": lambda: np.sqrt(x),
        "x + y (agreement off)": off,
    }
    for f in cases.values():  # warm-up (caches, first-call imports)
        per_call(f, 50)
    walls = {k: [] for k in cases}
    cpus = {k: [] for k in cases}
    keys = list(cases)
    for i in range(args.reps):
        comm.Barrier()
        for k in keys[i % len(keys):] + keys[:i % len(keys)]:
            w, c = per_call(cases[k], args.inner)
            walls[k].append(comm.allreduce(w, op=MPI.MAX))  # the slowest rank's
            cpus[k].append(comm.allreduce(c, op=MPI.MAX))
    wall = {k: statistics.median(v) for k, v in walls.items()}
    cpu = {k: statistics.median(v) for k, v in cpus.items()}
    if comm.rank == 0:
        target = 5.0 if comm.size == 1 else 15.0
        print(f"per-call time, {args.n} float64 elements on {comm.size} rank(s) "
              f"(medians of {args.reps} x {args.inner} calls, slowest rank)")
        print(f"{'case':<26}{'wall us':>10}{'over NumPy':>12}{'cpu us':>10}{'over NumPy':>12}")
        for k in cases:
            print(f"{k:<26}{wall[k] * 1e6:>10.2f}{(wall[k] - wall['numpy a + b']) * 1e6:>12.2f}"
                  f"{cpu[k] * 1e6:>10.2f}{(cpu[k] - cpu['numpy a + b']) * 1e6:>12.2f}")
        over = (wall["x + y"] - wall["numpy a + b"]) * 1e6
        over_cpu = (cpu["x + y"] - cpu["numpy a + b"]) * 1e6
        print(f"x + y overhead: {over:.2f} us wall, {over_cpu:.2f} us cpu "
              f"(target <= {target:.0f} us)")
        record("elementwise_overhead", f"x + y n={args.n}", "overhead_us", over, "us",
               target=target, better="lower", ranks=comm.size)
        record("elementwise_overhead", f"x + y n={args.n}", "overhead_cpu_us", over_cpu, "us",
               target=target, better="lower", ranks=comm.size)
        record("elementwise_overhead", f"x * 2.0 n={args.n}", "overhead_us",
               (wall["x * 2.0"] - wall["numpy a + b"]) * 1e6, "us", ranks=comm.size)


if __name__ == "__main__":
    main()
