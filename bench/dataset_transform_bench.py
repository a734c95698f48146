"""Read-time crop + transform + augmentation throughput of SampleDataset vs plain float32 crops.

    mpiexec -n 2 .venv/bin/python -m mpi4py bench/dataset_transform_bench.py [--size 64]
        [--crop 32] [--samples 8] [--channels 4] [--reps 3] [--dir DIR]

Two datasets of ``--samples`` universes of ``C x S^3`` are written once:

* ``raw``: the raw CosmoFlow format (``--layout raw`` of the synthetic generator: int16
  ``D,H,W,C`` counts), read with ``channels_last=True, dtype='float32', log1p=True,
  crop=(c, c, c), augment=True`` (random crops, flips and axis permutations: each rank reads
  the mirrored/permuted hyperslab of its block, converts, takes log1p, transposes locally);
* ``plain``: float32 ``C,D,H,W`` files of the same shape, read with ``crop=(c, c, c)`` only (the
  same random crop offsets, straight into the batch): the baseline.

Both through :class:`~disttensor.io.SampleDataset` on a spatial grid of all ranks
(``split=(0, None, 1, 2, 3)``, D split), one epoch of batches of 2 without prefetching (the
read itself), the time of an epoch being the slowest rank's.  Runs interleave (run r of every
case, then run r + 1), medians of ``--reps``.  Printed and recorded: samples/s of each case and
``ratio = plain time / pipeline time`` (throughput of the full pipeline relative to plain
float32 crops; target >= 0.9), plus the same with ``divide_by_mean`` (one all-reduce per batch)
instead of log1p.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

from mpi4py import MPI

import disttensor as dt
from disttensor import io
from disttensor.io.synthetic import generate_synthetic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--crop", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--channels", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", default=None)
    a = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    d = comm.bcast(tempfile.mkdtemp(prefix="dstr_bench_", dir=a.dir) if comm.rank == 0
                   else None)
    try:
        generate_synthetic(os.path.join(d, "raw"), a.samples, a.size, a.channels, seed=0,
                           layout="raw", comm=comm)
        generate_synthetic(os.path.join(d, "plain"), a.samples, a.size, a.channels, seed=0,
                           comm=comm)
        grid = dt.ProcessGrid((1, comm.size, 1, 1))
        split = (0, None, 1, 2, 3)
        crop = (a.crop,) * 3
        common = dict(split=split, batch_size=2, seed=1, prefetch=False, crop=crop)
        cases = {
            "plain float32 crops": io.SampleDataset(os.path.join(d, "plain"), grid, **common),
            "int16 crop+float32+log1p+augment": io.SampleDataset(
                os.path.join(d, "raw"), grid, channels_last=True, dtype="float32",
                log1p=True, augment=True, **common),
            "int16 crop+float32+mean+augment": io.SampleDataset(
                os.path.join(d, "raw"), grid, channels_last=True, dtype="float32",
                divide_by_mean=True, augment=True, **common),
        }
        times = {k: [] for k in cases}
        for r in range(a.reps + 1):  # run 0 warms the page cache and the code paths
            for k, ds in cases.items():
                comm.Barrier()
                t0 = MPI.Wtime()
                for _ in ds.epoch(r):
                    pass
                t = comm.allreduce(MPI.Wtime() - t0, op=MPI.MAX)
                if r:
                    times[k].append(t)
        med = {k: statistics.median(v) for k, v in times.items()}
        base = med["plain float32 crops"]
        what = f"{a.samples}x{a.channels}x{a.size}^3 -> {a.crop}^3"
        if comm.rank == 0:
            print(f"dataset_transform_bench: {what}, {comm.size} rank(s), D split, "
                  f"median of {a.reps}")
        for k, t in med.items():
            sps = a.samples / t
            ratio = base / t
            if comm.rank == 0:
                print(f"  {k:34s} {t * 1e3:8.1f} ms/epoch {sps:8.1f} samples/s"
                      f"{'' if k.startswith('plain') else f'   {ratio:.2f}x plain'}")
            record("dataset_transform", f"{k} {what}", "samples_per_s", sps, "1/s",
                   ranks=comm.size, rank=comm.rank)
            if not k.startswith("plain"):
                record("dataset_transform", f"{k} {what}", "throughput_vs_plain_float32",
                       ratio, "x", target=0.9, better="higher", ranks=comm.size,
                       rank=comm.rank)
        for ds in cases.values():
            ds.close()
        grid.free()
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
