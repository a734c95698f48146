"""Pipeline benchmark: data parallelism vs pipeline stages vs pipeline groups (4 ranks).

For VGG3D (parameters in large dense layers) and CosmoFlow (small sizes), in the same run:

(a) data parallelism: ``DistributedDataParallel`` on a ``(4, 1, 1, 1)`` grid (the baseline);
(b) a pipeline of 4 stages x 1 group, grid ``(1, 4, 1, 1, 1)``;
(c) 2 groups x 2 stages, grid ``(2, 2, 1, 1, 1)``;

each a full training step (forward, backward, gradient sums, SGD with momentum) on the same
global batch.  Printed: samples/s and the ratio to (a); for the pipelines the measured bubble
(1 - busy / wall per rank, averaged), the measured stage balance (max / min over stages of the
stage's busy time, its slowest rank's), and the partitioner's predicted step time against the
measured one.  Pipelines use the partition of :func:`disttensor.nn.partition.partition_layers`
on profiles measured on this grid (:func:`~disttensor.nn.partition.profile_layers`); the
predicted per-stage balance of those partitions is printed too (the issue's target: stage
times within 15% of each other, as far as the layer granularity allows).

Four ranks oversubscribing a 2-core machine make absolute speeds meaningless and the ratios
only indicative (a pipeline's idle stages give their core to the busy ones, which a real
machine would not).

    mpiexec -n 4 python bench/pipeline_bench.py [--steps 3] [--batch 8] [--chunks 4]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))
from _results import record  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor import nn  # noqa: E402
from disttensor.autograd import Tensor  # noqa: E402
from disttensor.nn import functional as F  # noqa: E402
from disttensor.nn.partition import link_cost, partition_layers, profile_layers  # noqa: E402

COMM = MPI.COMM_WORLD
RANK = COMM.rank


def say(*a):
    if RANK == 0:
        print(*a, flush=True)


# -- models --------------------------------------------------------------------------------
def make_model(name: str, args):
    rng = np.random.default_rng(0)
    if name == "vgg3d":
        return nn.models.VGG3D(input_size=args.size, in_channels=2, widths=(8, 16, 32),
                               convs_per_stage=(1, 1, 2), dense=(args.dense, args.dense),
                               outputs=4, rng=rng)
    return nn.models.CosmoFlow(input_size=args.size, in_channels=2, widths=(8, 16, 32, 32),
                               dense=(64, 32), outputs=4, rng=rng)


def data(grid, args, n):
    """``(x, y)``: ``n`` samples ``(2, size^3)`` split over the sample axis, targets (n, 4)."""
    g = dt.random.default_rng(1)
    x = g.normal(shape=(n, 2) + (args.size,) * 3, dtype="float32", grid=grid,
                 split=(0, None, 1, 2, 3))
    y = g.uniform(-1, 1, shape=(n, 4), dtype="float32", grid=grid, split=(0, None))
    return x, y


def timed_steps(step, steps: int) -> list[float]:
    """Wall seconds of each of ``steps`` collective steps (the slowest rank's), after one
    untimed warm-up step."""
    step()
    out = []
    for _ in range(steps):
        COMM.Barrier()
        t0 = time.perf_counter()
        step()
        out.append(COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return out


# -- (a) data parallelism ------------------------------------------------------------------
def run_dp(name, args):
    grid = dt.ProcessGrid((COMM.size, 1, 1, 1))
    m = make_model(name, args)
    net = nn.DistributedDataParallel(m, grid)
    opt = nn.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
    x, y = data(grid, args, args.batch)

    def step():
        opt.zero_grad()
        loss = F.mse_loss(net(Tensor(x)), Tensor(y))
        loss.backward()
        opt.step()
    times = timed_steps(step, args.steps)
    net.reducer.release()
    return statistics.median(times)


# -- the profiler against a measured whole-model step, on one rank ------------------------
def profile_check(name, args):
    """Rank 0 alone (the others wait in a barrier, sleeping under the idle shim): the sum of
    the profiled layer times of one micro-batch vs a measured forward + backward of the
    whole model on it (median of 5).  Returns ``(sum, measured)`` seconds on rank 0."""
    out = None
    if RANK == 0:
        g = dt.ProcessGrid((1, 1, 1, 1), comm=MPI.COMM_SELF)
        m = make_model(name, args)
        x, y = data(g, args, args.batch // args.chunks)
        prof = profile_layers(nn.sequential_layers(m), x, repeats=5)

        def fb():
            m.zero_grad()
            out = m(Tensor(x, requires_grad=True))
            out.backward(dt.ones(out.shape, dtype=out.dtype, grid=g, split=(0, None)))
        fb()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fb()
            times.append(time.perf_counter() - t0)
        out = (sum(p.time_s for p in prof), statistics.median(times))
    COMM.Barrier()
    return out


# -- (b), (c) pipelines --------------------------------------------------------------------
def plan_for(name, args, groups, stages):
    """Profile the model on a micro-batch of the stage grid of a ``(groups, stages, 1, 1,
    1)`` grid (all stages profile at once, agreed over the whole grid) and partition it."""
    grid = dt.ProcessGrid((groups, stages, 1, 1, 1))
    axes = [0, 2, 3, 4]
    stage_grid = dt.ProcessGrid((groups, 1, 1, 1), comm=grid.sub_comm(axes))
    m = make_model(name, args)
    layers = nn.sequential_layers(m)
    micro = args.batch // args.chunks
    xs, _ = data(stage_grid, args, micro)
    prof = profile_layers(layers, xs, repeats=args.profile_repeats, comm=grid.cart)
    plan = partition_layers(prof, stages, args.chunks, schedule=args.schedule,
                            boundary_cost=link_cost())
    return grid, prof, plan


def run_pipeline(name, args, groups, stages):
    grid, prof, plan = plan_for(name, args, groups, stages)
    m = make_model(name, args)
    from disttensor.nn.pipeline import Pipeline
    pipe = Pipeline(m, grid, chunks=args.chunks, partition=list(plan.ranges),
                       schedule=args.schedule)
    opt = nn.optim.SGD(list(pipe.parameters()), lr=1e-3, momentum=0.9)
    x, y = data(pipe.stage_grid, args, args.batch)
    stats = []

    def step():
        opt.zero_grad()
        pipe.train_step(x, y, F.mse_loss)
        opt.step()
        stats.append(dict(pipe.last_stats))
    times = timed_steps(step, args.steps)
    stats = stats[1:]  # timed steps only
    busy = statistics.median(s["forward_s"] + s["backward_s"] for s in stats)
    bubble = statistics.median(s["bubble"] for s in stats)
    everyone = COMM.allgather((pipe.stage, busy, bubble))
    stage_busy = [max(b for s, b, _ in everyone if s == k) for k in range(stages)]
    pipe.release()
    return dict(step=statistics.median(times), plan=plan, prof=prof,
                bubble=statistics.mean(b for _, _, b in everyone),
                balance=max(stage_busy) / min(stage_busy) if min(stage_busy) > 0 else
                float("inf"), stage_busy=stage_busy)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="vgg3d,cosmoflow")
    ap.add_argument("--size", type=int, default=16, help="spatial extent of a sample")
    ap.add_argument("--dense", type=int, default=2048, help="VGG3D dense width")
    ap.add_argument("--batch", type=int, default=8, help="global batch")
    ap.add_argument("--chunks", type=int, default=4, help="micro-batches per step")
    ap.add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b"))
    ap.add_argument("--steps", type=int, default=8, help="timed steps per configuration")
    ap.add_argument("--profile-repeats", type=int, default=2)
    args = ap.parse_args()
    if COMM.size not in (2, 4):
        raise SystemExit("pipeline_bench.py runs on 4 ranks (mpiexec -n 4), or on 2 (DP vs "
                         "2 stages: no oversubscription on a 2-core machine)")
    cores = os.cpu_count()
    configs = [("(b) pipeline 1 x 4 stages:   ", 1, 4), ("(c) pipeline 2 groups x 2:   ", 2, 2)] \
        if COMM.size == 4 else [("(b) pipeline 1 x 2 stages:   ", 1, 2)]
    say(f"# pipeline bench: {COMM.size} ranks on {cores} cores"
        + (" (oversubscribed: absolute speeds meaningless, ratios only indicative)"
           if cores < COMM.size else "")
        + f"; global batch {args.batch}, {args.chunks} micro-batches, {args.schedule}, "
          f"samples {args.size}^3, {args.steps} timed steps (median)")
    for name in args.models.split(","):
        m = make_model(name, args)
        n_layers = len(nn.sequential_layers(m))
        dense = sum(p.data.size for mod in m.modules() if isinstance(mod, nn.Linear)
                    for p in mod.parameters())
        say(f"\n## {name}: {m.num_parameters() / 1e6:.2f} M parameters "
            f"({dense / m.num_parameters():.0%} in dense layers), {n_layers} layers")
        t0 = time.perf_counter()
        chk = profile_check(name, args)
        if chk:
            say(f"profiler check (rank 0 alone, one micro-batch): sum of layer times "
                f"{chk[0] * 1e3:.1f} ms vs measured forward+backward {chk[1] * 1e3:.1f} ms "
                f"(x{chk[0] / chk[1]:.2f})")
        dp = run_dp(name, args)
        say(f"(a) data parallel ({COMM.size},1,1,1):   {args.batch / dp:8.2f} samples/s  "
            f"step {dp * 1e3:8.1f} ms  (baseline)")
        for label, groups, stages in configs:
            r = run_pipeline(name, args, groups, stages)
            plan = r["plan"]
            say(f"{label}{args.batch / r['step']:8.2f} samples/s  step {r['step'] * 1e3:8.1f} ms"
                f"  x{dp / r['step']:.2f} vs DP; bubble measured {r['bubble']:.0%} "
                f"(model {plan.bubble_fraction:.0%}); stage balance measured "
                f"{r['balance']:.2f} (predicted {plan.balance:.2f}); predicted step "
                f"{plan.predicted_step_s * 1e3:.1f} ms = x{plan.predicted_step_s / r['step']:.2f}"
                f" of measured")
            case = f"{name} {groups}x{stages} {args.schedule} chunks {args.chunks}"
            record("pipeline", case, "dp_step_over_pipeline", dp / r["step"], "x",
                   ranks=COMM.size, rank=COMM.rank)
            record("pipeline", case, "predicted_over_measured", plan.predicted_step_s
                   / r["step"], "x", target=1.25, better="lower", ranks=COMM.size,
                   rank=COMM.rank)
            say("    partition " + " ".join(f"[{a},{b})" for a, b in plan.ranges)
                + "  stage busy ms " + " ".join(f"{b * 1e3:.1f}" for b in r["stage_busy"]))
            say("    " + plan.report().replace("\n", "\n    "))
            within = max(plan.stage_times) <= 1.15 * min(plan.stage_times)
            say(f"    predicted stage times within 15%: {'yes' if within else 'no'} "
                f"(max/min {plan.balance:.2f}; slowest single layer "
                f"{max(p.time_s for p in r['prof']) * 1e3:.1f} ms of "
                f"{sum(plan.stage_times) / len(plan.stage_times) * 1e3:.1f} ms mean stage)")
        say(f"   ({name} total {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
