"""Redistribution vs a bare MPI_Alltoallv of the same bytes (run: mpiexec -n 2 python bench/redistribute_bench.py).

A 3-D array of about 64 MiB on a 1-D grid over all ranks, split along axis 0, is redistributed
to split along axis 1 and along axis 2 (``x.redistribute(split=...)``: a new output array each
call, one ``MPI_Alltoallw`` with subarray datatypes, the part a rank keeps copied locally).
The baseline is one ``MPI_Alltoallv`` of preallocated contiguous buffers with exactly the
per-peer byte counts of the plan, including the part a rank keeps (sent to itself), so both
move the same bytes.  Calls are interleaved rep by rep; each rep starts after a barrier and
its time is the slowest rank's; medians over ``--reps`` reps after ``--warmup``.

Each line: absolute ms of ours and of the bare Alltoallv, the ratio ours/bare, and both as
GB/s = global array bytes / time (the whole array changes hands once); in brackets the same
redistribution written into a preallocated output block (``redistribute_blocks(..., out=)``),
which leaves out the page faults of a fresh 32 MiB output.  See bench/README.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import disttensor as dt  # noqa: E402
from _timing import compare  # noqa: E402  (bench/ is on sys.path when run as a script)
from disttensor.redistribute import plan as redistribution_plan  # noqa: E402
from disttensor.redistribute import redistribute_blocks  # noqa: E402

COMM = MPI.COMM_WORLD
MIB = 1 << 20


def bare_alltoallv(plan, itemsize: int):
    """One Alltoallv of contiguous byte buffers with the plan's per-peer counts (self included)."""
    size, rank = COMM.size, COMM.rank
    sc, rc = [0] * size, [0] * size
    for t in plan.sends:
        sc[t.peer] += t.box.size * itemsize
    for t in plan.recvs:
        rc[t.peer] += t.box.size * itemsize
    for _, d in plan.local:
        sc[rank] += d.size * itemsize
        rc[rank] += d.size * itemsize
    sd = np.concatenate([[0], np.cumsum(sc)[:-1]]).astype(int).tolist()
    rd = np.concatenate([[0], np.cumsum(rc)[:-1]]).astype(int).tolist()
    sbuf = np.ones(sum(sc), dtype=np.uint8)
    rbuf = np.empty(sum(rc), dtype=np.uint8)

    def run():
        COMM.Alltoallv([sbuf, (sc, sd), MPI.BYTE], [rbuf, (rc, rd), MPI.BYTE])
    return run, sum(sc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="global array size in MiB")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    grid = dt.ProcessGrid((COMM.size,))
    if COMM.rank == 0:
        print(f"# redistribute_bench: {COMM.size} ranks, {args.mib} MiB arrays, median of "
              f"{args.reps} reps (after {args.warmup} warm-up), times = slowest rank; "
              "ratio = ours/bare; GB/s = global bytes / time", flush=True)
    for dtype in ("float32", "float64"):
        n = args.mib * MIB // np.dtype(dtype).itemsize
        shape = (256, 256, n // (256 * 256))
        x = dt.zeros(shape, dtype=dtype, grid=grid, split=(0, None, None))
        x.local[...] = COMM.rank + 1
        for target in (1, 2):
            split = [None, None, None]
            split[target] = 0
            dst = dt.Distribution(shape, grid.dims, split)
            ours = lambda: x.redistribute(split=split)  # noqa: E731
            y = ours()
            ok = COMM.allreduce(bool(np.array_equal(y.to_numpy(), x.to_numpy())), op=MPI.LAND)
            out = np.empty_like(y.local)
            prealloc = lambda: redistribute_blocks(grid.cart, x.local, x.distribution, dst,  # noqa: E731
                                                   out=out)
            bare, nbytes = bare_alltoallv(redistribution_plan(x.distribution, dst, COMM.rank),
                                          x.dtype.itemsize)
            del y
            t = compare({"ours": ours, "bare": bare, "prealloc": prealloc}, args.reps, args.warmup)
            gbytes = x.nbytes / 1e9
            if COMM.rank == 0:
                print(f"redistribute {dtype} shape={shape} split axis 0 -> {target}: "
                      f"bytes/rank={nbytes / MIB:.1f} MiB  ours={t['ours'] * 1e3:.2f} ms "
                      f"({gbytes / t['ours']:.2f} GB/s)  bare_alltoallv={t['bare'] * 1e3:.2f} ms "
                      f"({gbytes / t['bare']:.2f} GB/s)  ratio={t['ours'] / t['bare']:.2f}  "
                      f"[into a preallocated out: {t['prealloc'] * 1e3:.2f} ms, "
                      f"ratio={t['prealloc'] / t['bare']:.2f}]"
                      + ("" if ok else "  WRONG RESULT"), flush=True)
        del x
    grid.free()


if __name__ == "__main__":
    main()
