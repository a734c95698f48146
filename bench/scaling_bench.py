"""Strong scaling of the distributed conv3d forward + backward (and of a small CosmoFlow
training step) on 1..N ranks, overlap on and off, in one process run.

    mpiexec -n 2 python -m mpi4py bench/scaling_bench.py [--size 64] [--quick]
    mpiexec -n 4 python -m mpi4py bench/scaling_bench.py --quick

Run it with one thread per rank (``NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
OMP_NUM_THREADS=1``, set here if unset) so that the figures are about ranks, not threads,
and on a machine with an MPI that does not busy-poll (the repository's
``build/libmpi_idle_sleep.so`` preload, its default: no spin budget here, 3-4 ranks share 2
cores): ranks that sit out a case wait asleep outside MPI (``_timing.quiet_wait``).
The conv cases run twice: with one fixed local kernel (``DISTTENSOR_CONV_TUNE=off``: the same
algorithm on every block, so the figure measures the distribution: halo copies, messages,
agreement, load balance; the 0.9 target is recorded on this one), then with the kernels as
configured (default ``benchmark``: the micro-batch planner times candidate algorithms on the
first use of each shape, in the warm-up).  The second is what a user gets, but 1 and k ranks
then run different algorithms chosen per block shape (and, on a loaded machine, per noise):
measured here, its 1-rank time varied 2x between runs and its "efficiency" from 0.43 to 1.19;
the ``heuristic`` cost models picked for a 32-plane block an algorithm 0.6x the time of the
64-plane one instead of 0.5x (an efficiency cap of ~0.83 by itself).

**conv**: conv3d ``--cin`` -> ``--cout`` (k=3, 'same', float32, batch ``--batch``) on a
``--size``^3 sample split along D; one step = ``conv_forward`` + ``conv_backward`` (data and
filter gradients, filter gradient all-reduced).  Cases: for every rank count ``k`` in
``--ranks`` (default 1, 2, 4, ... up to N, and N), the first ``k`` ranks on a grid over a
communicator of their own (``k = 1``: ``MPI.COMM_SELF`` on rank 0), with ``overlap=False``
(the CPU default: exchange, then compute) and, for ``k > 1``, ``overlap=True`` (interior
computed while the halo exchange is in flight).  All cases are interleaved rep by rep
(``bench/_timing.compare``); a case's time is the slowest rank's.  Figures:

* ``efficiency`` = t(1) / (k * t(k)), the parallel efficiency of strong scaling (1.0 =
  perfect); the issue's target is 0.9 on 2 ranks at 64^3;
* ``overlap_over_no_overlap`` = t(k, overlap) / t(k, no overlap) (< 1: overlap pays);
* ``cpu_efficiency`` = CPU time of the 1-rank step / CPU time of the k-rank step summed over
  its ranks: the work the distribution adds (halo copies, messages, agreement, kernels on
  thinner blocks), insensitive to other jobs sharing the cores, which the wall-clock figure
  is not (on a loaded 2-core machine the k-rank case waits for cores the 1-rank case does
  not need).  Waits in MPI cost little CPU with the idle-sleep preload.

**train** (skipped with ``--no-train``; smaller in ``--quick``): one CosmoFlow training step
(forward, MSE loss, backward, parameter-gradient all-reduce, SGD) through the ``nn`` API on a
``--train-size``^3 x 4 sample, grid ``(1, k, 1, 1)`` (depth split over k ranks) against the
same model on one rank, efficiency as above.

Figures go to ``$DISTTENSOR_BENCH_CSV`` through ``bench/_results.py`` (bench ``scaling``).
On a 2-core machine, more than 2 ranks are oversubscribed: their efficiency is at most 2/k.
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


import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402
from _timing import compare, wall_and_cpu  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor.ops import convolution as C  # noqa: E402

COMM = MPI.COMM_WORLD


def rank_counts(spec: str | None, n: int) -> list[int]:
    if spec:
        ks = sorted({int(k) for k in spec.split(",")})
    else:
        ks, k = [], 1
        while k < n:
            ks.append(k)
            k *= 2
        ks.append(n)
    if ks[0] != 1:
        ks = [1] + ks
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise SystemExit(f"--ranks {bad} outside 1..{n}")
    return ks


def sub_grids(ks: list[int], ndim: int, axis: int) -> dict:
    """k -> a ProcessGrid over the first k ranks (None on the others); k = 1 over COMM_SELF.
    Collective over COMM_WORLD (the splits)."""
    grids = {}
    for k in ks:
        if k == 1:
            comm = MPI.COMM_SELF if COMM.rank == 0 else None
        elif k == COMM.size:
            comm = COMM
        else:
            comm = COMM.Split(0 if COMM.rank < k else MPI.UNDEFINED, COMM.rank)
            comm = None if comm == MPI.COMM_NULL else comm
        dims = [1] * ndim
        dims[axis] = k
        grids[k] = None if comm is None else dt.ProcessGrid(tuple(dims), comm=comm)
    return grids


def member(fn):
    """A case's function on every rank: ``fn`` where it takes part, nothing elsewhere."""
    return fn if fn is not None else (lambda: None)


