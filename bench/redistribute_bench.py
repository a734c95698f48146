"""Redistribution vs a hand-written pack + MPI_Alltoallv + unpack of the same data (run: mpiexec -n 2 python bench/redistribute_bench.py).

Layouts (each on a 3-D array of about ``--mib`` MiB; float32 and float64):

* ``axis 0 -> 1`` and ``axis 0 -> 2`` on a 1-D grid over all ranks (split along axis 0,
  redistributed to split along axis 1 or 2: the slab transposes of an FFT);
* ``2-D transpose`` on a 2-D grid (``MPI.Compute_dims(N, 2)``, 4 ranks and more only):
  split ``(0, 1, None)`` -> ``(1, 0, None)`` (a pencil swap) and ``(0, 1, None)`` ->
  ``(None, 0, 1)``.

Three ways of doing the same redistribution, interleaved rep by rep (each rep starts after a
barrier; its time is the slowest rank's; medians over ``--reps`` after ``--warmup``):

* ``ours``: ``x.redistribute(split=...)`` (a new output array each call);
* ``hand``: the baseline: what a hand-written redistribution does with the plan's pieces:
  ``np.copyto`` every piece, the rank's own included, into one preallocated send buffer
  (peer by peer), one ``MPI_Alltoallv`` (the own piece goes to itself), ``np.copyto`` every
  received piece out of one preallocated receive buffer into a new output array (a fresh
  ``np.empty`` per call, as ``ours`` makes);
* ``bare``: the ``MPI_Alltoallv`` alone (no pack, no unpack: the network floor).

Printed: ms of each, ``ratio`` = ours/hand (the figure recorded as ``ratio_vs_alltoallv``,
target 1.3, lower is better), ours/bare, and in brackets ours into a preallocated output
(``redistribute_blocks(..., out=)``) against the baseline into a preallocated output.
``--quick``: 16 MiB arrays, fewer reps (<= 90 s at 2 and 4 ranks).  See bench/README.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import disttensor as dt  # noqa: E402
from _results import record  # noqa: E402
from _timing import compare  # noqa: E402
from disttensor.core.redistribute import plan as redistribution_plan  # noqa: E402
from disttensor.core.redistribute import redistribute_blocks  # noqa: E402

COMM = MPI.COMM_WORLD
MIB = 1 << 20


def _counts(plan, itemsize: int):
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
    return sc, sd, rc, rd


def bare_alltoallv(plan, itemsize: int):
    """One Alltoallv of contiguous byte buffers with the plan's per-peer counts (self included)."""
    sc, sd, rc, rd = _counts(plan, itemsize)
    sbuf = np.ones(sum(sc), dtype=np.uint8)
    rbuf = np.empty(sum(rc), dtype=np.uint8)

    def run():
        COMM.Alltoallv([sbuf, (sc, sd), MPI.BYTE], [rbuf, (rc, rd), MPI.BYTE])
    return run, sum(sc)


