"""Predicted vs measured training step time per grid (run under mpiexec -n 1, 2, 4).

A small CosmoFlow (default 32^3 x 4 input, widths 8,16,32, dense 32,16, global batch 4) is
planned with :func:`disttensor.nn.perfmodel.plan_grid` over every grid of the job's ranks
(all permutations of the spatial splits, so 2 ranks give four grids; one untimed step on
each grid first lets the convolution kernels tune, as a run would), then one training step
(forward, MSE, backward with the bucketed overlapped all-reduce of
``DistributedDataParallel``, Adam) is measured on each grid: the median of ``--reps``
interleaved steps, the slowest rank's time.  Printed per grid: predicted, measured, their
ratio; then the predicted and the measured rank orders; and the predicted saved activations
+ workspace per rank against the peak NumPy allocates during a step (tracemalloc).

The scaling simulator (``nn.perfmodel.simulate``) predicts the same grids from a machine
description measured here (:func:`~disttensor.nn.perfmodel.machine.measure_machine`: the
measured links, and layer throughputs fitted to the model's layers timed on each rank's
share of the batch at ``--calibrate-size``, by default ``--size``: the grids' blocks, halos,
links and the split of the work are the simulator's, only the rates are measured); printed
and recorded beside plan_grid's prediction as ``sim_predicted_over_measured`` and
``sim_ranking_correct``.

``ranking_correct`` is 1 when no pair of grids is ordered the other way round by the
measurement than by the prediction, beyond ``--tie`` (relative: measured times closer than
that are ties, the noise of this machine).  Also recorded: ``chosen_over_best``, the
measured step of the grid predicted fastest over the fastest measured (1: the planner chose
the best grid), and Kendall's tau of the two orders.  Targets: predicted/measured within
25%, correct ranking.  One rank has a single grid (ranking trivially correct).

    mpiexec -n 4 python -m mpi4py bench/perfmodel_bench.py [--quick] [--size 32]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc

import numpy as np
from mpi4py import MPI

# the steady step is measured: convolutions are tuned apart in the warm-up (on their proxy),
# not online over the first timed steps (DISTTENSOR_CONV_TUNE_ONLINE, docs/performance.md)
os.environ.setdefault("DISTTENSOR_CONV_TUNE_ONLINE", "off")
sys.path.insert(0, os.path.dirname(__file__))
from _results import record  # noqa: E402
from _timing import compare  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor import nn  # noqa: E402
from disttensor.autograd import Tensor  # noqa: E402
from disttensor.nn import functional as F  # noqa: E402
from disttensor.nn.perfmodel import enumerate_grids, plan_grid  # noqa: E402
from disttensor.nn.perfmodel.machine import measure_machine  # noqa: E402
from disttensor.nn.perfmodel.simulate import simulate_grid  # noqa: E402


def build(args, size=None):
    return nn.models.cosmoflow(input_size=size or args.size, in_channels=4, widths=args.widths,
                               dense=args.dense, outputs=4, rng=np.random.default_rng(0))


def stepper(dims, args):
    grid = dt.ProcessGrid(dims)
    m = build(args)
    net = nn.DistributedDataParallel(m, grid)
    opt = nn.optim.Adam(m.parameters(), lr=1e-4)
    g = dt.random.default_rng(1)
    x = g.normal(shape=(args.batch, 4) + (args.size,) * 3, dtype="float32", grid=grid,
                 split=(0, None, 1, 2, 3))
    y = g.uniform(-1, 1, shape=(args.batch, 4), dtype="float32", grid=grid, split=(0, None))

    def step():
        loss = F.mse_loss(net(Tensor(x)), Tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step, net


def peak_step_bytes(step, comm) -> int:
    """Peak bytes NumPy allocates during one more training step (tracemalloc; parameters,
    gradients, optimizer state and buckets exist already), the largest over ranks: the
    saved activations and workspace the model predicts."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    step()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return comm.allreduce(peak, op=MPI.MAX)


