"""Cost of collective argument agreement on a training-like loop (run under mpiexec).

A stack of conv3d -> batch norm -> ReLU -> max-pool blocks (nn layers, autograd), forward and
backward on a batch spatially split over the ranks (grid 1 x P x 1 x 1), timed with every entry
point agreeing its arguments (the default) and inside :func:`disttensor.core.agreement.disabled`
(no agreement), interleaved rep by rep.  Also reported: how many agreement all-reduces one
step makes (counted) and the time of one such all-reduce alone (5 int64, ``MPI_MAX``), so the
ratio can be checked against count x latency.

    mpiexec -n 2 python -m mpi4py bench/agreement_bench.py [--size 32] [--reps 20]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))
from _results import record  # noqa: E402
from _timing import compare  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor import nn  # noqa: E402
from disttensor.core import agreement  # noqa: E402
from disttensor.autograd import Tensor  # noqa: E402
from disttensor.nn import functional as F  # noqa: E402


def network(widths, rng):
    layers, cin = [], 4
    for w in widths:
        layers += [nn.Conv3d(cin, w, 3, padding=1, bias=False, rng=rng), nn.BatchNorm3d(w),
                   nn.ReLU(), nn.MaxPool3d(2)]
        cin = w
    return nn.Sequential(*layers)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=32, help="spatial extent (cube)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--widths", default="8,16,32")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    grid = dt.ProcessGrid((1, comm.size, 1, 1))
    net = network([int(w) for w in args.widths.split(",")], np.random.default_rng(0))
    x = dt.random.default_rng(1).normal(shape=(args.batch, 4) + (args.size,) * 3,
                                        dtype="float32", grid=grid, split=(0, None, 1, 2, 3))

    def step():
        y = net(Tensor(x))
        loss = (y * y).mean()
        loss.backward()
        for p in net.parameters():
            p.grad = None

    def step_off():
        with agreement.disabled():
            step()

    # how many agreement all-reduces one step makes
    calls = []
    orig = agreement.status_allreduce

    def counting(comm_, failed, dig):
        calls.append(dig is not None)
        return orig(comm_, failed, dig)
    agreement.status_allreduce = counting
    step()
    agreement.status_allreduce = orig
    with_digest = sum(calls)

    dig = agreement.digest("bench", {"x": x})
    one = compare({"allreduce": lambda: agreement.status_allreduce(grid.cart, False, dig)},
                  reps=200, warmup=20)["allreduce"]
    t = compare({"on": step, "off": step_off}, reps=args.reps, warmup=args.warmup)
    if comm.rank == 0:
        print(f"agreement ranks={comm.size} size={args.size}^3 batch={args.batch} "
              f"widths={args.widths}: step_on={t['on'] * 1e3:.2f} ms "
              f"step_off={t['off'] * 1e3:.2f} ms ratio={t['on'] / t['off']:.4f}  "
              f"[status all-reduces per step: {len(calls)} ({with_digest} carrying a digest); "
              f"one alone {one * 1e6:.1f} us; count x latency / step = "
              f"{with_digest * one / t['off'] * 100:.2f}%]", flush=True)
        record("agreement", f"cosmoflow-like {args.size}^3 widths {args.widths}",
               "step_on_over_off", t["on"] / t["off"], "x", better="lower",
               ranks=comm.size)


if __name__ == "__main__":
    main()
