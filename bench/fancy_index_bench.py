"""Fancy indexing of DistArrays vs NumPy on one process (run: mpiexec -n 2 python
bench/fancy_index_bench.py).

``--n`` float64 elements (default 10^6), split evenly over the ranks; ``--n`` random indices
(duplicates included).  Timed (medians of ``--reps`` interleaved repetitions after ``--warmup``,
the slowest rank's wall time after a barrier), each against the same NumPy call on the whole
array on rank 0 alone (the other ranks wait in a barrier), in the same run:

* ``x[idx]``: 1-D gather, ``idx`` a replicated NumPy array (each rank serves a balanced chunk
  of it: requests and answers through two ``MPI_Alltoallv``);
* ``x[di]``: the same with the index a DistArray (the result laid out like ``di``);
* ``X[rows]``: rows of an ``(n/8, 8)`` table;
* ``X[X[:, 0] > 0]``: a row mask (no row moves);
* ``x[idx] = v``: scatter (last write wins);
* ``np.add.at(x, idx, v)``: scatter-add with duplicates.

Prints the times and numpy/this (> 1: faster than NumPy on one process) and records them
(bench/_results.py).  Results are checked against NumPy.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import disttensor as dt  # noqa: E402
from disttensor.core.distribution import balanced_sizes  # noqa: E402
from _results import record  # noqa: E402
from _timing import compare  # noqa: E402

COMM = MPI.COMM_WORLD


def on_root(fn):
    def run():
        if COMM.rank == 0:
            fn()
        COMM.Barrier()
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=float, default=1e6)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args()
    n = int(args.n)
    rng = np.random.default_rng(7)  # the same on every rank: replicated arrays
    a = rng.random(n)
    idx = rng.integers(-n, n, size=n)
    v = rng.random(n)
    table = rng.standard_normal((n // 8, 8))
    rows = rng.integers(0, n // 8, size=n // 8)
    grid = dt.ProcessGrid((COMM.size,))
    x = dt.from_global(a, grid=grid)
    xt = dt.from_global(table, grid=grid)
    sizes = balanced_sizes(n, COMM.size)
    lo = sum(sizes[:COMM.rank])
    di = dt.DistArray(idx[lo:lo + sizes[COMM.rank]].copy(),
                      dt.Distribution((n,), grid.dims, (0,)), grid)
    ok = bool(np.array_equal(x[idx].to_numpy(), a[idx]))
    ok &= bool(np.array_equal(xt[xt[:, 0] > 0].to_numpy(), table[table[:, 0] > 0]))
    y, b = x.copy(), a.copy()
    np.add.at(y, idx, v)
    np.add.at(b, idx, v)
    ok &= bool(np.allclose(y.to_numpy(), b))
    ok = COMM.allreduce(ok, op=MPI.LAND)

    def setitem():
        x[idx] = v

    def np_setitem():
        w = a.copy()
        w[idx] = v

    def add_at():
        np.add.at(x, idx, v)

    def np_add_at():
        np.add.at(a.copy(), idx, v)

    def np_copy():
        a.copy()

    cases = {
        "x[idx]": (lambda: x[idx], on_root(lambda: a[idx])),
        "x[DistArray idx]": (lambda: x[di], on_root(lambda: a[idx])),
        "X[rows]": (lambda: xt[rows], on_root(lambda: table[rows])),
        "X[X[:, 0] > 0]": (lambda: xt[xt[:, 0] > 0], on_root(lambda: table[table[:, 0] > 0])),
        "x[idx] = v": (setitem, on_root(np_setitem)),
        "np.add.at(x, idx, v)": (add_at, on_root(np_add_at)),
    }
    fns = {}
    for k, (ours, ref) in cases.items():
        fns[k] = ours
        fns["numpy " + k] = ref
    fns["numpy copy"] = on_root(np_copy)  # the copy the NumPy scatters make, subtracted
    t = compare(fns, args.reps, args.warmup)
    if COMM.rank == 0:
        print(f"fancy indexing, n={n:.3g} float64 on {COMM.size} rank(s) "
              f"(results correct: {ok})")
        for k in cases:
            ref = t["numpy " + k]
            if k in ("x[idx] = v", "np.add.at(x, idx, v)"):
                ref = max(ref - t["numpy copy"], 1e-9)
            print(f"  {k:24s} {t[k] * 1e3:8.2f} ms   numpy {ref * 1e3:8.2f} ms   "
                  f"numpy/this = {ref / t[k]:5.2f}")
            record("fancy_index", f"n={n:.3g} {k}", "numpy_over_this", ref / t[k], "x",
                   target=1 / 1.3 if COMM.size == 1 else None, ranks=COMM.size)


if __name__ == "__main__":
    main()
