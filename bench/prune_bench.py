"""CosmoFlow dense vs pruned to 90% of its dense-layer weights (Zhu & Gupta's gradual
schedule from 1/5 to 1/2 of the steps, ``python -m disttensor.train --prune-to 0.9
--prune-scope global``) on the synthetic data: validation MAE
of both runs (target: the pruned one within 10% of the dense one) and the dense head's
inference time with CSB-sparse Linear layers against the dense ones (target: sparse faster),
at the training batch and at larger batches (a head of the same shapes, pruned to 90%).

    mpiexec -n 1 python -m mpi4py bench/prune_bench.py [--size 32] [--samples 128]
        [--epochs 8] [--widths 8,16,32] [--dense 128,64] [--batch-size 8]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))
from _results import record  # noqa: E402
from _timing import compare, wall  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor import nn, train  # noqa: E402
from disttensor.autograd import Tensor, no_grad  # noqa: E402
from disttensor.io.synthetic import generate_synthetic  # noqa: E402
from disttensor.nn import prune  # noqa: E402
from disttensor.nn.sparse_layers import SparseLinear  # noqa: E402


def head_times(features: int, dense: tuple, outputs: int, batches, reps: int) -> list:
    """(batch, dense s, sparse s) of a ``features -> dense... -> outputs`` head pruned to 90%
    by L1 magnitude, forward only (rank-local, over COMM_SELF)."""
    rng = np.random.default_rng(0)
    layers, f = [nn.Flatten()], features
    for d in list(dense) + [outputs]:
        layers += [nn.Linear(f, d, rng=rng), nn.LeakyReLU(0.3)]
        f = d
    head = nn.Sequential(*layers[:-1])
    for m in head:
        if isinstance(m, nn.Linear):
            prune.l1_unstructured(m, "weight", 0.9, comm=MPI.COMM_SELF)
    sparse = nn.Sequential(*[SparseLinear.from_dense(m) if isinstance(m, nn.Linear) else m
                             for m in head])
    g = dt.ProcessGrid((1,), comm=MPI.COMM_SELF)
    out = []
    for b in batches:
        x = Tensor(dt.from_global(rng.standard_normal((b, features)).astype("float32"),
                                  grid=g, split=(0, None)))
        with no_grad():
            np.testing.assert_allclose(sparse(x).data.to_numpy(), head(x).data.to_numpy(),
                                       rtol=1e-4, atol=1e-5)
            t = compare({"dense": lambda: head(x), "sparse": lambda: sparse(x)}, reps, 3,
                        timer=wall)
        out.append((b, t["dense"], t["sparse"]))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--samples", type=int, default=128)
    p.add_argument("--val-samples", type=int, default=32)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--widths", default="8,16,32")
    p.add_argument("--dense", default="128,64")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--data", default=None, help="directory for the synthetic data")
    p.add_argument("--scope", choices=("global", "layer"), default="global")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    root = args.data or comm.bcast(tempfile.mkdtemp(prefix="prune_bench_")
                                   if comm.rank == 0 else None)
    tr, va = os.path.join(root, "train"), os.path.join(root, "val")
    if not os.path.isdir(tr):
        generate_synthetic(tr, args.samples, size=args.size, seed=0, comm=comm)
        generate_synthetic(va, args.val_samples, size=args.size, seed=1, comm=comm)
    common = ["cosmoflow", "--data", tr, "--val", va, "--widths", args.widths, "--dense",
              args.dense, "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
              "--lr", str(args.lr), "--no-checkpoint", "--quiet", "--seed", "0",
              "--grid", f"{comm.size}x1x1x1"]
    steps = args.samples // args.batch_size * args.epochs
    runs = {}
    for name, extra in (("dense", []),
                        ("pruned", ["--prune-to", "0.9", "--prune-schedule", "gradual",
                                    "--prune-layers", "dense", "--prune-scope", args.scope,
                                    "--prune-start", str(steps // 5),
                                    "--prune-end", str(steps // 2),
                                    "--prune-frequency", "4"])):
        t = time.perf_counter()
        runs[name] = train.run(common + ["--out", os.path.join(root, name)] + extra)
        runs[name].seconds = time.perf_counter() - t
    if comm.rank == 0:
        d, q = runs["dense"].val[-1], runs["pruned"].val[-1]
        ratio = q["val_mae"] / d["val_mae"]
        print(f"CosmoFlow {args.size}^3 widths {args.widths} dense {args.dense}, "
              f"{args.samples} samples x {args.epochs} epochs, batch {args.batch_size}, "
              f"{comm.size} rank(s)")
        print(f"  trivial predictor MAE   {d['baseline_mae']:.4f}")
        print(f"  dense   run: val MAE {d['val_mae']:.4f}  ({runs['dense'].seconds:.0f} s)")
        print(f"  pruned  run: val MAE {q['val_mae']:.4f}  ({runs['pruned'].seconds:.0f} s), "
              f"sparsity {runs['pruned'].pruning['sparsity']:.1%}; pruned/dense MAE "
              f"{ratio:.3f} (target <= 1.10)")
        pr = runs["pruned"].pruning
        print(f"  trained head, batch {args.batch_size}: dense {pr['dense_s'] * 1e6:.0f} us, "
              f"sparse {pr['sparse_s'] * 1e6:.0f} us ({pr['dense_s'] / pr['sparse_s']:.2f}x)")
        record("prune", "cosmoflow val MAE pruned/dense", "mae_ratio", ratio, "x",
               target=1.10, better="lower")
        record("prune", f"trained head batch {args.batch_size}", "dense_over_sparse",
               pr["dense_s"] / pr["sparse_s"], "x", target=1.0)
        ws = [int(w) for w in args.widths.split(",")]
        features = ws[-1] * (args.size // 2 ** len(ws)) ** 3
        dense = tuple(int(v) for v in args.dense.split(","))
        print(f"  head {features} -> {dense} -> 4 at 90% sparsity (float32, forward):")
        for b, td, ts in head_times(features, dense, 4, (args.batch_size, 32, 128), args.reps):
            print(f"    batch {b:4d}: dense {td * 1e6:8.0f} us  sparse {ts * 1e6:8.0f} us  "
                  f"dense/sparse {td / ts:.2f}x")
            record("prune", f"head {features}->{dense} batch {b}", "dense_over_sparse",
                   td / ts, "x", target=1.0)


if __name__ == "__main__":
    main()
