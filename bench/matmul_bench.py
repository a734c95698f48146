"""Distributed matmul vs NumPy on one rank vs gather + matmul + scatter, same run.

    mpiexec -n 2 .venv/bin/python bench/matmul_bench.py            # n = 4096, float64
    mpiexec -n 2 .venv/bin/python bench/matmul_bench.py --n 2048   # quicker

``C = A @ B`` with ``A``, ``B`` ``n x n`` float64 under two layouts:

* ``rows``: both split along rows on a 1-D grid (the plan rule picks ``target``: ``B`` is
  all-gathered, each rank multiplies its row block; output split like ``A``);
* ``summa``: both split ``(0, 1)`` on a ``(P, 1)`` grid (SUMMA with panels broadcast along the
  grid rows and columns).

Baselines, timed interleaved with ours (``bench/_timing.py``: slowest rank, median of reps):

* ``numpy1``: ``numpy.matmul`` of the global matrices on rank 0 alone (the others wait);
* ``gather``: gather ``A`` and ``B`` to rank 0, ``numpy.matmul`` there, scatter ``C`` back to
  the output layout (one redistribution each way).

Printed ratios: ``numpy1/ours`` (speed-up over one rank) and ``gather/ours`` (over the naive
distributed baseline).  BLAS threads: set ``OPENBLAS_NUM_THREADS=1`` for one core per rank.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402
from _timing import compare  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor.core.distribution import Distribution  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    P, rank, n = comm.size, comm.rank, args.n
    rng = np.random.default_rng(0)
    A = rng.standard_normal((n, n))  # same on every rank (seeded): references and scatter
    B = rng.standard_normal((n, n))
    layouts = {"rows": (dt.ProcessGrid((P,)), (0, None)),
               "summa": (dt.ProcessGrid((P, 1)), (0, 1))}
    serial = {}
    for name, (g, split) in layouts.items():
        a = dt.from_global(A, grid=g, split=split)
        b = dt.from_global(B, grid=g, split=split)
        out = {}
        root_d = Distribution((n, n), g.dims, (0, None), [[n] + [0] * (P - 1), None])

        def ours():
            out["c"] = a @ b

        def numpy1():
            if rank == 0:
                serial["c"] = A @ B

        def gather():
            ga, gb = a.gather(0), b.gather(0)
            c = ga @ gb if rank == 0 else np.empty(root_d.block_shape(g.coords))
            croot = dt.DistArray(c, root_d, g)
            out["g"] = croot.redistribute(distribution=out["c"].distribution)

        ours()
        t = compare({"ours": ours, "numpy1": numpy1, "gather": gather},
                    reps=args.reps, warmup=args.warmup)
        ref = A @ B
        err = np.abs(out["c"].to_numpy() - ref).max() / (np.linalg.norm(A) * np.linalg.norm(B))
        gerr = np.abs(out["g"].to_numpy() - ref).max()
        if rank == 0:
            print(f"matmul {name} n={n} P={P} float64: ours={t['ours']*1e3:.0f} ms "
                  f"numpy1={t['numpy1']*1e3:.0f} ms gather={t['gather']*1e3:.0f} ms  "
                  f"numpy1/ours={t['numpy1']/t['ours']:.2f}  gather/ours="
                  f"{t['gather']/t['ours']:.2f}  [max err / |A||B| = {err:.1e}, "
                  f"gather err {gerr:.1e}]", flush=True)
            record("matmul", f"{name} n={n}", "numpy1_over_ours", t["numpy1"] / t["ours"], "x",
                   ranks=P)
            record("matmul", f"{name} n={n}", "gather_over_ours", t["gather"] / t["ours"], "x",
                   target=1.0, ranks=P)


if __name__ == "__main__":
    main()
