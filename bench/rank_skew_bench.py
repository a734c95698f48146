"""Rank skew in a 2-rank training step: how long each rank waits for the other, where the
difference between the ranks arises, and whether the ranks run the same convolution plans.

    mpiexec -n 2 python -m mpi4py bench/rank_skew_bench.py [--size 32] [--steps 20]

CosmoFlow (widths ``--widths``, default 16,32,64,128, dense 64 -> 32 -> 4, batch 4, Adam: the
step of ``step_scaling_bench.py``) on the depth split ``(1, 2, 1, 1)`` and the sample split
``(2, 1, 1, 1)``.  Both run ``--warmup`` steps interleaved (with ``--one-rank``, the default,
rank 0 also runs the 1-rank step between them, as ``step_scaling_bench.py`` does), on a fresh
convolution plan cache shared by the ranks (a temporary directory; ``--keep-cache`` uses the
configured one), so the online tuner settles in this run.  Then, per split:

* **plans**: every convolution layer-pass's plan (algorithm and micro-batches) on each rank;
  ``plans_differing`` counts the layer-passes whose ranks run different plans;
* per rank and step, ``--steps`` steps under :func:`disttensor.profile` with CPU time, ``--reps``
  times interleaved: the wall time inside the step's synchronising calls (agreement and
  collective all-reduces: ``sync``), and the CPU time of the work outside them (``work``);
  ``work_imbalance`` = max / mean of ``work`` over the ranks (the systematic skew: one rank's
  kernels doing more or running slower);
* **where the skew arises**: the ranks' synchronising calls are matched in order (the same
  sequence on both ranks); the change of the difference of the ranks' arrival times between
  two of them is the skew the ops between them generated, summed per op (the op running
  when rank 0 arrives), separately for "rank 0 slower" and "rank 1 slower".  Skew that
  alternates (noise, other jobs taking a core) shows in both columns; a systematic one in
  one.  ``skew_ms``: the sum of both columns per step; ``sync_calls_own_ms``: what the
  synchronising calls cost by themselves (the later rank's time inside each), so that per
  rank ``sync`` is about its calls' own time plus the skew it waited for.

Figures go to ``$DISTTENSOR_BENCH_CSV`` (bench ``rank_skew``); the ranks' clocks are the
node's monotonic clock (both ranks on one node).
"""
from __future__ import annotations

import argparse
import bisect
import collections
import os
import shutil
import statistics
import sys
import tempfile

for _v in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import spin_before_sleep  # noqa: E402

SPIN_NS = spin_before_sleep()

from mpi4py import MPI  # noqa: E402

from _results import record  # noqa: E402
from step_scaling_bench import ours  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor.ops.local.microbatch import cpu_entry  # noqa: E402

COMM = MPI.COMM_WORLD
SPLITS = {"spatial": (1, 2, 1, 1), "samples": (2, 1, 1, 1)}
SYNC = ("agreement", "collective")


def plans_now() -> dict:
    """This rank's settled convolution plans: ``{(pass, batch, channels in, channels out,
    spatial rank): micro-batches}`` (the key leaves out extents and pads, which differ
    between the blocks of a depth split)."""
    out = {}
    for key, (plan, _) in cpu_entry._memo.items():
        pass_, x_shape, w_shape = key[:3]
        out[(pass_, x_shape[0], x_shape[1], w_shape[0], x_shape[2:])] = plan.micro_batches
    return out


def differing(plans_by_rank, split: str, batch: int) -> tuple[int, int, list]:
    """``(differing, compared, the differing ones)`` over the layer-passes of ``split``: the
    sample split's blocks hold ``batch // 2`` samples, the depth split's ``batch`` samples
    with a thinner depth than height (the 1-rank step's blocks are cubic); the ranks' keys
    are matched by pass, batch and channels (the depth split's extents and pads differ)."""
    def ours_(k):
        return k[1] == batch // 2 if split == "samples" else (
            k[1] == batch and k[4][0] != k[4][1])
    mine = [{k[:4]: v for k, v in p.items() if ours_(k)} for p in plans_by_rank]
    common = set(mine[0]).intersection(*mine[1:])
    diff = [(k, [m[k] for m in mine]) for k in sorted(common)
            if any(m[k] != mine[0][k] for m in mine)]
    return len(diff), len(common), diff


def profiled(step, grid, steps: int):
    """Profile ``steps`` steps: this rank's synchronising calls ``[(arrive, leave)]``, its
    ops ``[(label, t0, t1)]`` and ``(sync wall ms, work CPU ms)`` per step."""
    COMM.Barrier()
    with dt.profile(grid, cpu_time=True) as p:
        for _ in range(steps):
            step()
            p.step()
    syncs, end = [], -1
    for r in sorted((r for r in p.regions if r[0] in SYNC), key=lambda r: r[2]):
        if r[2] >= end:   # outermost only
            syncs.append((r[2], r[3]))
            end = r[3]
    marks = [m[0] for m in p.step_marks]
    ops, occ, cur = [], collections.Counter(), 0
    work = 0
    for name, pass_, t0, t1, _, cpu, cpu_cats in p.ops:
        s = bisect.bisect_left(marks, t1)
        if s != cur:
            occ.clear()
            cur = s
        occ[(name, pass_)] += 1
        ops.append((f"{name}/{pass_}#{occ[(name, pass_)]}", t0, t1))
        work += cpu - sum(cpu_cats.get(c, 0) for c in SYNC + ("p2p wait",))
    sync_ms = sum(b - a for a, b in syncs) / 1e6 / steps
    return syncs, ops, (sync_ms, work / 1e6 / steps)


