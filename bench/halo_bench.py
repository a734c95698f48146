"""Halo exchange vs a bare MPI_Sendrecv of the same bytes (run: mpiexec -n 2 python bench/halo_bench.py).

For a 3-D array of about 64 MiB split over the ranks (a 1-D grid) along axis 0 (faces are
contiguous) or along the last axis (faces are strided: one run of ``w`` elements per row),
with a halo of width ``w`` on both sides of the split axis only, it times

* ours: ``h.exchange()`` of a reusable ``h = x.halo_exchange('zero')`` (subarray datatypes
  straight from/to the local buffer, no pack copy), and
* bare: one ``MPI.Sendrecv`` per neighbour of contiguous, preallocated buffers holding exactly
  as many bytes as ours sends to and receives from that neighbour (read off the exchange plan),

interleaved rep by rep on the same data.  Each rep starts after a barrier and its time is the
slowest rank's; each line prints the medians over ``--reps`` reps (after ``--warmup``) and
the ratio ours/bare (1.0 = no overhead over the network primitive).  See bench/README.md.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import disttensor as dt  # noqa: E402

COMM = MPI.COMM_WORLD
MIB = 1 << 20


def timed(fn) -> float:
    """Seconds of one collective call, the slowest rank's, after a barrier."""
    COMM.Barrier()
    t0 = time.perf_counter()
    fn()
    dt_ = time.perf_counter() - t0
    return COMM.allreduce(dt_, op=MPI.MAX)


def compare(ours, bare, reps: int, warmup: int) -> tuple[float, float]:
    for _ in range(warmup):
        ours()
        bare()
    a, b = [], []
    for i in range(reps):  # interleaved, alternating who goes first, so drift hits both
        if i % 2:
            b.append(timed(bare))
            a.append(timed(ours))
        else:
            a.append(timed(ours))
            b.append(timed(bare))
    return statistics.median(a), statistics.median(b)


def shape_for(dtype, target_bytes: int) -> tuple[int, int, int]:
    n = target_bytes // np.dtype(dtype).itemsize
    side = 256
    return (side, side, n // (side * side))


def bare_sendrecv(plan, itemsize: int):
    """A function doing one Sendrecv per peer of contiguous buffers of the plan's byte counts."""
    peers = sorted({t.peer for t in plan.sends} | {t.peer for t in plan.recvs})
    bufs = []
    for p in peers:
        ns = sum(t.box.size for t in plan.sends if t.peer == p) * itemsize
        nr = sum(t.box.size for t in plan.recvs if t.peer == p) * itemsize
        bufs.append((p, np.ones(ns, dtype=np.uint8), np.empty(nr, dtype=np.uint8)))
    nbytes = sum(len(s) for _, s, _ in bufs)

    def run():
        for p, s, r in bufs:
            COMM.Sendrecv([s, MPI.BYTE], dest=p, recvbuf=[r, MPI.BYTE], source=p)
    return run, nbytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="global array size in MiB")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    grid = dt.ProcessGrid((COMM.size,))
    if COMM.rank == 0:
        print(f"# halo_bench: {COMM.size} ranks, {args.mib} MiB arrays, median of {args.reps} reps "
              f"(after {args.warmup} warm-up), times = slowest rank; ratio = ours/bare", flush=True)
    for dtype in ("float32", "float64"):
        shape = shape_for(dtype, args.mib * MIB)
        for axis in (0, 2):
            split = [None, None, None]
            split[axis] = 0
            for w in (1, 3):
                halo = [(0, 0)] * 3
                halo[axis] = (w, w)
                x = dt.zeros(shape, dtype=dtype, grid=grid, split=split, halo=halo)
                x.local[...] = COMM.rank + 1
                h = x.halo_exchange("zero")
                bare, nbytes = bare_sendrecv(h.plan, x.dtype.itemsize)
                t_ours, t_bare = compare(h.exchange, bare, args.reps, args.warmup)
                nbytes = COMM.allreduce(nbytes, op=MPI.MAX)
                if COMM.rank == 0:
                    kind = "contiguous" if axis == 0 else "strided"
                    print(f"halo {dtype} shape={shape} split_axis={axis} ({kind} faces) w={w}: "
                          f"sent/rank={nbytes / MIB:.2f} MiB  ours={t_ours * 1e3:.3f} ms  "
                          f"bare_sendrecv={t_bare * 1e3:.3f} ms  ratio={t_ours / t_bare:.2f}",
                          flush=True)
                del x, h
    grid.free()


if __name__ == "__main__":
    main()
