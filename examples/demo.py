"""disttensor demo: 3-D heat diffusion on a distributed grid, checked against NumPy.

Run:  mpiexec -n 2 python -m mpi4py examples/demo.py [--n 64] [--steps 40]

What it shows
* a DistArray on a Cartesian process grid (``dt.ProcessGrid``), random initial data that is
  the same whatever the grid (``dt.random``),
* a 7-point stencil that reads its neighbours through the halo cells stored in the local
  buffer, with a split-phase halo exchange: the interior is updated while messages fly,
* global reductions (the total heat is conserved with periodic boundaries),
* redistribution to another split and NumPy-style slicing, checked against serial NumPy,
* a CosmoFlow-style CNN block (conv3d 4->32 k=3 'same' -> leaky ReLU -> max-pool 2 -> batch
  norm -> MSE) forward and backward on a spatially split sample, equal to the same block
  computed on one rank.
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


def cnn_block(x, w, b, gamma, beta, target):
    """Forward and backward of conv -> leaky_relu -> max_pool -> batch_norm -> mse, with the
    explicit op functions of disttensor.ops.  Returns (loss, dx, dw, db, dgamma)."""
    from disttensor import ops
    y1, s1 = ops.conv_forward(x, w, b, padding="same")
    y2 = ops.leaky_relu(y1, 0.01)
    y3, s3 = ops.pool_forward(y2, "max", 2)
    y4, s4 = ops.batch_norm_forward(y3, gamma, beta)
    t = target.redistribute(distribution=y4.distribution)
    loss, s5 = ops.mse_forward(y4, t)
    g4 = ops.mse_backward(s5)
    g3, dgamma, _ = ops.batch_norm_backward(s4, g4)
    g2 = ops.pool_backward(s3, g3)
    g1 = ops.activation_backward("leaky_relu", g2, y1, y2, 0.01)
    dx, dw, db = ops.conv_backward(s1, g1)
    return loss, dx, dw, db, dgamma


def cnn_check(grid, say, n=32) -> bool:
    comm = grid.cart
    rng = dt.random.default_rng(7)
    split = (None, None) + tuple(range(grid.ndim)) + (None,) * (3 - grid.ndim)
    x = rng.normal(shape=(2, 4, n, n, n), dtype="float32", grid=grid, split=split)
    target = rng.normal(shape=(2, 32, n // 2, n // 2, n // 2), dtype="float32", grid=grid,
                        split=split)
    prng = np.random.default_rng(7)
    w = (prng.standard_normal((32, 4, 3, 3, 3)) / np.sqrt(108)).astype(np.float32)
    b = prng.standard_normal(32).astype(np.float32) * 0.1
    gamma, beta = np.ones(32, np.float32), np.zeros(32, np.float32)
    cnn_block(x, w, b, gamma, beta, target)  # warm-up: Numba kernels load or compile once
    comm.Barrier()
    t0 = time.perf_counter()
    loss, dx, dw, db, dg = cnn_block(x, w, b, gamma, beta, target)
    comm.Barrier()
    t_dist = time.perf_counter() - t0
    # the same block on one rank (each rank computes it alone on the whole sample)
    one = dt.ProcessGrid((1,), comm=MPI.COMM_SELF)
    xs = dt.from_global(x.to_numpy(), grid=one, split=(None,))
    ts = dt.from_global(target.to_numpy(), grid=one, split=(None,))
    t0 = time.perf_counter()
    loss1, dx1, dw1, db1, dg1 = cnn_block(xs, w, b, gamma, beta, ts)
    t_one = time.perf_counter() - t0
    dxg = dx.to_numpy()

    def rel(a, r):
        return float(np.max(np.abs(a - r)) / max(np.max(np.abs(r)), 1e-30))
    errs = {"loss": abs(loss - loss1) / abs(loss1), "dx": rel(dxg, dx1.local), "dw": rel(dw, dw1),
            "db": rel(db, db1), "dgamma": rel(dg, dg1)}
    say(f"CNN block on a {n}^3 x 4 sample pair split over grid {grid.dims} "
        f"(conv3d 4->32, leaky ReLU, max-pool, batch norm, MSE): loss {loss:.6f}, "
        f"forward+backward {t_dist * 1e3:.0f} ms ({comm.size} ranks) vs {t_one * 1e3:.0f} ms "
        f"(1 rank)")
    say("  relative difference to the one-rank result: " +
        ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    return all(v < 1e-4 for v in errs.values())


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
    ok_cnn = cnn_check(dt.ProcessGrid((0, 0)), say)
    good = err < 1e-10 and abs(heat - heat0) < 1e-8 * abs(heat0) and ok_sub and ok_red and ok_cnn
    say("demo " + ("PASSED" if good else "FAILED"))
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
