"""Training step benchmarks (run under mpiexec; ratios against baselines of the same run).

1. Gradient reduction: one CosmoFlow training step (forward, backward, gradient sums, Adam)
   with the bucketed, overlapped all-reduce of :class:`disttensor.nn.DistributedDataParallel`,
   with the same buckets all-reduced only at the end of backward, and with no reducer (each
   op's blocking all-reduce of its own parameter gradients as backward reaches it: the
   baseline), on the sample grid (all ranks on the sample axis) and on the spatial grid (all
   ranks along depth).
2. Throughput: samples/s of the step on all ranks vs on rank 0 alone (a one-rank grid over
   ``COMM_SELF`` while the other ranks sleep in a polling barrier), same global batch.
3. Memory: peak bytes NumPy allocates during forward + backward of one sample (tracemalloc)
   per rank on a spatial grid (depth x height) vs on one rank (the reason spatial parallelism
   exists).

    mpiexec -n 2 python -m mpi4py bench/train_bench.py [--size 32] [--widths 16,32,64,128]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc

import numpy as np
from mpi4py import MPI

# the steady step is measured: convolutions are tuned apart in the warm-up (on their proxy),
# not online over the first timed steps (DISTTENSOR_CONV_TUNE_ONLINE, docs/performance.md)
os.environ.setdefault("DISTTENSOR_CONV_TUNE_ONLINE", "off")
sys.path.insert(0, os.path.dirname(__file__))
from _results import record  # noqa: E402
from _timing import compare  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor import nn  # noqa: E402
from disttensor.autograd import Tensor  # noqa: E402
from disttensor.nn import functional as F  # noqa: E402


def model(args):
    return nn.models.cosmoflow(input_size=args.size, in_channels=4, widths=args.widths,
                               dense=(64, 32), outputs=4, rng=np.random.default_rng(0))


def batch(grid, args, n):
    g = dt.random.default_rng(1)
    x = g.normal(shape=(n, 4) + (args.size,) * 3, dtype="float32", grid=grid,
                 split=(0, None, 1, 2, 3))
    y = g.uniform(-1, 1, shape=(n, 4), dtype="float32", grid=grid, split=(0, None))
    return x, y


def stepper(grid, args, mode: str, n: int):
    """A function running one training step; ``mode``: 'overlap', 'end' or 'per-layer'."""
    m = model(args)
    net = m if mode == "per-layer" else nn.DistributedDataParallel(
        m, grid, bucket_bytes=int(args.bucket_mb * 2 ** 20), overlap=mode == "overlap")
    opt = nn.optim.Adam(m.parameters(), lr=1e-4)
    x, y = batch(grid, args, n)

    def step():
        loss = F.mse_loss(net(Tensor(x)), Tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def polling_barrier(comm):
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def peak_bytes(grid, args) -> int:
    m = model(args)
    x, y = batch(grid, args, 1)
    step = lambda: F.mse_loss(m(Tensor(x)), Tensor(y)).backward()  # noqa: E731
    step()  # warm caches, workspaces, compiled kernels
    m.zero_grad()
    tracemalloc.start()
    tracemalloc.reset_peak()
    step()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--widths", default="16,32,64,128")
    p.add_argument("--batch", type=int, default=0, help="global batch (default: 2 per rank)")
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    args.widths = tuple(int(w) for w in args.widths.split(","))
    comm = MPI.COMM_WORLD
    size = comm.size
    n = args.batch or 2 * size
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(f"# CosmoFlow {args.size}^3 x 4, widths {args.widths}, global batch {n}, {size} ranks")

    for name, dims in (("sample", (size, 1, 1, 1)), ("spatial", (1, size, 1, 1))):
        if name == "sample" and n % size:
            continue
        grid = dt.ProcessGrid(dims)
        steps = {mode: stepper(grid, args, mode, n) for mode in ("overlap", "end", "per-layer")}
        t = compare(steps, args.reps, warmup=1)
        say(f"grad-reduce {name:7s} grid {dims}: per-layer {t['per-layer'] * 1e3:8.1f} ms; "
            f"bucketed+overlap / per-layer {t['overlap'] / t['per-layer']:.3f}; "
            f"bucketed at end / per-layer {t['end'] / t['per-layer']:.3f}")
        record("train", f"{name} grid {dims}", "overlap_over_per_layer",
               t["overlap"] / t["per-layer"], "x", better="lower", ranks=size,
               rank=comm.rank)

    grid = dt.ProcessGrid((1, size, 1, 1))
    everyone = stepper(grid, args, "overlap", n)
    one = stepper(dt.ProcessGrid((1, 1, 1, 1), comm=MPI.COMM_SELF), args, "overlap", n) \
        if comm.rank == 0 else None

    def alone():
        if comm.rank == 0:
            one()
        polling_barrier(comm)
    t = compare({"all": everyone, "one": alone}, args.reps, warmup=1)
    say(f"throughput: {n / t['all']:.2f} samples/s on {size} ranks (spatial), "
        f"{n / t['one']:.2f} on 1 rank; speed-up {t['one'] / t['all']:.2f}x, parallel "
        f"efficiency {t['one'] / t['all'] / size:.2f}")
    record("train", f"cosmoflow {args.size}^3 spatial", "efficiency",
           t["one"] / t["all"] / size, "fraction", ranks=size, rank=comm.rank)

    mgrid = dt.ProcessGrid((1,) + tuple(MPI.Compute_dims(size, 2)) + (1,))
    mine = peak_bytes(mgrid, args)
    peak_all = comm.allreduce(mine, op=MPI.MAX)
    ref = peak_bytes(dt.ProcessGrid((1, 1, 1, 1), comm=MPI.COMM_SELF), args) \
        if comm.rank == 0 else 0
    say(f"memory: peak forward+backward bytes per rank on grid {mgrid.dims} "
        f"{peak_all / 2 ** 20:.1f} MiB vs 1 rank {ref / 2 ** 20:.1f} MiB: ratio "
        f"{peak_all / max(ref, 1):.3f}")
    record("train", f"cosmoflow {args.size}^3 grid {mgrid.dims}", "peak_memory_vs_1rank",
           peak_all / max(ref, 1), "x", better="lower", ranks=size, rank=comm.rank)


if __name__ == "__main__":
    main()
