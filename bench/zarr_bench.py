"""Zarr v3 vs HDF5: parallel write and read of the same DistArray, measured in the same run.

    mpiexec -n 2 .venv/bin/python -m mpi4py bench/zarr_bench.py [--channels 4 --size 64]
        [--reps 5] [--dir DIR]

One CosmoFlow-like sample ``C x S^3`` float32 (:func:`disttensor.io.synthetic_sample`, default
4 x 64^3 = 4 MiB), D-split over a 1-d grid of all ranks (``split=(None, 0)``).  Compared, each
the median of ``--reps`` runs, a run's time being the slowest rank's (after a barrier):

* ``write_hdf5``: :func:`disttensor.io.write_hdf5` (``mode='w'``, atomic, contiguous,
  uncompressed: the default) against ``write_zarr[zstd]`` (the default: chunks aligned with the
  blocks, zstd level 3, atomic) and ``write_zarr[raw]`` (no compression);
* ``read_hdf5`` (default driver) against ``read_zarr[zstd]`` / ``read_zarr[raw]`` of those
  stores, to the same distribution.

Runs are interleaved (run r of every method, then run r + 1) so that other load hits every
method alike; files are in the page cache (warm).  Lines: absolute times, then the ratios
``zarr / hdf5`` (below 1: Zarr is faster) and the stores' sizes on disk.  Figures go to
``bench/_results.py``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

import numpy as np
from mpi4py import MPI

import disttensor as dt
from disttensor import io

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402


def _du(path) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--channels", type=int, default=4)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", default=None, help="where to write (default: a temporary dir)")
    a = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    try:
        import zarr  # noqa: F401
    except ImportError:
        if comm.rank == 0:
            print("zarr_bench: zarr is not installed (pip install 'disttensor[zarr]'); skipped")
        return 0
    d = comm.bcast(tempfile.mkdtemp(prefix="zarr_bench_", dir=a.dir) if comm.rank == 0
                   else None, root=0)
    g = dt.ProcessGrid((comm.size,))
    x0, _ = io.synthetic_sample(0, a.size, a.channels, seed=1)
    x = dt.from_global(x0, grid=g, split=(None, 0))
    h5, zz, zr = (os.path.join(d, n) for n in ("a.h5", "a_zstd.zarr", "a_raw.zarr"))
    methods = {
        "write_hdf5": lambda: io.write_hdf5(x, h5, "x", mode="w"),
        "write_zarr[zstd]": lambda: io.write_zarr(x, zz),
        "write_zarr[raw]": lambda: io.write_zarr(x, zr, compressors=None),
        "read_hdf5": lambda: io.read_hdf5(h5, "x", grid=g, split=(None, 0)),
        "read_zarr[zstd]": lambda: io.read_zarr(zz, grid=g, split=(None, 0)),
        "read_zarr[raw]": lambda: io.read_zarr(zr, grid=g, split=(None, 0)),
    }
    times = {k: [] for k in methods}
    try:
        for k, f in methods.items():  # warm-up, and the stores the reads need
            f()
        y = io.read_zarr(zz, grid=g, split=(None, 0))
        ok = comm.allreduce(bool(np.array_equal(y.local, x.local)), op=MPI.LAND)
        for _ in range(a.reps):
            for k, f in methods.items():
                comm.Barrier()
                t0 = MPI.Wtime()
                f()
                times[k].append(comm.allreduce(MPI.Wtime() - t0, op=MPI.MAX))
        sizes = {n: _du(pth) for n, pth in (("hdf5", h5), ("zarr[zstd]", zz),
                                            ("zarr[raw]", zr))} if comm.rank == 0 else {}
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(d, ignore_errors=True)
        g.free()
    if comm.rank != 0:
        return 0
    case = f"{a.channels}x{a.size}^3 float32 D-split"
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"zarr_bench: {case} on {comm.size} rank(s), median of {a.reps}; round trip "
          f"{'ok' if ok else 'WRONG'}")
    for k, v in med.items():
        print(f"  {k:18s} {v * 1e3:9.2f} ms")
    for op in ("write", "read"):
        for c in ("zstd", "raw"):
            r = med[f"{op}_zarr[{c}]"] / med[f"{op}_hdf5"]
            print(f"  {op}_zarr[{c}] / {op}_hdf5 = {r:.2f}x")
            record("zarr", case, f"{op}_zarr_{c}_vs_hdf5", r, "x", better="lower",
                   ranks=comm.size)
        record("zarr", case, f"{op}_hdf5_s", med[f"{op}_hdf5"], "s", better="lower",
               ranks=comm.size)
    for n, b in sizes.items():
        print(f"  size {n:11s} {b / 2**20:8.2f} MiB")
    record("zarr", case, "zstd_size_vs_hdf5", sizes["zarr[zstd]"] / sizes["hdf5"], "x",
           better="lower", ranks=comm.size)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
