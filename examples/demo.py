"""disttensor demo: 3-D heat diffusion on a distributed grid, checked against NumPy.

Run:  mpiexec -n 2 python -m mpi4py examples/demo.py [--n 64] [--steps 40]

What it shows
* a DistArray on a Cartesian process grid (``dt.ProcessGrid``), random initial data that is
  the same whatever the grid (``dt.random``),
* a 7-point stencil that reads its neighbours through the halo cells stored in the local
  buffer, with a split-phase halo exchange: the interior is updated while messages fly,
* global reductions (the total heat is conserved with periodic boundaries),
* redistribution to another split and NumPy-style slicing, checked against serial NumPy.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import disttensor as dt


def laplacian(buf, out, region):
    """7-point Laplacian of the cells of ``buf`` (halo 1) in ``region`` (interior coordinates)."""
    c = tuple(slice(s.start + 1, s.stop + 1) for s in region)
    acc = -6.0 * buf[c]
    for ax in range(3):
        for d in (-1, 1):
            sh = list(c)
            sh[ax] = slice(c[ax].start + d, c[ax].stop + d)
            acc += buf[tuple(sh)]
    out[region] = acc


def step(u, halo, lap, alpha):
    """One explicit Euler step; the halo exchange ``halo`` (of ``u``, reused every step)
    overlaps the interior update."""
    h = halo.begin()
    n = u.local_shape
    inner = tuple(slice(1, max(1, k - 1)) for k in n)
    laplacian(u.buffer, lap, inner)                      # needs no halo
    h.end()
    # the shell of cells next to the halo
    for ax in range(3):
        for sl in (slice(0, min(1, n[ax])), slice(max(n[ax] - 1, 1), n[ax])):
            reg = [slice(0, k) for k in n]
            for prev in range(ax):                       # skip shells already done
                reg[prev] = slice(1, max(1, n[prev] - 1))
            reg[ax] = sl
            laplacian(u.buffer, lap, tuple(reg))
    u.local[...] += alpha * lap


def serial_reference(u0, steps, alpha):
    u = u0.copy()
    for _ in range(steps):
        lap = -6.0 * u
        for ax in range(3):
            lap += np.roll(u, 1, ax) + np.roll(u, -1, ax)
        u += alpha * lap
    return u


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank = comm.rank

    def say(*a):
        if rank == 0:
            print(*a, flush=True)

    grid = dt.ProcessGrid((0, 0, 0))
    n, alpha = args.n, 0.1
    say(f"disttensor {dt.__version__}: {comm.size} rank(s), grid {grid.dims}, "
        f"array {n}^3 float64")
    rng = dt.random.default_rng(2026)
    u0 = rng.random((n, n, n), grid=grid, split=(0, 1, 2))
    u = u0.with_halo(1)
    lap = np.empty(u.local_shape)
    heat0 = float(u0.sum())
    halo = u.halo_exchange("periodic")  # plan, views and scratch built once

    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step(u, halo, lap, alpha)
    comm.Barrier()
    elapsed = time.perf_counter() - t0
    heat = float(u.sum())
    say(f"{args.steps} diffusion steps in {elapsed:.3f} s "
        f"({args.steps * n**3 / elapsed / 1e6:.1f} Mcell/s)")
    say(f"total heat: before {heat0:.10f}, after {heat:.10f} (periodic: conserved)")
    say(f"after: mean {float(u.mean()):.6f} std {float(u.std()):.6f} "
        f"min {float(u.min()):.6f} max {float(u.max()):.6f}")

    # check against serial NumPy on the same initial data
    ref = serial_reference(u0.to_numpy(), args.steps, alpha)
    err = float(np.max(np.abs(u.to_numpy() - ref)))
    say(f"max |distributed - serial NumPy| = {err:.3e}")

    # redistribute to slabs along the last axis, slice, reduce: still the same numbers
    v = u.redistribute(split=(None, None, 0) if grid.ndim >= 1 else None)
    sub = v[::2, n // 4: 3 * n // 4, -1]
    ok_sub = np.allclose(sub.to_numpy(), ref[::2, n // 4: 3 * n // 4, -1])
    ok_red = np.allclose(v.max(axis=(0, 1)).to_numpy(), ref.max(axis=(0, 1)))
    say(f"redistributed to split {v.split}: slicing matches NumPy: {ok_sub}, "
        f"reduction matches NumPy: {ok_red}")
    good = err < 1e-10 and abs(heat - heat0) < 1e-8 * abs(heat0) and ok_sub and ok_red
    say("demo " + ("PASSED" if good else "FAILED"))
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