def with_tune(mode, fn):
    """``fn`` run with ``DISTTENSOR_CONV_TUNE=mode`` (``None``: as configured; the local
    kernels read the variable at each call)."""
    if mode is None:
        return fn
    def run():
        prev = os.environ.get("DISTTENSOR_CONV_TUNE")
        os.environ["DISTTENSOR_CONV_TUNE"] = mode
        try:
            fn()
        finally:
            if prev is None:
                os.environ.pop("DISTTENSOR_CONV_TUNE", None)
            else:
                os.environ["DISTTENSOR_CONV_TUNE"] = prev
    return run


def conv_cases(args, ks, tune=None) -> tuple[dict, str]:
    rng = np.random.default_rng(1)
    s = args.size
    x = rng.standard_normal((args.batch, args.cin, s, s, s)).astype(np.float32)
    w = (rng.standard_normal((args.cout, args.cin, 3, 3, 3))
         / np.sqrt(27 * args.cin)).astype(np.float32)
    grids = sub_grids(ks, 1, 0)   # a 1-D grid: tensor axis 2 (D) over grid axis 0
    cases = {}
    for k, grid in grids.items():
        if grid is None:
            for ov in (False, True) if k > 1 else (False,):
                cases[(k, ov)] = member(None)
            continue
        xa = dt.from_global(x, grid=grid, split=(None, None, 0, None, None))

        def step(xa=xa, ov=False):
            y, saved = C.conv_forward(xa, w, None, 1, "same", overlap=ov)
            C.conv_backward(saved, y)
        cases[(k, False)] = with_tune(tune, step)
        if k > 1:
            cases[(k, True)] = with_tune(tune, lambda step=step: step(ov=True))
    kern = "kernels as configured" if tune is None else f"DISTTENSOR_CONV_TUNE={tune}"
    return cases, (f"conv3d {args.cin}->{args.cout} k3 same float32 batch {args.batch} "
                   f"{s}^3 split D ({kern})")


def train_cases(args, ks) -> tuple[dict, str]:
    from disttensor import nn
    from disttensor.autograd import Tensor
    from disttensor.nn import functional as F
    s = args.train_size
    widths = tuple(int(v) for v in args.train_widths.split(","))
    rng = np.random.default_rng(2)
    xg = rng.standard_normal((args.batch, 4, s, s, s)).astype(np.float32)
    yg = rng.uniform(-1, 1, (args.batch, 4)).astype(np.float32)
    grids = sub_grids(ks, 4, 1)
    cases = {}
    for k, grid in grids.items():
        if grid is None:
            cases[(k, False)] = member(None)
            continue
        m = nn.models.cosmoflow(input_size=s, in_channels=4, widths=widths, dense=(32, 16),
                                outputs=4, rng=np.random.default_rng(0))
        net = nn.DistributedDataParallel(m, grid) if k > 1 else m
        opt = nn.optim.SGD(m.parameters(), lr=1e-4)
        x = dt.from_global(xg, grid=grid, split=(0, None, 1, 2, 3))
        y = dt.from_global(yg, grid=grid, split=(0, None))

        def step(net=net, opt=opt, x=x, y=y):
            loss = F.mse_loss(net(Tensor(x)), Tensor(y))
            opt.zero_grad()
            loss.backward()
            opt.step()
        cases[(k, False)] = step
    return cases, f"cosmoflow train step {s}^3 x 4 widths {widths} batch {args.batch} split D"


