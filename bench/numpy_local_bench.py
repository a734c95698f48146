"""Sorting-family routines vs NumPy on one process (run: mpiexec -n 1|2 python
bench/numpy_local_bench.py).

For each size ``--sizes`` (default 10^6 and 10^7 elements) and each operation, the DistArray
call on all ranks and the NumPy call on the whole array on rank 0 alone (the other ranks wait
in a barrier) are timed interleaved in the same run (medians of ``--reps`` after a warm-up,
the slowest rank's wall time).  Printed and recorded: ``this/numpy`` (the issue's target:
<= 1.3 on 1 rank; on 2 ranks at most the 1-rank figure).

Operations (1-D arrays split evenly over all ranks unless said):

* ``sort``, ``argsort``: float64 uniform values (NumPy: ``np.sort``, ``np.argsort``);
* ``unique``, ``unique_counts``, ``unique_inverse``: int32 values in ``[0, n/10)``
  (NumPy: ``np.unique`` with the same extras);
* ``roll``: a ``(n/1000, 1000)`` float64 array split along axis 0, rolled by 7 along the unsplit
  axis 1; ``roll_split``: the 1-D array rolled by ``n/3`` along its split axis;
* ``median``, ``quantile`` (q = 0.1, 0.5, 0.9): float64 values, ``axis=None``;
* ``median_rows``: the ``(n/1000, 1000)`` array's median along the unsplit axis 1;
* ``cumsum``: float64 values.

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
QS = [0.1, 0.5, 0.9]


def cases(n: int, full: dict):
    """name -> (distributed call, NumPy call on the whole array, NumPy's result of it)."""
    f, i, m = full["f"], full["i"], full["m"]
    return {
        "sort": (lambda x: dt.sort(x["f"]), lambda: np.sort(f)),
        "argsort": (lambda x: dt.argsort(x["f"]), lambda: np.argsort(f)),
        "unique": (lambda x: dt.unique(x["i"]), lambda: np.unique(i)),
        "unique_counts": (lambda x: dt.unique(x["i"], return_counts=True),
                          lambda: np.unique(i, return_counts=True)),
        "unique_inverse": (lambda x: dt.unique(x["i"], return_inverse=True),
                           lambda: np.unique(i, return_inverse=True)),
        "roll": (lambda x: dt.roll(x["m"], 7, axis=1), lambda: np.roll(m, 7, axis=1)),
        "roll_split": (lambda x: dt.roll(x["f"], n // 3), lambda: np.roll(f, n // 3)),
        "median": (lambda x: dt.median(x["f"]), lambda: np.median(f)),
        "quantile": (lambda x: dt.quantile(x["f"], QS), lambda: np.quantile(f, QS)),
        "median_rows": (lambda x: dt.median(x["m"], axis=1), lambda: np.median(m, axis=1)),
        "cumsum": (lambda x: dt.cumsum(x["f"]), lambda: np.cumsum(f)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6,1e7")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--only", default="", help="comma-separated operation names")
    args = ap.parse_args()
    grid = dt.ProcessGrid((COMM.size,))
    for n in (int(float(s)) for s in args.sizes.split(",")):
        rng = np.random.default_rng(7)
        full = {"f": rng.random(n), "i": rng.integers(0, max(n // 10, 1), n).astype(np.int32)}
        full["m"] = full["f"].reshape(n // 1000, 1000)
        x = {k: dt.from_global(v, grid=grid, split=(0,) + (None,) * (v.ndim - 1))
             for k, v in full.items()}
        only = set(args.only.split(",")) - {""}
        for name, (ours, theirs) in cases(n, full).items():
            if only and name not in only:
                continue

            t_dt, t_np, ok = versus_numpy(lambda fn=ours: fn(x), theirs, args.reps,
                                          args.warmup, rtol=1e-12)
            ratio = t_dt / t_np
            if COMM.rank == 0:
                print(f"{name:15s} n={n:.0e} ranks={COMM.size}: dt {t_dt * 1e3:8.1f} ms  "
                      f"numpy {t_np * 1e3:8.1f} ms  this/numpy {ratio:6.2f}  ok={ok}",
                      flush=True)
                record("numpy_local", f"{name} n={n:.0e}", "this_over_numpy", ratio, "x",
                       target=1.3, better="lower", ranks=COMM.size)


if __name__ == "__main__":
    main()