def ranking_correct(pred: list, meas: list, tie: float) -> bool:
    """No pair ordered one way by ``pred`` and the other way by ``meas`` by more than
    ``tie`` (relative)."""
    n = len(pred)
    for i in range(n):
        for j in range(n):
            if pred[i] < pred[j] and meas[i] > meas[j] * (1 + tie):
                return False
    return True


def kendall_tau(pred: list, meas: list) -> float:
    """Kendall's rank correlation of two lists (1: same order; 1 for fewer than 2)."""
    n = len(pred)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    if not pairs:
        return 1.0
    s = sum((pred[i] - pred[j]) * (meas[i] - meas[j]) > 0 for i, j in pairs)
    return (2 * s - len(pairs)) / len(pairs)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--widths", default="8,16,32")
    p.add_argument("--dense", default="32,16")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--tie", type=float, default=0.05,
                   help="measured times closer than this (relative) count as ties")
    p.add_argument("--calibrate-size", type=int, default=None,
                   help="sample size the simulator's machine rates are measured on "
                        "(default: --size)")
    p.add_argument("--quick", action="store_true", help="quick planning, at most 4 grids "
                   "measured, 5 repetitions (<= 90 s per rank count)")
    args = p.parse_args(argv)
    args.widths = tuple(int(w) for w in args.widths.split(","))
    args.dense = tuple(int(w) for w in args.dense.split(","))
    comm = MPI.COMM_WORLD
    n = comm.size
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(f"# CosmoFlow {args.size}^3 x 4, widths {args.widths}, dense {args.dense}, global "
        f"batch {args.batch}, {n} ranks{' (quick)' if args.quick else ''}")
    cands = enumerate_grids(n, args.batch, (args.size,) * 3, symmetric=False)
    # one step on every grid first: the convolution kernels tune their algorithms for these
    # local problems (cached), so planning and measuring run the same algorithms and neither
    # pays for tuning
    steps, nets = {}, []
    for g in cands:
        steps[g], net = stepper(g, args)
        nets.append(net)
        steps[g]()
    t0 = time.perf_counter()
    plan = plan_grid(build(args), (4,) + (args.size,) * 3, args.batch, comm=comm,
                     candidates=cands, quick=args.quick, tune_kernels=True,
                     repeats=None if args.quick else 7)
    t_plan = time.perf_counter() - t0
    say(f"planning took {t_plan:.1f} s")
    cs = args.calibrate_size or args.size
    machine = measure_machine(comm, nn.sequential_layers(build(args, cs)), (4,) + (cs,) * 3,
                              args.batch)
    cf, cb = (machine.peak_flops * e / 1e9 for e in machine.conv_efficiency)
    say(f"machine measured on {cs}^3: conv {cf:.1f} / {cb:.1f} GFLOP/s forward / "
        f"backward, memory-bound {machine.bandwidth / 1e9:.2f} GB/s + "
        f"{machine.host_op_s * 1e6:.0f} us per op and pass")
    layers = nn.sequential_layers(build(args))
    sim = {g: simulate_grid(layers, (4,) + (args.size,) * 3, args.batch, g, machine,
                            halo_overlap=False).step_s for g in cands}
    say(plan.report())
    ranked = plan.ranked
    if args.quick and len(ranked) > 4:  # best, worst and two between
        idx = sorted({round(k * (len(ranked) - 1) / 3) for k in range(4)})
        ranked = [ranked[k] for k in idx]
    reps = 5 if args.quick else args.reps
    steps = {pr.grid: steps[pr.grid] for pr in ranked}
    meas = compare(steps, reps, warmup=1)
    mem = {g: peak_step_bytes(step, comm) for g, step in steps.items()}
    for net in nets:
        net.reducer.release()
    say(f"{'grid':12s} {'predicted ms':>13s} {'measured ms':>12s} {'pred/meas':>10s} "
        f"{'simulated ms':>13s} {'sim/meas':>9s}   "
        f"activations+workspace MiB predicted / measured peak")
    for pr in ranked:
        m = meas[pr.grid]
        case = "x".join(map(str, pr.grid))
        pmem = pr.memory["activations"] + pr.memory["workspace"]
        say(f"{case:12s} {pr.step_s * 1e3:13.2f} {m * 1e3:12.2f} {pr.step_s / m:10.3f} "
            f"{sim[pr.grid] * 1e3:13.2f} {sim[pr.grid] / m:9.3f}   "
            f"{pmem / 2 ** 20:8.2f} / {mem[pr.grid] / 2 ** 20:8.2f}")
        record("perfmodel", case, "sim_predicted_over_measured", sim[pr.grid] / m, "x",
               ranks=n, rank=comm.rank)
        record("perfmodel", case, "sim_abs_error_fraction", abs(sim[pr.grid] / m - 1),
               "fraction", target=0.25, better="lower", ranks=n, rank=comm.rank)
        record("perfmodel", case, "memory_predicted_over_measured", pmem / mem[pr.grid], "x",
               ranks=n, rank=comm.rank)
        record("perfmodel", case, "predicted_s", pr.step_s, "s", better="lower", ranks=n,
               rank=comm.rank)
        record("perfmodel", case, "measured_s", m, "s", better="lower", ranks=n,
               rank=comm.rank)
        record("perfmodel", case, "predicted_over_measured", pr.step_s / m, "x", ranks=n,
               rank=comm.rank)
        record("perfmodel", case, "abs_error_fraction", abs(pr.step_s / m - 1), "fraction",
               target=0.25, better="lower", ranks=n, rank=comm.rank)
    pred_order = [pr.grid for pr in ranked]
    meas_order = sorted(pred_order, key=lambda g: meas[g])
    ok = ranking_correct([pr.step_s for pr in ranked], [meas[pr.grid] for pr in ranked],
                         args.tie)
    fmt = lambda gs: ", ".join("x".join(map(str, g)) for g in gs)  # noqa: E731
    say(f"predicted order: {fmt(pred_order)}")
    say(f"measured order:  {fmt(meas_order)}")
    worst = max(abs(pr.step_s / meas[pr.grid] - 1) for pr in ranked)
    sim_ok = ranking_correct([sim[pr.grid] for pr in ranked], [meas[pr.grid] for pr in ranked],
                             args.tie)
    sim_order = sorted(pred_order, key=lambda g: sim[g])
    say(f"simulated order: {fmt(sim_order)}; simulator ranking correct: {int(sim_ok)}; "
        f"largest |sim/meas - 1| {max(abs(sim[g] / meas[g] - 1) for g in pred_order):.3f}")
    record("perfmodel", f"cosmoflow {args.size}^3 batch {args.batch}", "sim_ranking_correct",
           float(sim_ok), "bool", target=1.0, better="higher", ranks=n, rank=comm.rank)
    regret = meas[pred_order[0]] / meas[meas_order[0]]
    tau = kendall_tau([pr.step_s for pr in ranked], [meas[pr.grid] for pr in ranked])
    say(f"ranking correct (ties within {args.tie:.0%}): {int(ok)}; Kendall tau {tau:.2f}; "
        f"the predicted best grid measured {regret:.3f}x the measured best; largest "
        f"|pred/meas - 1| {worst:.3f}")
    record("perfmodel", f"cosmoflow {args.size}^3 batch {args.batch}", "chosen_over_best",
           regret, "x", target=1.05, better="lower", ranks=n, rank=comm.rank)
    record("perfmodel", f"cosmoflow {args.size}^3 batch {args.batch}", "kendall_tau", tau,
           "", ranks=n, rank=comm.rank)
    record("perfmodel", f"cosmoflow {args.size}^3 batch {args.batch}", "ranking_correct",
           float(ok), "bool", target=1.0, better="higher", ranks=n, rank=comm.rank)
    record("perfmodel", f"cosmoflow {args.size}^3 batch {args.batch}", "planning_s", t_plan,
           "s", better="lower", ranks=n, rank=comm.rank)


if __name__ == "__main__":
    main()
