"""lstsq (TSQR of [a | b]), einsum with three operands and the stacking/splitting routines
against NumPy on one process, in the same run (run under mpiexec; ratios DistArray / NumPy,
medians of interleaved repetitions, the slowest rank's time).

* ``lstsq``: a tall ``m x n`` float64 matrix split along rows, ``k`` right-hand sides;
  NumPy's ``lstsq`` on the whole matrix on one process is the baseline.
* ``einsum``: ``'ij,jk,kl->il'`` with a tall-skinny chain (the greedy order contracts the
  small pair first), against ``np.einsum(..., optimize=True)``.
* ``vstack`` + ``array_split`` of a row-split matrix, against NumPy's.

    mpiexec -n 2 python -m mpi4py bench/linalg_more_bench.py [--rows 200000] [--reps 7]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))
from _results import record  # noqa: E402
from _timing import compare, wall  # noqa: E402

import disttensor as dt  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--cols", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    m, n = args.rows, args.cols
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((m, n)), rng.standard_normal((m, 2))
    C, D = rng.standard_normal((n, 64)), rng.standard_normal((64, 4))
    a, b = dt.from_global(A), dt.from_global(B)
    c, d = dt.from_global(C), dt.from_global(D)
    cases = {
        "lstsq": (lambda: dt.linalg.lstsq(a, b), lambda: np.linalg.lstsq(A, B)),
        "einsum ij,jk,kl": (lambda: dt.einsum("ij,jk,kl->il", a, c, d),
                            lambda: np.einsum("ij,jk,kl->il", A, C, D, optimize=True)),
        "vstack+array_split": (lambda: dt.array_split(dt.vstack([a, a]), 3),
                               lambda: np.array_split(np.vstack([A, A]), 3)),
    }
    for name, (ours, ref) in cases.items():
        t = compare({"dt": ours}, args.reps, 1)["dt"]
        t_np = compare({"np": ref}, args.reps, 1, timer=wall)["np"] if comm.rank == 0 else 0.0
        t_np = comm.bcast(t_np)
        if comm.rank == 0:
            print(f"{name:22s} {comm.size} ranks: {t * 1e3:8.2f} ms  NumPy {t_np * 1e3:8.2f} ms"
                  f"  ratio {t / t_np:5.2f}")
        record("linalg_more", f"{name} {m}x{n}", "ratio_to_numpy", t / t_np, "x",
               better="lower", ranks=comm.size, rank=comm.rank)


if __name__ == "__main__":
    main()
