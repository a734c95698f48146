"""Statistics, histograms, calculus and reduction options vs NumPy on one process (run:
mpiexec -n 1|2 python bench/stats_calculus_bench.py).

For each operation the DistArray call on all ranks and the NumPy call on the whole array on
rank 0 alone (the other ranks wait in a barrier) are timed interleaved in the same run
(medians of ``--reps`` after a warm-up, the slowest rank's wall time).  Printed and recorded:
``this/numpy`` (no target: the figure says what a call costs against NumPy; on 2 ranks it
should fall below the 1-rank figure).  Arrays split along axis 0 over all ranks:

* ``histogram``: 100 bins of ``--n`` float64 values (automatic range);
* ``bincount``: ``--n`` int64 labels in ``[0, 1000)``;
* ``cov``: ``(n/8, 8)`` float64 table, ``rowvar=False``;
* ``average_w``: weighted average of the table along axis 0;
* ``gradient``: a ``(sqrt n, sqrt n)`` float64 field, both axes, ``edge_order=2``;
* ``convolve``: ``--n`` float64 samples with a 31-tap kernel (``same``);
* ``sum_where``: ``sum(x, where=x > 0.5)`` of the field.

Each result is checked against NumPy's (printed ``ok``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import disttensor as dt  # noqa: E402
from _results import record  # noqa: E402
from _timing import versus_numpy  # noqa: E402

COMM = MPI.COMM_WORLD


def cases(full: dict, kernel):
    f, i, t, m = full["f"], full["i"], full["t"], full["m"]
    w = np.linspace(0.5, 1.5, t.shape[0])
    return {
        "histogram": (lambda x: dt.histogram(x["f"], 100), lambda: np.histogram(f, 100)),
        "bincount": (lambda x: dt.bincount(x["i"]), lambda: np.bincount(i)),
        "cov": (lambda x: dt.cov(x["t"], rowvar=False), lambda: np.cov(t, rowvar=False)),
        "average_w": (lambda x: dt.average(x["t"], axis=0, weights=w),
                      lambda: np.average(t, axis=0, weights=w)),
        "gradient": (lambda x: dt.gradient(x["m"], edge_order=2),
                     lambda: np.gradient(m, edge_order=2)),
        "convolve": (lambda x: dt.convolve(x["f"], kernel, "same"),
                     lambda: np.convolve(f, kernel, "same")),
        "sum_where": (lambda x: dt.sum(x["m"], where=x["m"] > 0.5),
                      lambda: np.sum(m, where=m > 0.5)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=float, default=4e6)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args()
    n = int(args.n)
    side = int(np.sqrt(n))
    grid = dt.ProcessGrid((COMM.size,))
    rng = np.random.default_rng(3)
    full = {"f": rng.random(n), "i": rng.integers(0, 1000, n),
            "t": rng.normal(size=(n // 8, 8)), "m": rng.random((side, side))}
    kernel = rng.normal(size=31)
    x = {k: dt.from_global(v, grid=grid, split=(0,) + (None,) * (v.ndim - 1))
         for k, v in full.items()}
    for name, (ours, theirs) in cases(full, kernel).items():
        t_dt, t_np, ok = versus_numpy(lambda fn=ours: fn(x), theirs, args.reps, args.warmup,
                                      rtol=1e-10, scale_floor=1.0)
        ratio = t_dt / t_np
        if COMM.rank == 0:
            print(f"{name:10s} n={n:.0e} ranks={COMM.size}: dt {t_dt * 1e3:8.1f} ms  "
                  f"numpy {t_np * 1e3:8.1f} ms  this/numpy {ratio:6.2f}  ok={ok}",
                  flush=True)
            record("stats_calculus", f"{name} n={n:.0e}", "this_over_numpy", ratio, "x",
                   better="lower", ranks=COMM.size)


if __name__ == "__main__":
    main()
