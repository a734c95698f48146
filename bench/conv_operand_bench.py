"""CPU cost of a split convolution's forward and filter-gradient calls on the layers of a
CosmoFlow step: what reading the halo'd buffer as the padded operand saves (run: mpiexec -n 2
python bench/conv_operand_bench.py).

Layers ``(batch, Cin, n, n, n)`` float32 convolved to ``Cout`` channels with a 3^3 kernel and
padding 1, for ``Cin:Cout:n`` in ``--layers`` (default CosmoFlow 32^3, widths 16,32,64,128),
depth split over all ranks (``--split-axis``).  Per layer and rep, each rank runs ``--calls``
calls of

* ``forward``: :func:`disttensor.ops.conv_forward` (halo copy and exchange, the local
  kernel; the saved state dropped at once), and
* ``filter``: :func:`disttensor.ops.conv_backward` with ``need_dx=False, reduce=False`` (the
  local filter-gradient kernel on the saved halo'd input),

and the figure is the CPU time (``time.process_time``) per call, summed over the layers,
median over ``--reps`` reps, the larger rank's.  The convolution planner runs in its
``heuristic`` mode (``DISTTENSOR_CONV_TUNE``, unless set): the same algorithm every run, so
two trees compare on the same kernels.  Preload ``build/libmpi_idle_sleep.so`` so that a
waiting rank sleeps: CPU time then measures the calls' work, whatever else runs on the
machine.  Run it with two trees' environments, alternating, to compare them.  Figures go to
``$DISTTENSOR_BENCH_CSV`` (bench ``conv_operand``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("DISTTENSOR_CONV_TUNE", "heuristic")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402
from _timing import cpu_per_call  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor.ops import conv_backward, conv_forward  # noqa: E402

COMM = MPI.COMM_WORLD


def layer(grid, batch, cin, cout, n, axis):
    """``(x, w, saved, dy)`` of one layer: the input split along ``axis``."""
    split = [None] * 5
    split[axis] = 0
    rng = np.random.default_rng(cin)
    x = dt.from_global(rng.standard_normal((batch, cin, n, n, n)).astype(np.float32),
                       grid=grid, split=tuple(split))
    w = (rng.standard_normal((cout, cin, 3, 3, 3)) / np.sqrt(27 * cin)).astype(np.float32)
    y, saved = conv_forward(x, w, padding=1)
    dy = dt.DistArray(rng.standard_normal(y.local.shape).astype(np.float32), y.distribution,
                      grid)
    return x, w, saved, dy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="4:16:32,16:32:16,32:64:8,64:128:4",
                    help="Cin:Cout:n,...")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--split-axis", type=int, default=2, choices=(2, 3, 4))
    args = ap.parse_args()
    grid = dt.ProcessGrid((COMM.size,), comm=COMM)
    cases = [layer(grid, args.batch, *(int(v) for v in s.split(":")), axis=args.split_axis)
             for s in args.layers.split(",")]

    def forward():
        for x, w, _, _ in cases:
            conv_forward(x, w, padding=1)

    def filter_():
        for _, _, saved, dy in cases:
            conv_backward(saved, dy, need_dx=False, reduce=False)
    fns = {"forward": forward, "filter": filter_}
    times = cpu_per_call(fns, COMM, args.reps, args.calls)
    if COMM.rank == 0:
        print(f"# conv_operand_bench: {COMM.size} ranks, layers {args.layers}, batch "
              f"{args.batch}, split axis {args.split_axis}, {args.calls} calls x {args.reps} "
              f"reps, DISTTENSOR_CONV_TUNE={os.environ['DISTTENSOR_CONV_TUNE']}; load "
              f"{os.getloadavg()[0]:.2f}")
        for name, ts in times.items():
            med = statistics.median(ts) * 1e3
            print(f"  {name:8s} CPU ms per call of every layer: median {med:.3f} "
                  f"(range {min(ts) * 1e3:.3f}-{max(ts) * 1e3:.3f})")
            axis = "" if args.split_axis == 2 else f" axis {args.split_axis}"
            record("conv_operand", f"{name} {args.layers}{axis}", "cpu_ms_per_step", med, "ms",
                   better="lower", ranks=COMM.size)


if __name__ == "__main__":
    main()