def hand_alltoallv(plan, src_local, out_shape, fresh: bool):
    """The hand-written baseline: pack every piece (own included) peer by peer into one send
    buffer, one Alltoallv, unpack peer by peer into the output (a new array per call when
    ``fresh``, else one preallocated)."""
    itemsize = src_local.dtype.itemsize
    sc, sd, rc, rd = _counts(plan, itemsize)
    rank, size = COMM.rank, COMM.size
    sbuf = np.empty(sum(sc) // itemsize, dtype=src_local.dtype)
    rbuf = np.empty(sum(rc) // itemsize, dtype=src_local.dtype)
    send = [[] for _ in range(size)]
    recv = [[] for _ in range(size)]
    for t in plan.sends:
        send[t.peer].append(t.box.slices())
    for t in plan.recvs:
        recv[t.peer].append(t.box.slices())
    for s, d in plan.local:
        send[rank].append(s.slices())
        recv[rank].append(d.slices())
    sends = [(sl, src_local[sl].shape) for p in range(size) for sl in send[p]]
    recvs = [sl for p in range(size) for sl in recv[p]]
    fixed = np.empty(out_shape, dtype=src_local.dtype)

    def run():
        o = 0
        for sl, shape in sends:
            n = int(np.prod(shape))
            np.copyto(sbuf[o:o + n].reshape(shape), src_local[sl])
            o += n
        COMM.Alltoallv([sbuf, (sc, sd), MPI.BYTE], [rbuf, (rc, rd), MPI.BYTE])
        out = np.empty(out_shape, dtype=src_local.dtype) if fresh else fixed
        o = 0
        for sl in recvs:
            v = out[sl]
            np.copyto(v, rbuf[o:o + v.size].reshape(v.shape))
            o += v.size
        return out
    return run


def layouts(nranks: int):
    """(name, grid dims, source split, destination split) of the cases."""
    out = [("axis 0 -> 1", (nranks,), (0, None, None), (None, 0, None)),
           ("axis 0 -> 2", (nranks,), (0, None, None), (None, None, 0))]
    if nranks >= 4:
        dims = tuple(MPI.Compute_dims(nranks, 2))
        out += [(f"2-D grid {dims} transpose (0,1,-) -> (1,0,-)", dims, (0, 1, None),
                 (1, 0, None)),
                (f"2-D grid {dims} (0,1,-) -> (-,0,1)", dims, (0, 1, None), (None, 0, 1))]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="global array size in MiB")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="16 MiB, 7 reps (<= 90 s)")
    args = ap.parse_args()
    if args.quick:
        args.mib, args.reps, args.warmup = min(args.mib, 16), min(args.reps, 7), 1
    if COMM.rank == 0:
        print(f"# redistribute_bench: {COMM.size} ranks, {args.mib} MiB arrays, median of "
              f"{args.reps} reps (after {args.warmup} warm-up), times = slowest rank; ratio = "
              "ours/hand (pack + Alltoallv + unpack); GB/s = global bytes / time", flush=True)
    grids = {}
    for dtype in ("float32", "float64"):
        n = args.mib * MIB // np.dtype(dtype).itemsize
        side = 256 if args.mib >= 64 else 128
        shape = (side, side, n // (side * side))
        for name, dims, ssplit, dsplit in layouts(COMM.size):
            grid = grids.get(dims)
            if grid is None:
                grid = grids[dims] = dt.ProcessGrid(dims)
            x = dt.zeros(shape, dtype=dtype, grid=grid, split=ssplit)
            x.local[...] = np.arange(x.local.size, dtype=dtype).reshape(x.local.shape) + COMM.rank
            dst = dt.Distribution(shape, grid.dims, dsplit)
            ours = lambda: x.redistribute(split=dsplit)  # noqa: E731
            y = ours()
            p = redistribution_plan(x.distribution, dst, COMM.rank)
            hand = hand_alltoallv(p, x.local, y.local.shape, fresh=True)
            hand_pre = hand_alltoallv(p, x.local, y.local.shape, fresh=False)
            ok = np.array_equal(y.local, hand()) and np.array_equal(y.to_numpy(), x.to_numpy())
            ok = COMM.allreduce(bool(ok), op=MPI.LAND)
            out = np.empty_like(y.local)
            prealloc = lambda: redistribute_blocks(grid.cart, x.local, x.distribution, dst,  # noqa: E731
                                                   out=out)
            bare, nbytes = bare_alltoallv(p, x.dtype.itemsize)
            del y
            t = compare({"ours": ours, "hand": hand, "bare": bare, "prealloc": prealloc,
                         "hand_pre": hand_pre}, args.reps, args.warmup)
            gbytes = x.nbytes / 1e9
            nbytes = COMM.allreduce(nbytes, op=MPI.MAX)
            if COMM.rank == 0:
                ratio = t["ours"] / t["hand"]
                print(f"redistribute {dtype} shape={shape} {name}: bytes/rank="
                      f"{nbytes / MIB:.1f} MiB  ours={t['ours'] * 1e3:.2f} ms "
                      f"({gbytes / t['ours']:.2f} GB/s)  hand={t['hand'] * 1e3:.2f} ms  "
                      f"bare_alltoallv={t['bare'] * 1e3:.2f} ms  ratio={ratio:.2f}  "
                      f"ours/bare={t['ours'] / t['bare']:.2f}  [preallocated out: ours="
                      f"{t['prealloc'] * 1e3:.2f} ms, hand={t['hand_pre'] * 1e3:.2f} ms, ratio="
                      f"{t['prealloc'] / t['hand_pre']:.2f}]"
                      + ("" if ok else "  WRONG RESULT"), flush=True)
                case = f"{dtype} {shape} {name}"
                record("redistribute", case, "ratio_vs_alltoallv", ratio, "x", target=1.3,
                       better="lower", ranks=COMM.size)
                record("redistribute", case + " preallocated out", "ratio_vs_alltoallv",
                       t["prealloc"] / t["hand_pre"], "x", target=1.3, better="lower",
                       ranks=COMM.size)
            del x
    for g in grids.values():
        g.free()


if __name__ == "__main__":
    main()
