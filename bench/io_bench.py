"""Partitioned HDF5 read of one training sample vs its baselines, measured in the same run.

    mpiexec -n 2 .venv/bin/python -m mpi4py bench/io_bench.py [--channels 4 --size 128]
        [--reps 7] [--dir DIR] [--no-cold]

One sample ``C x S^3`` float32 (default 4 x 128^3 = 32 MiB, CosmoFlow's) is written once with
plain h5py.  Every rank then needs the block of a D-split (``split=(None, 0)`` over a 1-d grid
of all ranks).  Compared, each the median of ``--reps`` runs, a run's time being the slowest
rank's (after a barrier):

* ``read_hdf5[mpio]``: :func:`disttensor.io.read_hdf5` with the ``mpio`` driver and collective
  transfers (the default), ``read_hdf5[mpio,indep]`` the same with ``collective_io=False``,
  ``read_hdf5[independent]`` with the POSIX driver (each includes opening the file and the
  collective argument/error checks);
* ``bare hyperslab[mpio]``: every rank opens the file with h5py's mpio driver and reads its
  hyperslab collectively (``with dset.collective: dset.read_direct(out, sel)``; note that
  ``dset[sel]`` would *not* be collective: h5py's fast path for int/float datasets reads with
  the default transfer list and ignores ``dset.collective``), ``bare hyperslab[mpio,indep]``
  the same with ``dset[sel]``, ``bare hyperslab[posix]`` with h5py's default driver
  (``dset[sel]``): the floors for the three paths above;
* ``root read + Scatterv``: rank 0 reads the whole sample and scatters the blocks (packing
  included) -- what stops 3D CNNs from strong-scaling (Oyama).

Runs are interleaved (run r of every method, then run r + 1) so that other load on the
machine hits every method alike.  ``warm``: the file is in the page cache (memory bandwidth bound); ``cold`` (default as well,
``--no-cold`` skips it): before each run rank 0 asks the kernel to drop the file's cached pages
(``posix_fadvise(DONTNEED)``), so reads come from the device.  Lines: absolute times, then
ratios ``ours / bare`` (overhead of the library, ideally ~1) and ``root+scatter / ours``
(speed-up of reading partitioned).
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
from disttensor.core.distribution import Distribution

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed_once(comm, fn, cold, path):
    if cold and comm.rank == 0:
        drop_cache(path)
    comm.Barrier()
    t0 = MPI.Wtime()
    out = fn()
    t = MPI.Wtime() - t0
    del out
    return comm.allreduce(t, op=MPI.MAX)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--channels", type=int, default=4)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--dir", default=None, help="directory for the sample file (default: a "
                   "temporary directory under $TMPDIR)")
    p.add_argument("--no-cold", action="store_true")
    a = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    import h5py

    d = comm.bcast(tempfile.mkdtemp(prefix="io_bench_", dir=a.dir) if comm.rank == 0 else None)
    path = os.path.join(d, "sample.h5")
    shape = (a.channels, a.size, a.size, a.size)
    if comm.rank == 0:
        x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
        with h5py.File(path, "w") as f:
            f.create_dataset("full", data=x)
        del x
    comm.Barrier()
    grid = dt.ProcessGrid((comm.size,))
    split = (None, 0)
    dist = Distribution(shape, grid.dims, split)
    box = dist.block_box(grid.coords)
    d0, d1 = box.start[1], box.stop[1]
    mib = np.prod(shape) * 4 / 2**20

    def ours(driver, coll=True):
        return lambda: io.read_hdf5(path, "full", grid=grid, split=split, driver=driver,
                                    collective_io=coll).local

    def bare_mpio():
        with h5py.File(path, "r", driver="mpio", comm=comm) as f:
            ds = f["full"]
            out = np.empty(box.shape, dtype=np.float32)
            with ds.collective:
                ds.read_direct(out, np.s_[:, d0:d1])
            return out

    def bare_mpio_indep():
        with h5py.File(path, "r", driver="mpio", comm=comm) as f:
            return f["full"][:, d0:d1]

    def bare_posix():
        with h5py.File(path, "r") as f:
            return f["full"][:, d0:d1]

    boxes = [dist.rank_box(r) for r in range(comm.size)]
    counts = [b.size for b in boxes]
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()

    def root_scatter():
        send = None
        if comm.rank == 0:
            with h5py.File(path, "r") as f:
                whole = f["full"][...]
            send = np.empty(sum(counts), dtype=np.float32)
            for b, c, o in zip(boxes, counts, displs):
                send[o:o + c] = whole[b.slices()].reshape(-1)
        out = np.empty(box.shape, dtype=np.float32)
        comm.Scatterv([send, counts, displs, MPI.FLOAT] if comm.rank == 0 else None,
                      out, root=0)
        return out

    # correctness first: all methods give this rank's block
    want = root_scatter()
    mpio = io.hdf5_driver_available("mpio")
    ok = all(np.array_equal(f(), want) for f in
             [ours("independent"), bare_posix] +
             ([ours("mpio"), ours("mpio", False), bare_mpio, bare_mpio_indep] if mpio else []))
    if not comm.allreduce(ok, op=MPI.LAND):
        if comm.rank == 0:
            print("io_bench: methods disagree on the data", flush=True)
        return 1

    methods = []
    pairs = []
    if mpio:
        methods += [("read_hdf5[mpio]", ours("mpio")), ("bare hyperslab[mpio]", bare_mpio),
                    ("read_hdf5[mpio,indep]", ours("mpio", False)),
                    ("bare hyperslab[mpio,indep]", bare_mpio_indep)]
        pairs += [("read_hdf5[mpio]", "bare hyperslab[mpio]"),
                  ("read_hdf5[mpio,indep]", "bare hyperslab[mpio,indep]")]
    methods += [("read_hdf5[independent]", ours("independent")),
                ("bare hyperslab[posix]", bare_posix), ("root read + Scatterv", root_scatter)]
    pairs += [("read_hdf5[independent]", "bare hyperslab[posix]")]
    caches = ["warm"] + ([] if a.no_cold else ["cold"])
    # interleaved (run r of every method, then run r + 1, ...) so that load from other
    # processes on the machine hits all methods alike
    samples = {(c, n): [] for c in caches for n, _ in methods}
    for _ in range(a.reps):
        for cache in caches:
            for name, fn in methods:
                samples[cache, name].append(timed_once(comm, fn, cache == "cold", path))
    res = {k: statistics.median(v) for k, v in samples.items()}

    if comm.rank == 0:
        print(f"io_bench: sample {a.channels}x{a.size}^3 float32 ({mib:.1f} MiB) in {path}, "
              f"{comm.size} ranks, D split (block {box.shape} on rank 0), median of "
              f"{a.reps}, slowest rank")
        for cache in caches:
            for name, _ in methods:
                t = res[cache, name]
                print(f"{cache:4s} {name:28s} {t * 1e3:9.2f} ms  {mib / t:8.0f} MiB/s")
        for cache in caches:
            for ours_, bare in pairs:
                print(f"{cache:4s} ratio {ours_} / {bare}: "
                      f"{res[cache, ours_] / res[cache, bare]:.2f}")
                record("io", f"{cache} {ours_}", "ratio_vs_bare_hyperslab",
                       res[cache, ours_] / res[cache, bare], "x", better="lower",
                       ranks=comm.size)
            for ours_ in [n for n, _ in methods if n.startswith("read_hdf5")]:
                print(f"{cache:4s} ratio root read + Scatterv / {ours_}: "
                      f"{res[cache, 'root read + Scatterv'] / res[cache, ours_]:.2f}")
        sys.stdout.flush()
    grid.free()
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
