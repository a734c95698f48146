"""Memory plans on CosmoFlow: tracked peak memory and step time vs keeping everything.

One rank, one training step (forward + backward of the MSE) of a CosmoFlow at ``--size``^3,
measured in the same run for: keep-all (the plain model), recompute-all (one checkpoint per
conv/LeakyReLU/pool stage, the head one more), and :func:`disttensor.nn.memory.plan_memory`'s
plans under budgets of 100%, 50% and 25% of the keep-all saved bytes (the profile's
unconstrained peak).  On CPU, offload only counts bytes (there is no device memory to
relieve), so the planner runs twice: recompute only (what the tracked peak can show) and with
offload at the assumed 12 GB/s (its predicted peak and added time are reported; its tracked
peak is that of its recompute part).  Tracked peak: ``tracemalloc`` (NumPy buffers); on a GPU
(``--device cuda``) the CuPy pool.  Step time: the least of ``--reps`` steps, the runs
interleaved.

    python -m mpi4py bench/memory_plan_bench.py [--size 32] [--widths 16,32,64] [--reps 3]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))
from _results import record  # noqa: E402
from _timing import wall  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor.autograd import Tensor
from disttensor.nn import functional as F
from disttensor.nn import sequential_layers
from disttensor.nn.memory import (MemoryPlan, apply_plan, measure_step_memory, min_peak,
                                  plan_memory, profile_memory)
from disttensor.nn.models import CosmoFlow


def fastest(fns: dict, reps: int) -> dict:
    """Least seconds of each function over ``reps`` interleaved calls (after one warm-up
    each): on a machine shared with other jobs the minimum is the steadiest figure."""
    for f in fns.values():
        f()
    best = {k: float("inf") for k in fns}
    keys = list(fns)
    for i in range(reps):
        for k in keys[i % len(keys):] + keys[:i % len(keys)]:
            best[k] = min(best[k], wall(fns[k]))
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--channels", type=int, default=4)
    ap.add_argument("--widths", default="16,32,64")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    widths = tuple(int(w) for w in args.widths.split(","))
    grid = dt.ProcessGrid((1, 1, 1, 1), comm=MPI.COMM_SELF)
    model = CosmoFlow(input_size=args.size, in_channels=args.channels, widths=widths,
                      dense=(64, 32), outputs=4, dtype=args.dtype, device=args.device,
                      rng=np.random.default_rng(0))
    layers = sequential_layers(model)
    n = len(layers)
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((args.batch, args.channels) + (args.size,) * 3).astype(args.dtype)
    ys = (rng.standard_normal((args.batch, 4)) * 0.5).astype(args.dtype)
    x = Tensor(dt.from_global(xs, grid=grid, split=(0, None, 1, 2, 3), device=args.device))
    y = Tensor(dt.from_global(ys, grid=grid, split=(0, None), device=args.device))

    def step(net):
        def run():
            F.mse_loss(net(x), y).backward()
            model.zero_grad()
        return run

    def peak_of(net):
        run = step(net)
        run()  # warm-up
        return measure_step_memory(run, args.device)

    step(model)()  # compile the kernels before profiling
    prof = profile_memory(layers, x, y, F.mse_loss, repeat=3)
    print(f"CosmoFlow {args.size}^3, {args.channels} channels, widths {widths}, batch "
          f"{args.batch}, {args.dtype}, {args.device}, {n} layers")
    print(prof.report())
    stages = [(3 * i, 3 * i + 3) for i in range(len(widths))] + [(3 * len(widths), n)]
    rows = [("keep-all", None, model),
            ("recompute-all", MemoryPlan(("recompute",) * n, segments=stages), None)]
    for allow_off in (False, True):
        least = min_peak(prof, allow_offload=allow_off)
        for frac in ((1.0, 0.5, 0.25) if not allow_off else (0.5, 0.25)):
            budget = int(frac * prof.keep_all_peak)
            tag = f"plan {frac:.0%}" + (" +offload" if allow_off else "")
            if budget < least:
                rows.append((tag, f"infeasible: the least budget is {least / 1e6:.2f} MB "
                                  f"({least / prof.keep_all_peak:.0%})", None))
                continue
            rows.append((tag, plan_memory(prof, budget, allow_offload=allow_off), None))
        if least < prof.keep_all_peak:
            rows.append((f"plan at least ({least / prof.keep_all_peak:.0%})"
                         + (" +offload" if allow_off else ""),
                         plan_memory(prof, least, allow_offload=allow_off), None))
    nets = {tag: (net if net is not None else apply_plan(layers, plan))
            for tag, plan, net in rows if not isinstance(plan, str)}
    times = fastest({tag: step(net) for tag, net in nets.items()}, args.reps)
    base_peak, base_time = peak_of(model), times["keep-all"]
    print(f"\n{'run':<28} {'tracked peak MB':>15} {'x keep':>7} {'step s':>8} {'x keep':>7} "
          f"{'model peak MB':>13} {'added ms':>9}  plan")
    for tag, plan, net in rows:
        if isinstance(plan, str):
            print(f"{tag:<28} {plan}")
            continue
        net = nets[tag]
        if net is not model:
            c = plan.counts()
            what = f"keep {c['keep']} offload {c['offload']} recompute {c['recompute']} " \
                   f"segments {plan.segments}"
        else:
            what = ""
        peak, t = (base_peak if net is model else peak_of(net)), times[tag]
        mp = f"{plan.peak / 1e6:13.3f}" if plan is not None and plan.peak is not None \
            else f"{prof.keep_all_peak / 1e6:13.3f}" if plan is None else f"{'':>13}"
        added = f"{plan.added_time * 1e3:9.2f}" if plan is not None and \
            plan.added_time is not None else f"{'':>9}"
        print(f"{tag:<28} {peak / 1e6:15.2f} {peak / base_peak:7.2f} {t:8.3f} "
              f"{t / base_time:7.2f} {mp} {added}  {what}")
        if net is not model:
            record("memory_plan", tag, "peak_vs_keep_all", peak / base_peak, "x",
                   better="lower", device="gpu" if args.device != "cpu" else "cpu")
            record("memory_plan", tag, "time_vs_keep_all", t / base_time, "x",
                   better="lower", device="gpu" if args.device != "cpu" else "cpu")
        if net is not model and "offload" in plan.choices:
            print(f"{'':<28} offload simulated: {net.offload_stats['simulated_bytes'] / 1e6:.2f}"
                  f" MB counted, {net.offload_stats['offloaded_bytes'] / 1e6:.2f} MB moved")


if __name__ == "__main__":
    main()
