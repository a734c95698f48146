"""The local kernels of one CosmoFlow training step on a 2-rank spatial split against those of
a 2-rank sample split: the same work per rank, different block shapes (no MPI).

On 2 ranks a CosmoFlow step at ``--size``^3, batch ``--batch``, widths ``--widths`` hands each
rank's local kernels

* **spatial** (grid ``(1, 2, 1, 1)``, depth split; rank 0's blocks, ``--rank 1`` for rank 1's):
  every sample, half the depth; a convolution reads its block plus one halo plane, zero
  padding on the other depth side only: forward ``(N, Cin, D/2 + 1, H, W)`` padded
  ``(1, 0)`` in depth -> ``(N, Cout, D/2, H, W)``; backward data returns the gradient of the
  whole read window (the halo plane too); backward filter reads the same window;
* **samples** (grid ``(2, 1, 1, 1)``): half the samples, full depth, padded ``(1, 1)``.

Each conv pass (forward, backward data except the first layer's, backward filter) and max
pooling (forward, backward) of each layer runs on both shapes in one process, interleaved rep
by rep (``bench/_timing.py``'s rotation), median of ``--reps`` CPU-time samples (wall time is
distorted when other jobs share the cores; the CPU time of a single-threaded kernel is not).
Convolutions go through the planner's entry points (``kernels_for(numpy array)``; the plan of
each pass is printed) or, with ``--algorithm``, through one :mod:`conv_direct` algorithm on
the whole batch.  Figures (``$DISTTENSOR_BENCH_CSV``, bench ``split_kernels``): per pass the
``spatial_over_samples`` time ratio and, for the whole step, the ratio and the difference in
ms (what the spatial split's kernels cost the step beyond the sample split's).

    .venv/bin/python bench/split_kernels_bench.py [--size 32] [--algorithm direct8x2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

for _v in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _results import record  # noqa: E402
from disttensor.ops.local import kernels_for  # noqa: E402
from disttensor.ops.local.cpu import pool  # noqa: E402
from disttensor.ops.local.cpu.conv_direct import ALGORITHMS  # noqa: E402
from disttensor.ops.local.microbatch import cpu_entry, last_plan  # noqa: E402

ONE, K3, P2 = (1, 1, 1), (3, 3, 3), (2, 2, 2)


def layer_blocks(split: str, size: int, widths, batch: int, rank: int = 0):
    """Per conv layer ``(x window shape, w shape, pad_lo, pad_hi, y shape)`` of one rank of a
    2-rank ``split`` (``'spatial'``: depth split, rank ``rank``; ``'samples'``)."""
    out, c, s = [], 4, size
    for w in widths:
        if split == "spatial":
            n, d = batch, s // 2
            lo, hi = ((1, 1, 1), (0, 1, 1)) if rank == 0 else ((0, 1, 1), (1, 1, 1))
            x = (n, c, d + 1, s, s)
        else:
            n, d = batch // 2, s
            lo = hi = (1, 1, 1)
            x = (n, c, s, s, s)
        out.append((x, (w, c) + K3, lo, hi, (n, w, d, s, s)))
        c, s = w, s // 2
    return out


class _Fixed:
    """One :mod:`conv_direct` algorithm behind the entry points' names."""

    def __init__(self, algo):
        self.conv_forward = algo.forward
        self.conv_backward_data = algo.backward_data
        self.conv_backward_filter = algo.backward_filter


