"""Gradient memory and step time of the weight update inside backward (run under mpiexec).

A CosmoFlow with MLPerf's layout scaled down (default: 32^3 input, 4 channels, conv widths
16,32,64,128, dense 128,64, float32) trains on a sample-split grid ``(P, 1, 1, 1)``:

* **ordinary**: ``zero_grad(); backward(); step()``;
* **in-backward**: :class:`disttensor.nn.BackwardUpdate` (each parameter updated, and its
  gradient dropped, as soon as it is final).

Gradient memory is the most bytes of gradients held at once: ``.grad`` arrays plus the
gradient reducer's allocated bucket buffers (:func:`disttensor.nn.backward_update.gradient_bytes`).
For the ordinary step that is after backward (every ``.grad`` and every bucket is alive then);
for the in-backward update it is counted at every update point (``track_memory=True``: just
before each bucket's buffer is freed, which is when the most buffers are alive).  Rows: no
reducer (the ops all-reduce each gradient; one rank only) and
:class:`~disttensor.nn.DistributedDataParallel` for each ``--bucket-kb``.  Step times are
medians of interleaved steps of the two variants in the same run (slowest rank), in wall
time and in CPU time (the latter is steadier on a machine shared with other jobs).  For scale,
each row also gives the whole process's peak during a step as :mod:`tracemalloc` sees it
(parameters, optimizer state, activations, gradients: everything NumPy allocated).

    mpiexec -n 2 python -m mpi4py bench/backward_update_bench.py [--size 32] [--reps 6]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))
from _results import record  # noqa: E402
from _timing import compare  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor.autograd import Tensor  # noqa: E402
from disttensor.nn import BackwardUpdate, DistributedDataParallel  # noqa: E402
from disttensor.nn import functional as F  # noqa: E402
from disttensor.nn.backward_update import gradient_bytes  # noqa: E402
from disttensor.nn.models import CosmoFlow  # noqa: E402
from disttensor.nn.optim import Adam  # noqa: E402


def cpu_time(fn) -> float:
    """CPU seconds of one collective call, the largest rank's (less sensitive than wall time
    to other processes sharing the cores)."""
    t0 = time.process_time()
    fn()
    return MPI.COMM_WORLD.allreduce(time.process_time() - t0, op=MPI.MAX)


def mib(n):
    return f"{n / 2 ** 20:.2f} MiB"


class Variant:
    """One model + optimizer (+ DDP) trained ordinarily or with the update inside backward."""

    def __init__(self, args, grid, bucket_bytes, in_backward, track=False):
        self.model = CosmoFlow(input_size=args.size, in_channels=4, widths=args.widths,
                               dense=args.dense, outputs=4, dtype=args.dtype,
                               rng=np.random.default_rng(0))
        self.net = (DistributedDataParallel(self.model, grid, bucket_bytes=bucket_bytes)
                    if bucket_bytes else self.model)
        self.reducer = self.net.reducer if bucket_bytes else None
        self.params = list(self.model.parameters())
        self.opt = Adam(self.params, lr=1e-4)
        self.upd = (BackwardUpdate(self.opt, self.net if bucket_bytes else None,
                                   comm=grid.cart, track_memory=track) if in_backward else None)
        rng = np.random.default_rng(1)
        x = rng.standard_normal((args.batch, 4) + (args.size,) * 3).astype(args.dtype)
        y = (rng.standard_normal((args.batch, 4)) * 0.5).astype(args.dtype)
        self.x = Tensor(dt.from_global(x, grid=grid, split=(0, None, 1, 2, 3)))
        self.y = Tensor(dt.from_global(y, grid=grid, split=(0, None)))
        self.peak = 0

    def step(self):
        loss = F.mse_loss(self.net(self.x), self.y)
        if self.upd is None:
            self.opt.zero_grad()
        loss.backward()
        if self.upd is None:
            self.peak = max(self.peak, gradient_bytes(self.params, self.reducer))
            self.opt.step()
        else:
            self.peak = max(self.peak, self.upd.peak_grad_bytes)

    def close(self):
        if self.reducer is not None:
            self.reducer.release()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=32, help="spatial extent (cube)")
    ap.add_argument("--widths", default="16,32,64,128")
    ap.add_argument("--dense", default="128,64")
    ap.add_argument("--batch", type=int, default=0, help="global batch (default 2 per rank)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--bucket-kb", default="25600,1024,256",
                    help="DDP bucket sizes to measure, KiB (25600 = the 25 MiB default)")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args(argv)
    args.widths = tuple(int(w) for w in args.widths.split(","))
    args.dense = tuple(int(w) for w in args.dense.split(","))
    comm = MPI.COMM_WORLD
    args.batch = args.batch or 2 * comm.size
    grid = dt.ProcessGrid((comm.size, 1, 1, 1))
    say = print if comm.rank == 0 else (lambda *a, **k: None)

    probe = Variant(args, grid, 0, False) if comm.size == 1 else None
    model = probe.model if probe else CosmoFlow(input_size=args.size, in_channels=4,
                                                widths=args.widths, dense=args.dense,
                                                outputs=4, dtype=args.dtype,
                                                rng=np.random.default_rng(0))
    sizes = sorted(((p.data.nbytes, n) for n, p in model.named_parameters()), reverse=True)
    total = sum(s for s, _ in sizes)
    say(f"backward_update ranks={comm.size} CosmoFlow {args.size}^3 widths={args.widths} "
        f"dense={args.dense} {args.dtype} batch={args.batch}: {len(sizes)} parameters, "
        f"{mib(total)} (largest {sizes[0][1]} {mib(sizes[0][0])} = "
        f"{sizes[0][0] / total:.0%} of the model)", flush=True)

    rows = ([0] if comm.size == 1 else []) + [int(float(k) * 1024)
                                              for k in args.bucket_kb.split(",")]
    warm = Variant(args, grid, rows[0], False)  # one-time caches (kernels, plans) first
    for _ in range(2):
        warm.step()
    warm.close()
    for bucket in rows:
        what = "no reducer" if not bucket else f"DDP bucket {bucket // 1024} KiB"
        # memory: a few steps of each, the in-backward one counting at its update points
        mem, traced = {}, {}
        for inb in (False, True):
            tracemalloc.start()
            v = Variant(args, grid, bucket, inb, track=True)
            v.step()
            tracemalloc.reset_peak()
            v.step()
            traced[inb] = comm.allreduce(tracemalloc.get_traced_memory()[1], op=MPI.MAX)
            tracemalloc.stop()
            mem[inb] = comm.allreduce(v.peak, op=MPI.MAX)
            nb = len(v.reducer.buckets) if v.reducer else 0
            v.close()
        # time: two more instances, interleaved steps, no memory tracking
        a, b = Variant(args, grid, bucket, False), Variant(args, grid, bucket, True)
        t = compare({"ordinary": a.step, "in_backward": b.step}, reps=args.reps,
                    warmup=args.warmup)
        c = compare({"ordinary": a.step, "in_backward": b.step}, reps=args.reps,
                    warmup=0, timer=cpu_time)
        a.close()
        b.close()
        say(f"  {what:>20} ({nb} buckets): gradient memory ordinary {mib(mem[False])}, "
            f"in-backward {mib(mem[True])}, ratio {mem[True] / mem[False]:.3f} "
            f"({(1 - mem[True] / mem[False]):.0%} less); step ordinary "
            f"{t['ordinary'] * 1e3:.1f} ms, in-backward {t['in_backward'] * 1e3:.1f} ms, "
            f"ratio {t['in_backward'] / t['ordinary']:.3f} (CPU time ratio "
            f"{c['in_backward'] / c['ordinary']:.3f}); whole-process peak of a step "
            f"(tracemalloc: model, state, activations, gradients) ordinary "
            f"{mib(traced[False])}, in-backward {mib(traced[True])}", flush=True)
        record("backward_update", what, "grad_memory_in_backward_over_ordinary",
               mem[True] / mem[False], "x", better="lower", ranks=comm.size, rank=comm.rank)
        record("backward_update", what, "step_in_backward_over_ordinary",
               t["in_backward"] / t["ordinary"], "x", target=1.05, better="lower",
               ranks=comm.size, rank=comm.rank)
    if probe:
        probe.close()


if __name__ == "__main__":
    main()
