"""Where a 2-rank training step's time goes: the step profiler (``dt.profile``) on a CosmoFlow
step on 1 rank, on 2 ranks splitting the depth (grid 1x2x1x1, "spatial") and on 2 ranks
splitting the samples (2x1x1x1, "samples"), in one run.

    mpiexec -n 2 python -m mpi4py bench/profile_bench.py [--size 32] [--widths 16,32,64,128]
        [--batch 4] [--steps 3] [--reps 3]

(with ``n`` ranks the grids are 1xnx1x1 and nx1x1x1.)  Run with one thread per rank (set here
if unset) and the idle-sleep MPI preload (``build/libmpi_idle_sleep.so``), so that a wait
longer than 2 ms costs almost no CPU: where ranks do not outnumber cores this script gives the
shim a 2 ms spin budget (``_timing.spin_before_sleep``), so that shorter waits end when the
partner arrives rather than in a ~55 us sleep (their polling is the waits' CPU below).

Each repetition runs every case in a rotating order (``bench/_timing`` style), each case
``--steps`` steps unprofiled (the wall time of the slowest rank and the CPU time summed over
the ranks) and then ``--steps`` steps profiled with wall and CPU time per category.  The
figures are medians over the repetitions:

* per case and category (``python``: inside ops; ``outside``: between them, the loop's own
  Python), milliseconds per step summed over the ranks, wall clock and CPU
  time (the CPU time of a category is the work it costs; its wall time adds what the rank
  waited, for a message, for the other rank, or for a core on a loaded machine);
* ``efficiency`` = t(1) / (n t(n)) of the unprofiled steps (wall), and ``cpu_efficiency`` =
  CPU(1) / CPU(n) summed over ranks: the work the distribution adds, insensitive to other
  jobs on the cores;
* ``points lost`` per category: (sum over the n ranks of the category - the 1-rank
  category) / (sum over the ranks of the step), in points of efficiency; they add up to
  ``1 - efficiency`` (wall) and ``1 - cpu_efficiency`` (CPU) of the profiled steps;
* ``work_efficiency``: the same for the CPU time outside MPI waits (the point-to-point,
  collective and agreement all-reduce waits, whose CPU is the MPI library polling while a
  rank waits for another): the work the distribution adds, with none of the waiting;
* per op and pass, the kernel and the whole op's CPU time summed over the ranks against one
  rank's (``kernel_cpu_ratio_*``: what thinner blocks cost the kernels);
* the agreement split into hashing the arguments (``digest``), the status all-reduce's MPI
  wait (``mpi``) and the Python around it;
* ``profiled_over_plain``: a profiled step's wall time over an unprofiled one (the cost of
  profiling with CPU times: four clock reads per region).

Figures go to ``$DISTTENSOR_BENCH_CSV`` (bench ``profile``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

for _v in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_v, "1")
# the steady step is measured: convolutions are tuned apart in the warm-up (on their proxy),
# not online over the first timed steps (DISTTENSOR_CONV_TUNE_ONLINE, docs/performance.md)
os.environ.setdefault("DISTTENSOR_CONV_TUNE_ONLINE", "off")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import spin_before_sleep  # noqa: E402

# before MPI starts: waits poll for up to 2 ms before the idle-sleep shim sleeps, where ranks
# do not outnumber cores (bench/_timing.spin_before_sleep, bench/README.md "MPI waits")
SPIN_NS = spin_before_sleep()

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor import nn  # noqa: E402
from disttensor.autograd import Tensor  # noqa: E402
from disttensor.core.profile_report import CATEGORIES, OUTSIDE  # noqa: E402
from disttensor.nn import functional as F  # noqa: E402

COMM = MPI.COMM_WORLD


def make_case(args, dims, comm):
    """A training step of CosmoFlow on ``dims`` over ``comm`` (``None``: not a member)."""
    if comm is None:
        return None
    grid = dt.ProcessGrid(dims, comm=comm)
    s, widths = args.size, tuple(int(v) for v in args.widths.split(","))
    m = nn.models.cosmoflow(input_size=s, in_channels=4, widths=widths, dense=(128, 64),
                            outputs=4, rng=np.random.default_rng(0))
    net = nn.DistributedDataParallel(m, grid)
    opt = nn.optim.Adam(m.parameters(), lr=1e-4)
    rng = np.random.default_rng(2)
    x = dt.from_global(rng.standard_normal((args.batch, 4, s, s, s)).astype(np.float32),
                       grid=grid, split=(0, None, 1, 2, 3))
    y = dt.from_global(rng.uniform(-1, 1, (args.batch, 4)).astype(np.float32), grid=grid,
                       split=(0, None))

    def step():
        opt.zero_grad()
        F.mse_loss(net(Tensor(x)), Tensor(y)).backward()
        opt.step()
    return grid, step


def run_case(case, steps):
    """(wall of the slowest rank, CPU summed over ranks) per plain step, then the profiled
    steps' per-category sums over the ranks, wall and CPU (ms per step).  Collective over
    COMM_WORLD (non-members wait)."""
    COMM.Barrier()
    c0, t0 = time.thread_time(), time.perf_counter()
    if case is not None:
        for _ in range(steps):
            case[1]()
    wall = COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX) / steps
    cpu = COMM.allreduce(time.thread_time() - c0 if case is not None else 0.0,
                         op=MPI.SUM) / steps
    COMM.Barrier()
    tables = None
    t0 = time.perf_counter()
    if case is not None:
        with dt.profile(case[0], cpu_time=True) as prof:
            for _ in range(steps):
                case[1]()
                prof.step()
        tables = (prof.local_table("wall"), prof.local_table("cpu"), _by_label(prof))
    pwall = COMM.allreduce(time.perf_counter() - t0 if case is not None else 0.0,
                           op=MPI.MAX) / steps
    every = [t for t in COMM.allgather(tables) if t is not None]
    sums = {}
    for clock, k in (("wall", 0), ("cpu", 1)):
        for c in CATEGORIES:
            sums[(clock, c)] = sum(sum(row[c] for key, row in t[k]["rows"].items()
                                       if key != OUTSIDE) / t[k]["steps"] / 1e6
                                   for t in every)
        sums[(clock, "step")] = sum(t[k]["span"] / t[k]["steps"] / 1e6 for t in every)
        sums[(clock, "outside")] = sum(t[k]["rows"][OUTSIDE]["total"] / t[k]["steps"] / 1e6
                                       for t in every)
        for key in every[0][k]["rows"]:  # per op and pass: total and kernel
            if key == OUTSIDE:
                continue
            for f in ("total", "kernel"):
                sums[(clock, key, f)] = sum(t[k]["rows"][key][f] / t[k]["steps"] / 1e6
                                            for t in every if key in t[k]["rows"])
    for part in ("digest", "mpi", "rest"):
        for ci, clock in ((0, "wall"), (1, "cpu")):
            sums[(clock, "agreement " + part)] = sum(t[2][part][ci] / t[0]["steps"] / 1e6
                                                     for t in every)
    return wall, cpu, pwall, sums, (prof if case is not None else None)


def _by_label(prof) -> dict:
    """The agreement's exclusive time split: ``digest`` (hashing the arguments), ``mpi``
    (the status all-reduce's MPI wait) and ``rest`` (the Python around it): (wall, CPU) ns."""
    out = {"digest": [0, 0], "mpi": [0, 0], "rest": [0, 0]}
    end = prof.step_marks[-1][0]
    for cat, label, t0, t1, excl, _d, cpu in prof.regions:
        if cat != "agreement" or t1 > end:
            continue
        part = ("digest" if label.startswith("agree ") else
                "mpi" if label.startswith("MPI_") else "rest")
        out[part][0] += excl
        out[part][1] += cpu
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--widths", default="16,32,64,128")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--summaries", action="store_true", help="print each case's profile "
                    "tables (last repetition)")
    args = ap.parse_args()
    n = COMM.size
    if n < 2 or args.batch % n:
        raise SystemExit(f"run on 2 or more ranks that divide --batch {args.batch}")
    self_comm = MPI.COMM_SELF if COMM.rank == 0 else None
    cases = {"1 rank": make_case(args, (1, 1, 1, 1), self_comm),
             f"spatial 1x{n}x1x1": make_case(args, (1, n, 1, 1), COMM),
             f"samples {n}x1x1x1": make_case(args, (n, 1, 1, 1), COMM)}
    names = list(cases)
    for name in names:  # warm-up: kernels compiled, exchanges and buffers set up
        run_case(cases[name], 2)
    res = {k: [] for k in names}
    last = {}
    for rep in range(args.reps):
        for name in names[rep % 3:] + names[:rep % 3]:
            *figs, prof = run_case(cases[name], args.steps)
            res[name].append(figs)
            if args.summaries and prof is not None:
                last[name] = prof
    med = {}
    for name in names:
        rows = res[name]
        med[name] = {"wall": statistics.median(r[0] for r in rows) * 1e3,
                     "cpu": statistics.median(r[1] for r in rows) * 1e3,
                     "pwall": statistics.median(r[2] for r in rows) * 1e3,
                     **{key: statistics.median(r[3][key] for r in rows)
                        for key in rows[0][3]}}
    if args.summaries:
        for name in names:
            prof = last.get(name)
            # every member of the case's communicator prints through the profile
            for clock in ("wall", "cpu"):
                text = prof.summary(clock=clock) if prof is not None else None
                if COMM.rank == 0 and text:
                    print(f"\n== {name}, {clock}\n{text}")
    if COMM.rank != 0:
        return
    ws = tuple(int(v) for v in args.widths.split(","))
    what = (f"CosmoFlow {args.size}^3 widths {ws} batch {args.batch} Adam, {n} ranks, "
            f"{args.steps} steps x {args.reps} reps, medians")
    print(what)
    head = f"{'case':<20}{'plain wall':>11}{'plain CPU':>11}  " + "".join(
        f"{c:>11}" for c in CATEGORIES + ("outside",)) + f"{'step':>10}"
    for clock in ("wall", "cpu"):
        print(f"\nms per step summed over the ranks, profiled steps, {clock} clock")
        print(head)
        for name in names:
            m = med[name]
            print(f"{name:<20}{m['wall']:>11.2f}{m['cpu']:>11.2f}  " + "".join(
                f"{m[(clock, c)]:>11.2f}" for c in CATEGORIES + ("outside",))
                + f"{m[(clock, 'step')]:>10.2f}")
    one = med["1 rank"]
    base = one[("cpu", "step")]
    for name in names[1:]:
        m = med[name]
        case = f"cosmoflow {args.size}^3 w{args.widths} b{args.batch} {name}"
        eff = one["wall"] / (n * m["wall"])
        ceff = one["cpu"] / m["cpu"]
        print(f"\n{name}: efficiency {eff:.2f} (wall), cpu_efficiency {ceff:.2f}; "
              f"profiled/plain step {m['pwall'] / m['wall']:.2f}")
        record("profile", case, "efficiency", eff, "fraction", ranks=n)
        record("profile", case, "cpu_efficiency", ceff, "fraction", ranks=n)
        record("profile", case, "profiled_over_plain", m["pwall"] / m["wall"], "x",
               better="lower", ranks=n)
        for clock in ("wall", "cpu"):
            total = m[(clock, "step")]
            parts = []
            for c in CATEGORIES + ("outside",):
                mine, ref = m[(clock, c)], one[(clock, c)]
                pts = 100 * (mine - ref) / total
                ratio = mine / ref if ref > 1e-6 else float("nan")
                parts.append(f"{c} {pts:+.1f} ({ratio:.2f}x)")
                record("profile", case, f"points_lost_{clock}_{c.replace(' ', '_')}", pts,
                       "points", better="lower", ranks=n)
            lost = 100 * (total - one[(clock, "step")]) / total
            print(f"  {clock}: {lost:.1f} points lost = " + ", ".join(parts))
        print(f"  CPU work of the {n} ranks over the 1-rank step: "
              f"{m[('cpu', 'step')] / base:.2f}x")

        def work(r):  # CPU outside MPI waits (the idle-sleep MPI still polls while waiting)
            return (r[("cpu", "step")] - r[("cpu", "p2p wait")] - r[("cpu", "collective")]
                    - r[("cpu", "agreement mpi")])
        weff = work(one) / work(m)
        print(f"  CPU outside MPI waits: 1 rank {work(one):.2f} ms, {n} ranks {work(m):.2f} ms: "
              f"work_efficiency {weff:.2f}")
        record("profile", case, "work_efficiency", weff, "fraction", ranks=n)
        print("  agreement, CPU ms per step summed over the ranks: " + ", ".join(
            f"{part} {m[('cpu', 'agreement ' + part)]:.2f}" for part in ("digest", "mpi",
                                                                          "rest"))
              + "; wall: " + ", ".join(f"{part} {m[('wall', 'agreement ' + part)]:.2f}"
                                       for part in ("digest", "mpi", "rest")))
        print(f"  per op, CPU summed over the ranks / 1 rank (kernel; total):")
        for key in [k for k in m if len(k) == 3 and k[0] == "cpu" and k[2] == "total"]:
            op = key[1]
            k1, t1 = one.get(("cpu", op, "kernel"), 0), one.get(("cpu", op, "total"), 0)
            kn, tn = m[("cpu", op, "kernel")], m[("cpu", op, "total")]
            if t1 < 0.02 * base:
                continue  # small ops
            kr = f"{kn / k1:.2f}x" if k1 > 1e-6 else "-"
            print(f"    {op[0]:>12} {op[1]:<9} kernel {k1:7.2f} -> {kn:7.2f} ms ({kr}); "
                  f"total {t1:7.2f} -> {tn:7.2f} ms ({tn / t1:.2f}x)")
            if k1 > 1e-6:
                record("profile", case, f"kernel_cpu_ratio_{op[0]}_{op[1]}", kn / k1, "x",
                       better="lower", ranks=n)


if __name__ == "__main__":
    main()