def attribute(s0, s1, ops0, steps: int):
    """Per op label: [ms per step rank 0 was slower, ms rank 1 was slower, 0] (see the
    module); label ``(the calls themselves)``: [0, 0, the synchronising calls' own time per
    step: the later rank's time inside each]."""
    starts = [o[1] for o in ops0]
    gen = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    prev = 0.0
    for (a0, e0), (a1, e1) in zip(s0, s1):
        gen["(the calls themselves)"][2] += min(e0 - a0, e1 - a1) / 1e6 / steps
        d = (a0 - a1) / 1e6 - prev
        prev = (e0 - e1) / 1e6
        i = bisect.bisect_right(starts, a0) - 1
        label = ops0[i][0] if i >= 0 else "(before the first op)"
        gen[label][0 if d > 0 else 1] += abs(d) / steps
    return gen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--widths", default="16,32,64,128")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--top", type=int, default=6, help="ops listed per split")
    ap.add_argument("--no-one-rank", dest="one_rank", action="store_false")
    ap.add_argument("--keep-cache", action="store_true")
    args = ap.parse_args()
    if COMM.size != 2:
        raise SystemExit("rank_skew_bench runs on exactly 2 ranks")
    tmp = None
    if not args.keep_cache:
        tmp = COMM.bcast(tempfile.mkdtemp(prefix="rank-skew-") if COMM.rank == 0 else None)
        os.environ["DISTTENSOR_CACHE_DIR"] = tmp
    widths = tuple(int(v) for v in args.widths.split(","))
    grids = {k: dt.ProcessGrid(d, comm=COMM) for k, d in SPLITS.items()}
    steps = {k: ours("cosmoflow", args.size, widths, g, args.batch) for k, g in grids.items()}
    one = None
    if args.one_rank and COMM.rank == 0:
        one = ours("cosmoflow", args.size, widths,
                   dt.ProcessGrid((1, 1, 1, 1), comm=MPI.COMM_SELF), args.batch)
    try:
        for _ in range(args.warmup):
            if one is not None:
                one()
            for f in steps.values():
                f()
        plans = COMM.gather(plans_now(), root=0)
        per = {k: {"sync": [], "work": [], "gen": []} for k in SPLITS}
        for _ in range(args.reps):
            for k in SPLITS:
                s, o, figs = profiled(steps[k], grids[k], args.steps)
                got = COMM.gather((s, o, figs), root=0)
                if COMM.rank == 0:
                    (s0, o0, f0), (s1, _, f1) = got
                    if len(s0) != len(s1):
                        raise RuntimeError(f"{k}: the ranks made {len(s0)} and {len(s1)} "
                                           "synchronising calls")
                    per[k]["sync"].append((f0[0], f1[0]))
                    per[k]["work"].append((f0[1], f1[1]))
                    per[k]["gen"].append(attribute(s0, s1, o0, args.steps))
    finally:
        COMM.Barrier()
        if tmp is not None and COMM.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
    if COMM.rank:
        return
    label = f"cosmoflow {args.size}^3 widths {args.widths} batch {args.batch}"
    print(f"# rank_skew_bench: {label}, {args.warmup} warm-up, {args.reps} x {args.steps} "
          f"profiled steps; load {os.getloadavg()[0]:.2f}", flush=True)
    for k in SPLITS:
        nd, nc, diff = differing(plans, k, args.batch)
        sync = [statistics.median(v[r] for v in per[k]["sync"]) for r in (0, 1)]
        work = [statistics.median(v[r] for v in per[k]["work"]) for r in (0, 1)]
        imb = statistics.median(max(v) / (sum(v) / 2) for v in per[k]["work"])
        gen = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
        for g in per[k]["gen"]:
            for lab, v in g.items():
                for j in range(3):
                    gen[lab][j] += v[j] / args.reps
        own = gen.pop("(the calls themselves)", [0, 0, 0])[2]
        skew = [sum(v[0] for v in gen.values()), sum(v[1] for v in gen.values())]
        print(f"{k}: plans differing {nd} of {nc} layer-passes; per step: sync r0 "
              f"{sync[0]:.2f} r1 {sync[1]:.2f} ms, work CPU r0 {work[0]:.2f} r1 {work[1]:.2f} "
              f"ms (imbalance {imb:.3f}); the calls themselves {own:.2f} ms; skew r0 slower "
              f"{skew[0]:.2f}, r1 slower {skew[1]:.2f} ms", flush=True)
        for key, ranks in diff:
            print(f"    differs: {key}: {ranks}")
        for lab, (a, b, _) in sorted(gen.items(), key=lambda kv: -sum(kv[1]))[:args.top]:
            print(f"    {lab:28s} r0 slower {a:6.3f}  r1 slower {b:6.3f} ms/step")
        case = f"{label}: {k}"
        record("rank_skew", case, "plans_differing", nd, "layer-passes", better="lower",
               ranks=2)
        record("rank_skew", case, "sync_ms_per_rank", max(sync), "ms", better="lower",
               ranks=2)
        record("rank_skew", case, "work_imbalance", imb, "max/mean", better="lower", ranks=2)
        record("rank_skew", case, "skew_ms", sum(skew), "ms", better="lower", ranks=2)
        record("rank_skew", case, "sync_calls_own_ms", own, "ms", better="lower", ranks=2)


if __name__ == "__main__":
    main()
