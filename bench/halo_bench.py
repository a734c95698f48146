"""Halo exchange vs a bare MPI_Sendrecv of the same bytes (run: mpiexec -n 2 python bench/halo_bench.py).

Contiguous faces, a range of sizes: a 3-D array ``(8 * ranks, a, b)`` split along axis 0
over a 1-D grid of all ranks with a halo of width 1 on both sides of axis 0, so every face is
one contiguous run of ``a * b`` elements; ``--faces`` lists the face sizes in KiB (default
4, 32, 256, 2048: latency-bound to bandwidth-bound).  Then strided faces: a 3-D array of about
``--mib`` MiB split along the last axis (a face is 65536 runs of ``w`` elements), w = 1, 3.

It times, interleaved rep by rep on the same data:

* ours: ``h.exchange()`` of a reusable ``h = x.halo_exchange('zero')`` (persistent requests
  started and waited, the zero fill of the boundary halo, packing where needed);
* bare: one ``MPI.Sendrecv`` per neighbour of contiguous, preallocated buffers holding exactly
  as many bytes as ours sends to and receives from that neighbour (read off the exchange plan).

For strided faces a third figure is the hand-written floor: NumPy-pack the faces, one
Sendrecv, NumPy-unpack, and ours divided by it.  Each rep starts after a barrier and its time
is the slowest rank's; each line prints the medians over ``--reps`` reps (after ``--warmup``)
and the ratio ours/bare (1.0 = no overhead over the network primitive), recorded as
``ratio_vs_sendrecv`` (target 1.2 for contiguous faces, lower is better).  ``--quick``: fewer
reps, 16 MiB strided arrays (<= 90 s at 2 and 4 ranks).  See bench/README.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import disttensor as dt  # noqa: E402
from _results import record  # noqa: E402  (bench/ is on sys.path when run as a script)
from _timing import compare  # noqa: E402

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


def contiguous_cases(args, grid) -> None:
    for dtype in ("float32", "float64"):
        item = np.dtype(dtype).itemsize
        for kib in args.faces:
            n = kib * 1024 // item
            a = 1 << (max(n.bit_length() - 1, 0) // 2)
            shape = (8 * COMM.size, a, n // a)
            x = dt.zeros(shape, dtype=dtype, grid=grid, split=(0, None, None),
                         halo=[(1, 1), (0, 0), (0, 0)])
            x.local[...] = COMM.rank + 1
            h = x.halo_exchange("zero")
            bare, nbytes = bare_sendrecv(h.plan, item)
            t = compare({"ours": h.exchange, "bare": bare}, args.reps * 5, args.warmup)
            nbytes = COMM.allreduce(nbytes, op=MPI.MAX)
            if COMM.rank == 0:
                ratio = t["ours"] / t["bare"]
                print(f"halo {dtype} shape={shape} split_axis=0 (contiguous faces) w=1 face="
                      f"{kib} KiB: sent/rank={nbytes / 1024:.0f} KiB  ours={t['ours'] * 1e3:.4f} ms"
                      f"  bare_sendrecv={t['bare'] * 1e3:.4f} ms  ratio={ratio:.2f}", flush=True)
                record("halo", f"{dtype} contiguous face {kib} KiB", "ratio_vs_sendrecv", ratio,
                       "x", target=1.2, better="lower", ranks=COMM.size)
            h.free()
            del x, h


def strided_cases(args, grid) -> None:
    for dtype in ("float32", "float64"):
        shape = shape_for(dtype, args.mib * MIB)
        for w in (1, 3):
            halo = [(0, 0), (0, 0), (w, w)]
            x = dt.zeros(shape, dtype=dtype, grid=grid, split=(None, None, 0), halo=halo)
            x.local[...] = COMM.rank + 1
            h = x.halo_exchange("zero")
            bare, nbytes = bare_sendrecv(h.plan, x.dtype.itemsize)
            fns = {"ours": h.exchange, "bare": bare, "pack": bare_pack_sendrecv(h.plan, x.buffer)}
            t = compare(fns, args.reps, args.warmup)
            nbytes = COMM.allreduce(nbytes, op=MPI.MAX)
            if COMM.rank == 0:
                print(f"halo {dtype} shape={shape} split_axis=2 (strided faces) w={w}: "
                      f"sent/rank={nbytes / MIB:.2f} MiB  ours={t['ours'] * 1e3:.3f} ms  "
                      f"bare_sendrecv={t['bare'] * 1e3:.3f} ms  "
                      f"ratio={t['ours'] / t['bare']:.2f}  [bare_pack+sendrecv+unpack="
                      f"{t['pack'] * 1e3:.3f} ms, ours/that={t['ours'] / t['pack']:.2f}]",
                      flush=True)
                record("halo", f"{dtype} {shape} strided faces w={w}", "ratio_vs_sendrecv",
                       t["ours"] / t["bare"], "x", better="lower", ranks=COMM.size)
                record("halo", f"{dtype} {shape} strided faces w={w}", "ratio_vs_pack_sendrecv",
                       t["ours"] / t["pack"], "x", better="lower", ranks=COMM.size)
            h.free()
            del x, h


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faces", default="4,32,256,2048",
                    help="contiguous face sizes in KiB, comma-separated")
    ap.add_argument("--mib", type=int, default=64, help="strided cases: global size in MiB")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer reps, 16 MiB strided arrays")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.mib = min(args.reps, 10), min(args.mib, 16)
    args.faces = [int(f) for f in args.faces.split(",")]
    grid = dt.ProcessGrid((COMM.size,))
    if COMM.rank == 0:
        print(f"# halo_bench: {COMM.size} ranks, median of {args.reps} reps (contiguous faces: "
              f"{5 * args.reps}) after {args.warmup} warm-up, times = slowest rank; ratio = "
              "ours/bare", flush=True)
    contiguous_cases(args, grid)
    strided_cases(args, grid)
    grid.free()


if __name__ == "__main__":
    main()
