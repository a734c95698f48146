"""Halo exchange vs a bare MPI_Sendrecv of the same bytes (run: mpiexec -n 2 python bench/halo_bench.py).

For a 3-D array of about 64 MiB split over the ranks (a 1-D grid) along axis 0 (faces are
contiguous) or along the last axis (faces are strided: one run of ``w`` elements per row),
with a halo of width ``w`` on both sides of the split axis only, it times

* ours: ``h.exchange()`` of a reusable ``h = x.halo_exchange('zero')`` (subarray datatypes
  straight from/to the local buffer, no pack copy), and
* bare: one ``MPI.Sendrecv`` per neighbour of contiguous, preallocated buffers holding exactly
  as many bytes as ours sends to and receives from that neighbour (read off the exchange plan),

interleaved rep by rep on the same data.  For strided faces a third figure is the hand-written
floor: NumPy-pack the faces, one Sendrecv, NumPy-unpack (what any exchange of those faces
must at least do), and ours divided by it.  Each rep starts after a barrier and its time is the
slowest rank's; each line prints the medians over ``--reps`` reps (after ``--warmup``) and
the ratio ours/bare (1.0 = no overhead over the network primitive).  See bench/README.md.
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

COMM = MPI.COMM_WORLD
MIB = 1 << 20


def shape_for(dtype, target_bytes: int) -> tuple[int, int, int]:
    n = target_bytes // np.dtype(dtype).itemsize
    side = 256
    return (side, side, n // (side * side))


def bare_sendrecv(plan, itemsize: int):
    """One Sendrecv per peer of contiguous preallocated buffers of the plan's byte counts."""
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


def bare_pack_sendrecv(plan, buf):
    """The hand-written floor for non-contiguous faces: NumPy-pack every face into one
    preallocated buffer per peer, one Sendrecv per peer, NumPy-unpack (no plan, no Python
    objects per call beyond the loops)."""
    peers = sorted({t.peer for t in plan.sends} | {t.peer for t in plan.recvs})
    work = []
    for p in peers:
        sv = [buf[t.box.slices()] for t in plan.sends if t.peer == p]
        rv = [buf[t.box.slices()] for t in plan.recvs if t.peer == p]
        sb = np.empty(sum(v.size for v in sv), dtype=buf.dtype)
        rb = np.empty(sum(v.size for v in rv), dtype=buf.dtype)
        work.append((p, sv, rv, sb, rb))

    def run():
        for p, sv, rv, sb, rb in work:
            o = 0
            for v in sv:
                np.copyto(sb[o:o + v.size].reshape(v.shape), v)
                o += v.size
            COMM.Sendrecv([sb, MPI.BYTE], dest=p, recvbuf=[rb, MPI.BYTE], source=p)
            o = 0
            for v in rv:
                np.copyto(v, rb[o:o + v.size].reshape(v.shape))
                o += v.size
    return run


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
                fns = {"ours": h.exchange, "bare": bare}
                if axis != 0:
                    fns["pack"] = bare_pack_sendrecv(h.plan, x.buffer)
                t = compare(fns, args.reps, args.warmup)
                nbytes = COMM.allreduce(nbytes, op=MPI.MAX)
                if COMM.rank == 0:
                    kind = "contiguous" if axis == 0 else "strided"
                    extra = ""
                    if "pack" in t:
                        extra = (f"  [bare_pack+sendrecv+unpack={t['pack'] * 1e3:.3f} ms, "
                                 f"ours/that={t['ours'] / t['pack']:.2f}]")
                    print(f"halo {dtype} shape={shape} split_axis={axis} ({kind} faces) w={w}: "
                          f"sent/rank={nbytes / MIB:.2f} MiB  ours={t['ours'] * 1e3:.3f} ms  "
                          f"bare_sendrecv={t['bare'] * 1e3:.3f} ms  "
                          f"ratio={t['ours'] / t['bare']:.2f}{extra}", flush=True)
                del x, h
    grid.free()


if __name__ == "__main__":
    main()