def run(name: str, cases: dict, case: str, args, ks) -> None:
    fns = {f"{k}{'/overlap' if ov else ''}": f for (k, ov), f in cases.items()}
    cpu = {key: [] for key in fns}  # CPU seconds summed over the ranks, beside the wall figure
    t = compare(fns, args.reps, args.warmup, timer=wall_and_cpu(fns, cpu))
    if COMM.rank:
        return
    c = {key: statistics.median(v) for key, v in cpu.items()}
    t1 = t["1"]
    print(f"{name}: {case}; 1 rank {t1 * 1e3:.1f} ms", flush=True)
    for k in ks[1:]:
        tk = t[f"{k}"]
        eff = t1 / (k * tk)
        ceff = c["1"] / c[f"{k}"]
        line = (f"  {k} ranks: {tk * 1e3:.1f} ms, speed-up {t1 / tk:.2f}x, parallel efficiency "
                f"{eff:.3f} (CPU-time efficiency {ceff:.3f})")
        # the CSV keeps only the job's own size: a sub-communicator of k ranks inside a
        # larger job shares the cores with the idle rest (bench/run_all.py runs each size)
        keep = k == COMM.size
        if keep:
            record("scaling", f"{name}: {case}", "cpu_efficiency", ceff, "fraction", ranks=k)
            target = 0.9 if (name == "conv" and k == 2 and args.size == 64
                             and "TUNE=off" in case) else None
            record("scaling", f"{name}: {case}", "efficiency", eff, "fraction", target=target,
                   ranks=k)
        if f"{k}/overlap" in t:
            to = t[f"{k}/overlap"]
            line += (f"; overlap on {to * 1e3:.1f} ms (efficiency {t1 / (k * to):.3f}), "
                     f"overlap/no-overlap {to / tk:.3f}")
            if keep:
                record("scaling", f"{name}: {case}", "overlap_over_no_overlap", to / tk, "x",
                       better="lower", ranks=k)
        print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cin", type=int, default=4)
    ap.add_argument("--cout", type=int, default=32)
    ap.add_argument("--ranks", default=None, help="rank counts, e.g. 1,2,4 (default: powers "
                    "of two up to N, and N)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-train", action="store_true", help="skip the CosmoFlow step")
    ap.add_argument("--fixed-only", action="store_true", help="conv with the fixed kernel "
                    "only (DISTTENSOR_CONV_TUNE=off), not also with the kernels as configured")
    ap.add_argument("--train-size", type=int, default=32)
    ap.add_argument("--train-widths", default="8,16,32,32")
    ap.add_argument("--quick", action="store_true", help="fewer reps, smaller training step "
                    "(<= 90 s at 2 and 4 ranks)")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.warmup = min(args.reps, 11), 1  # 5 reps moved the 2-rank figure by 0.2
        args.train_size = min(args.train_size, 32)
    ks = rank_counts(args.ranks, COMM.size)
    if COMM.rank == 0:
        print(f"# scaling_bench: {COMM.size} ranks, cases {ks}, median of {args.reps} reps "
              f"(after {args.warmup} warm-up), interleaved; threads numba="
              f"{os.environ.get('NUMBA_NUM_THREADS')} blas={os.environ.get('OPENBLAS_NUM_THREADS')}; "
              f"DISTTENSOR_CONV_TUNE={os.environ.get('DISTTENSOR_CONV_TUNE')}",
              flush=True)
    cases, case = conv_cases(args, ks, tune="off")
    run("conv", cases, case, args, ks)
    if not args.fixed_only:
        cases, case = conv_cases(args, ks)
        run("conv", cases, case, args, ks)
    if not args.no_train:
        cases, case = train_cases(args, ks)
        run("train", cases, case, args, ks)


if __name__ == "__main__":
    main()
