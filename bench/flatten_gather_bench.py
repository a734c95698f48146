"""Flatten of a spatially split input: its gather as one ``MPI_Allgatherv`` against the
general redistribution it replaced, same run.

    mpiexec -n 2 python -m mpi4py bench/flatten_gather_bench.py [--reps 400]

A CosmoFlow flatten on a depth split (grid ``(1, P, 1, 1)``): the last pooling's output
``(4, 128, s, s, s)`` float32 (``s`` 2 and 4: the 32^3 and 64^3 models with widths
16,32,64,128), split over depth, flattened into ``(4, 128 s^3)`` with the features whole on
every rank.  Cases, interleaved rep by rep (``bench/_timing.compare``), each call one
collective wall time (the slowest rank's) and its CPU time summed over the ranks:

* ``allgatherv``: ``disttensor.ops.flatten_forward`` (its agreement, one ``MPI_Allgatherv``
  over the ranks holding the same samples, a copy of each block into place);
* ``redistribution``: the route it replaced: the same agreement, then
  ``DistArray.redistribute`` to the gathered layout (point-to-point pieces packed and
  unpacked through scratch, its plan cached too).

Figures (bench ``flatten_gather``): each case's median seconds and CPU seconds per call, and
``ratio`` (allgatherv over redistribution, wall and CPU).  Needs 2 or more ranks.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

for _v in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import compare, spin_before_sleep, wall_and_cpu  # noqa: E402

spin_before_sleep()

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor import ops  # noqa: E402
from disttensor.core.entry import agreed  # noqa: E402
from disttensor.ops.shape import _flatten_dists  # noqa: E402

from _results import record  # noqa: E402


def _redistribution(x):
    """The earlier route: agree, then redistribute to the gathered layout."""
    with agreed(x.grid.cart, "flatten_forward", x=x):
        pass
    gathered, fd, _ = _flatten_dists(x.distribution)
    loc = x.redistribute(distribution=gathered).local
    return dt.DistArray(loc.reshape(loc.shape[0], fd.shape[1]), fd, x.grid)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        if comm.rank == 0:
            print("flatten_gather_bench needs 2 or more ranks")
        return
    grid = dt.ProcessGrid((1, comm.size, 1, 1), comm=comm)
    for s in (2, 4):
        xg = np.random.default_rng(0).standard_normal((4, 128, s, s, s)).astype(np.float32)
        x = dt.from_global(xg, grid=grid, split=(0, None, 1, 2, 3))
        a, b = ops.flatten_forward(x)[0], _redistribution(x)
        ok = np.array_equal(a.local, b.local) and np.array_equal(
            a.local, xg.reshape(4, -1))
        ok = comm.allreduce(ok, op=MPI.LAND)
        fns = {"allgatherv": lambda: ops.flatten_forward(x),
               "redistribution": lambda: _redistribution(x)}
        cpu = {k: [] for k in fns}
        med = compare(fns, args.reps, args.warmup, timer=wall_and_cpu(fns, cpu))
        case = f"(4,128,{s},{s},{s}) float32 on (1,{comm.size},1,1)"
        cpus = {k: statistics.median(v) for k, v in cpu.items()}
        if comm.rank == 0:
            print(f"{case}: results equal {ok}")
            for k in fns:
                print(f"  {k:15s} wall {med[k] * 1e3:7.3f} ms  cpu (all ranks) "
                      f"{cpus[k] * 1e3:7.3f} ms")
            print(f"  ratio allgatherv / redistribution: wall "
                  f"{med['allgatherv'] / med['redistribution']:.2f}, cpu "
                  f"{cpus['allgatherv'] / cpus['redistribution']:.2f}")
        for k in fns:
            record("flatten_gather", f"{case} {k}", "seconds", med[k], "s", better="lower",
                   ranks=comm.size, rank=comm.rank)
            record("flatten_gather", f"{case} {k}", "cpu_seconds", cpus[k], "s",
                   better="lower", ranks=comm.size, rank=comm.rank)
        record("flatten_gather", case, "ratio", med["allgatherv"] / med["redistribution"],
               "x", better="lower", ranks=comm.size, rank=comm.rank)
        record("flatten_gather", case, "cpu_ratio",
               cpus["allgatherv"] / cpus["redistribution"], "x", better="lower",
               ranks=comm.size, rank=comm.rank)


if __name__ == "__main__":
    main()
