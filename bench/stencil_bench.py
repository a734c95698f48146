"""A 7-point 3-D Jacobi sweep three ways, in one run: ``dt.map_overlap``, a hand-written halo
version on ``x.buffer`` (one reused ``HaloExchange``, the same kernel), and NumPy on one
process (slicing of a zero-padded array; ``np.roll`` for reference).

    mpiexec -n 1 .venv/bin/python bench/stencil_bench.py [--n 64 128] [--sweeps 5]
    mpiexec -n 2 .venv/bin/python bench/stencil_bench.py

Figures (medians of interleaved repetitions, seconds per sweep, the slowest rank's):
``map_overlap`` with ``trim=False`` and a kernel returning the interior (the natural Dask
spelling), with ``trim=True`` and a kernel keeping the shape (it writes into ``zeros_like``),
the same with ``stencil=True`` (split phase: interior while the halos travel, then the rims),
the hand-written version, and
the ratios ``map_overlap / hand`` (target <= 1.3) and ``/ NumPy`` (one process; timed on rank 0
while the others wait).  Boundary: zero (Dirichlet).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import disttensor as dt  # noqa: E402
from _results import record  # noqa: E402
from _timing import compare, wall  # noqa: E402

COMM = MPI.COMM_WORLD


def jacobi(b):
    """The 7-point average of the interior of ``b`` (a block with a halo of 1)."""
    return (b[:-2, 1:-1, 1:-1] + b[2:, 1:-1, 1:-1] + b[1:-1, :-2, 1:-1] + b[1:-1, 2:, 1:-1]
            + b[1:-1, 1:-1, :-2] + b[1:-1, 1:-1, 2:]) * (1.0 / 6.0)


def jacobi_same_shape(b):
    out = np.zeros_like(b)
    out[1:-1, 1:-1, 1:-1] = jacobi(b)
    return out


def jacobi_roll(u):
    return (np.roll(u, 1, 0) + np.roll(u, -1, 0) + np.roll(u, 1, 1) + np.roll(u, -1, 1)
            + np.roll(u, 1, 2) + np.roll(u, -1, 2)) * (1.0 / 6.0)


def run(n: int, sweeps: int, reps: int) -> dict:
    rng = np.random.default_rng(0)
    g = rng.standard_normal((n, n, n))
    x0 = dt.from_global(g)

    def with_map_overlap():
        u = x0
        for _ in range(sweeps):
            u = dt.map_overlap(jacobi, u, 1, boundary=0, trim=False)
        return u

    def with_trim():
        u = x0
        for _ in range(sweeps):
            u = dt.map_overlap(jacobi_same_shape, u, 1, boundary=0)
        return u

    def with_stencil():
        u = x0
        for _ in range(sweeps):
            u = dt.map_overlap(jacobi_same_shape, u, 1, boundary=0, stencil=True)
        return u

    bufs = [x0.with_halo(1), x0.with_halo(1)]
    exch = [b.halo_exchange("zero") for b in bufs]

    def by_hand():
        for s in range(sweeps):
            src, dst = bufs[s % 2], bufs[1 - s % 2]
            exch[s % 2].exchange()
            dst.local[...] = jacobi(src.buffer)
        return bufs[sweeps % 2]

    # the same result three ways (checked once, before timing)
    ref = g
    for _ in range(sweeps):
        ref = jacobi(np.pad(ref, 1))
    for name, f in (("map_overlap", with_map_overlap), ("trim", with_trim),
                    ("stencil", with_stencil), ("hand", by_hand)):
        got = f()
        err = np.abs(got.local - ref[got.local_slices]).max() if got.local.size else 0.0
        if COMM.allreduce(err, op=MPI.MAX) > 1e-12:
            raise SystemExit(f"{name}: result differs from NumPy by {err}")
    t = compare({"map_overlap": with_map_overlap, "trim": with_trim, "stencil": with_stencil,
                 "hand": by_hand}, reps, warmup=1)
    if COMM.rank == 0:
        def numpy_slices():
            u = g
            for _ in range(sweeps):
                u = jacobi(np.pad(u, 1))
            return u

        def numpy_roll():
            u = g
            for _ in range(sweeps):
                u = jacobi_roll(u)
            return u
        t.update(compare({"numpy": numpy_slices, "numpy_roll": numpy_roll}, reps, 1,
                         timer=wall))
    COMM.Barrier()
    return {k: v / sweeps for k, v in t.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--sweeps", type=int, default=5)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    p = COMM.size
    for n in args.n:
        t = run(n, args.sweeps, args.reps)
        if COMM.rank != 0:
            continue
        case = f"jacobi7 {n}^3"
        print(f"{case} on {p} rank(s), s/sweep: map_overlap {t['map_overlap']:.2e}  "
              f"trim=True {t['trim']:.2e}  stencil=True {t['stencil']:.2e}  hand halo {t['hand']:.2e}  "
              f"NumPy 1 proc {t['numpy']:.2e} (np.roll {t['numpy_roll']:.2e})")
        for k in ("map_overlap", "trim", "stencil"):
            r_hand, r_np = t[k] / t["hand"], t[k] / t["numpy"]
            print(f"  {k}: {r_hand:.2f}x the hand-written halo version, {r_np:.2f}x NumPy")
            record("stencil", f"{case} {k}", "ratio_vs_hand", r_hand, "x", target=1.3,
                   better="lower", ranks=p)
            record("stencil", f"{case} {k}", "ratio_vs_numpy", r_np, "x", better="lower",
                   ranks=p)
        for k in ("map_overlap", "trim", "stencil", "hand", "numpy"):
            record("stencil", case, f"{k}_s_per_sweep", t[k], "s", better="lower", ranks=p)


if __name__ == "__main__":
    main()