def cases(split: str, args, rng):
    """``{(layer, pass): call}`` of one split (the operands made once)."""
    algo = _Fixed(ALGORITHMS[args.algorithm]) if args.algorithm else None
    out = {}
    for li, (xs, ws, lo, hi, ys) in enumerate(layer_blocks(split, args.size, args.widths,
                                                           args.batch, args.rank)):
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) * 0.1).astype(np.float32)
        dy = rng.standard_normal(ys).astype(np.float32)
        k = algo or kernels_for(x)
        geo = (ONE, ONE, lo, hi, 1)
        out[(li, "conv forward")] = lambda k=k, x=x, w=w, g=geo: k.conv_forward(x, w, *g)
        if li:
            out[(li, "conv backward data")] = lambda k=k, dy=dy, w=w, xs=xs, g=geo: \
                k.conv_backward_data(dy, w, xs[2:], *g)
        out[(li, "conv backward filter")] = lambda k=k, x=x, dy=dy, g=geo: \
            k.conv_backward_filter(x, dy, K3, *g)
        act = rng.standard_normal(ys).astype(np.float32)
        _, am = pool.pool_forward(act, "max", P2, P2, (0,) * 3, (0,) * 3)
        gy = rng.standard_normal(am.shape).astype(np.float32)
        out[(li, "max pool forward")] = lambda a=act: pool.pool_forward(
            a, "max", P2, P2, (0,) * 3, (0,) * 3)
        out[(li, "max pool backward")] = lambda g=gy, a=am, sp=ys[2:]: pool.pool_backward(
            g, a, "max", sp, P2, P2, (0,) * 3, (0,) * 3)
    return out


def plans(calls) -> dict:
    """The plan each conv call runs (the planner's entry points only)."""
    got = {}
    for key, f in calls.items():
        if key[1].startswith("conv"):
            f()
            p = last_plan()
            got[key] = " + ".join(f"{a} x{b}" for a, b in p.micro_batches) if p else "?"
    return got


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--widths", type=lambda s: tuple(int(v) for v in s.split(",")),
                    default=(16, 32, 64, 128))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rank", type=int, default=0, choices=(0, 1))
    ap.add_argument("--algorithm", default=None, choices=sorted(ALGORITHMS))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=4)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    both = {"spatial": cases("spatial", args, rng), "samples": cases("samples", args, rng)}
    for i in range(200):   # compiles, and runs until the planner settled every plan
        for calls in both.values():
            for f in calls.values():
                f()
        if i + 1 >= args.warmup and not cpu_entry._tuners:
            break
    print(f"# plans settled after {i + 1} calls of each pass (online tuning included)")
    plan = {s: plans(c) for s, c in both.items()} if not args.algorithm else None
    keys = list(both["spatial"])
    times = {(s, k): [] for s in both for k in keys}
    for r in range(args.reps):
        # the two shapes of a kernel back to back, each first in every other pair (the
        # second of a pair runs on warm code and a cache the first left), the pairs rotating
        for i, k in enumerate(keys[r % len(keys):] + keys[:r % len(keys)]):
            for s in (("spatial", "samples") if (r + i) % 2 else ("samples", "spatial")):
                c0 = time.process_time()
                both[s][k]()
                times[(s, k)].append(time.process_time() - c0)
    med = {sk: statistics.median(v) for sk, v in times.items()}
    how = args.algorithm or "planned"
    print(f"CosmoFlow {args.size}^3 widths {args.widths} batch {args.batch}: local kernels of "
          f"spatial rank {args.rank} vs samples ({how}; median CPU ms of {args.reps} reps)")
    tot = {"spatial": 0.0, "samples": 0.0}
    for li, p in keys:
        a, b = med[("spatial", (li, p))], med[("samples", (li, p))]
        tot["spatial"] += a
        tot["samples"] += b
        extra = ""
        if plan and p.startswith("conv"):
            extra = f"   [{plan['spatial'][(li, p)]} | {plan['samples'][(li, p)]}]"
        print(f"  layer {li} {p:21s} spatial {a * 1e3:7.3f}  samples {b * 1e3:7.3f}  "
              f"ratio {a / b:5.3f}{extra}")
        record("split_kernels", f"cosmoflow {args.size}^3 layer {li} {p} ({how})",
               "spatial_over_samples", a / b, "x", better="lower")
    a, b = tot["spatial"], tot["samples"]
    print(f"  step total: spatial {a * 1e3:.3f} ms, samples {b * 1e3:.3f} ms, ratio {a / b:.3f}, "
          f"difference {(a - b) * 1e3:+.3f} ms")
    case = f"cosmoflow {args.size}^3 step ({how})"
    record("split_kernels", case, "spatial_over_samples", a / b, "x", better="lower")
    record("split_kernels", case, "spatial_minus_samples_ms", (a - b) * 1e3, "ms",
           better="lower")


if __name__ == "__main__":
    main()
