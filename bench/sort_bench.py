"""Distributed sample sort vs numpy.sort on one rank (run: mpiexec -n 2 python bench/sort_bench.py).

A 1-D float64 array of ``--n`` uniform random values (default 10^7; 10^8 needs ~6 GB on two
ranks) is split evenly over all ranks.  Timed (medians of ``--reps`` after ``--warmup``, the
slowest rank's wall time after a barrier):

* ``dt.sort(x)``: local sort, regular samples all-gathered, one ``MPI_Alltoallv`` by the
  splitters, a merge of the received runs, and the redistribution back to ``x``'s even blocks;
* ``dt.argsort(x)``: the same with the global index key travelling (stable);
* ``numpy.sort`` of the whole array on rank 0 alone (the other ranks wait in a barrier), in
  the same run.

Prints the times and the ratio numpy / ours (the speed-up; > 1 means the distributed sort is
faster).  The result is checked: each block sorted and the blocks in order across ranks, and
the element sum preserved.  See bench/README.md for recorded figures.
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
from _timing import compare, on_rank0  # noqa: E402

COMM = MPI.COMM_WORLD


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=float, default=1e7, help="number of float64 elements")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-argsort", action="store_true")
    args = ap.parse_args()
    n = int(args.n)
    grid = dt.ProcessGrid((COMM.size,))
    rng = np.random.default_rng(1234 + COMM.rank)
    sizes = balanced_sizes(n, COMM.size)
    x = dt.from_local(rng.random(sizes[COMM.rank]), grid=grid, split=(0,))
    full = None
    if COMM.rank == 0:
        full = np.concatenate(COMM.gather(x.local, root=0))
    else:
        COMM.gather(x.local, root=0)

    fns = {"dt.sort": lambda: dt.sort(x), "numpy.sort (1 rank)": on_rank0(lambda: np.sort(full))}
    if not args.no_argsort:
        fns["dt.argsort"] = lambda: dt.argsort(x)
    t = compare(fns, args.reps, args.warmup)

    s = dt.sort(x)
    loc = s.local
    ok = bool(np.all(loc[1:] >= loc[:-1]))
    ends = COMM.allgather((loc[0], loc[-1]) if loc.size else None)
    ends = [e for e in ends if e is not None]
    ok &= all(a[1] <= b[0] for a, b in zip(ends[:-1], ends[1:]))
    total = COMM.allreduce(float(loc.sum()))
    ok &= abs(total - COMM.allreduce(float(x.local.sum()))) <= 1e-9 * n
    ok = COMM.allreduce(ok, op=MPI.LAND)
    if COMM.rank == 0:
        ref = t["numpy.sort (1 rank)"]
        print(f"sort of {n:.3g} float64 on {COMM.size} ranks (result correct: {ok})")
        for k, v in t.items():
            print(f"  {k:22s} {v * 1e3:9.1f} ms   numpy/this = {ref / v:5.2f}")
            if k != "numpy.sort (1 rank)":
                record("sort", f"n={n:.3g} {k}", "numpy_over_this", ref / v, "x",
                       ranks=COMM.size)


if __name__ == "__main__":
    main()
