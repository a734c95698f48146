"""Micro-batched convolution (mu-cuDNN) vs the best single-shot algorithm under the same
workspace limit, per layer, pass and limit.

For each layer shape, pass (forward, backward data, backward filter) and workspace limit:

* one timing table of every (algorithm, micro-batch size) that fits the limit, sizes from the
  ``powerOfTwo`` policy (which includes the whole batch), measured on this run's data
  (:func:`disttensor.ops.local.microbatch.measure_times`);
* *undivided*: the fastest algorithm on the whole batch that fits (mu-cuDNN's baseline: what a
  framework does with cuDNN's own algorithm choice under a workspace limit); *micro-batched*:
  the dynamic program's division of the same table;
* both plans then run interleaved (``bench/_timing.py``'s ``compare``, median of ``--reps``)
  and the figure is ``speedup_vs_undivided = t(undivided) / t(micro-batched)`` (1.0 exactly
  when the division is the undivided plan itself: nothing to run).

Layers: CosmoFlow's conv layers (k=3, 'same') at a reduced resolution ``--size`` and
DeepBench-like 3D layers (video / volumetric segmentation shapes, some with few output
positions and many channels, where one GEMM over the packed columns of several samples beats
one per sample).  CPU here; the GPU part (cuDNN execution plans + im2col) runs where CuPy and
a GPU are present and says so otherwise.  ``--quick`` fits in about 90 s on 2 cores.

    .venv/bin/python bench/microbatch_bench.py --quick
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _results import record  # noqa: E402
from _timing import compare, wall  # noqa: E402
from disttensor.ops.local import microbatch as mb  # noqa: E402

MIB = 2**20


def cosmoflow_layers(size: int):
    """(name, Cin, Cout, spatial, kernel) of CosmoFlow's first conv layers at ``size``^3."""
    out, c, s = [], 4, size
    for cout in (32, 64, 128, 256):
        out.append((f"cosmoflow {c}->{cout} @{s}^3", c, cout, s, 3))
        c, s = cout, s // 2
    return out


DEEPBENCH_3D = [  # (name, Cin, Cout, spatial, kernel): volumetric / video conv shapes
    ("deepbench3d 64->64 @16^3", 64, 64, 16, 3),
    ("deepbench3d 256->256 @4^3", 256, 256, 4, 3),
    ("deepbench3d 512->512 @4^3", 512, 512, 4, 3),
    ("deepbench3d 256->64 1x1 @16^3", 256, 64, 16, 1),
]


def _problem(pass_, n, cin, cout, s, k, dtype):
    p = (k - 1) // 2
    return mb.ConvProblem.make(pass_, (n, cin, s, s, s), (cout, cin, k, k, k), (1,) * 3,
                               (1,) * 3, (p,) * 3, (k - 1 - p,) * 3, 1, dtype)


def _runner(pass_, x, w, dy, geo):
    take = mb.rotating_slices(x.shape[0])
    if pass_ == "forward":
        return lambda alg, b: alg.forward(x[take(b)], w, *geo)
    if pass_ == "backward_data":
        return lambda alg, b: alg.backward_data(dy[take(b)], w, x.shape[2:], *geo)

    def filt(alg, b):
        sl = take(b)
        return alg.backward_filter(x[sl], dy[sl], w.shape[2:], *geo)
    return filt


def _operands(pass_, x, w, dy):
    if pass_ == "forward":
        return x, w, None
    if pass_ == "backward_data":
        return dy, w, tuple(x.shape[2:])
    return x, dy, tuple(w.shape[2:])


def run_case(name, pass_, n, cin, cout, s, k, limit, xp, algos_for, sync, device, reps,
             budget, dtype=np.float32, table_reps=2):
    """Measure one (layer, pass, limit) and record its figure; returns the table row."""
    prob = _problem(pass_, n, cin, cout, s, k, dtype)
    rng = np.random.default_rng(0)
    x = xp.asarray(rng.standard_normal(prob.x_shape, dtype=np.float32).astype(dtype))
    w = xp.asarray((rng.standard_normal(prob.w_shape, dtype=np.float32) * 0.05).astype(dtype))
    geo = (prob.stride, prob.dilation, prob.pad_lo, prob.pad_hi, prob.groups)
    out_sp = tuple(int(v) for v in prob.x_shape[2:])  # 'same' convolutions
    dy = xp.asarray(rng.standard_normal((n, cout) + out_sp, dtype=np.float32).astype(dtype))
    algos = algos_for(limit)
    cands = mb.candidates(prob, algos, mb.candidate_sizes(n, "powerOfTwo"))
    fit = {kk: ws for kk, ws in cands.items() if ws <= limit}
    undiv_fit = {kk: ws for kk, ws in fit.items() if kk[1] == n}
    if not undiv_fit:  # nothing fits undivided: mu-cuDNN's case; baseline = smallest workspace
        smallest = min(ws for kk, ws in cands.items() if kk[1] == n)
        undiv_fit = {kk: ws for kk, ws in cands.items() if kk[1] == n and ws == smallest}
    runner = _runner(pass_, x, w, dy, geo)
    # one table, interleaved: the undivided candidates always, the others within the budget
    table = mb.measure_times(prob, {**fit, **undiv_fit}, algos, runner, sync, budget_s=budget,
                             reps=table_reps, always=set(undiv_fit))
    und = min((t, kk) for kk, t in table.items() if kk in undiv_fit)
    undivided = mb.Plan((und[1],), und[0], undiv_fit[und[1]])
    fit_times = {kk: t for kk, t in table.items() if kk in fit}
    if und[1] not in fit_times:  # nothing fits undivided: the division must do without it
        found = mb.optimal_division(n, fit_times)
    else:
        found = mb.choose_division(n, fit_times, mb.undivided_margin())
    micro = undivided if found is None else mb.Plan(tuple(found[1]), found[0],
                                                    max({**fit, **undiv_fit}[p]
                                                        for p in found[1]))
    if micro.micro_batches == undivided.micro_batches:
        ratio = 1.0
    else:
        a, b, extra = _operands(pass_, x, w, dy)

        def run(plan):
            def f():
                mb.run_plan(plan, algos, pass_, a, b, extra, geo, xp=xp)
                if sync:
                    sync()
            return f
        t = compare({"undivided": run(undivided), "micro": run(micro)}, reps=reps, warmup=1,
                    timer=wall)
        ratio = t["undivided"] / t["micro"]
    record(bench="microbatch", case=f"{name} {pass_} N={n} limit={limit // MIB}MiB",
           metric="speedup_vs_undivided", value=ratio, unit="x", target=1.0, device=device)
    fmt = lambda p: "+".join(f"{a}x{b}" for a, b in p.micro_batches)  # noqa: E731
    return (name, pass_, limit // MIB, fmt(undivided), fmt(micro), ratio)


def _print(rows):
    print(f"{'layer':32s} {'pass':16s} {'MiB':>4s}  {'undivided':28s} {'micro-batched':40s} "
          f"{'speedup':>7s}")
    for name, pass_, lim, und, mic, r in rows:
        print(f"{name:32s} {pass_:16s} {lim:4d}  {und:28s} {mic:40s} {r:7.2f}")


def run_cpu(args):
    layers = cosmoflow_layers(args.size) + DEEPBENCH_3D
    if args.quick:
        cf = cosmoflow_layers(args.size)
        layers = [cf[1], cf[3], DEEPBENCH_3D[0], DEEPBENCH_3D[2]]
    cases = [(layer, pass_, lim) for layer in layers for pass_ in mb.PASSES
             for lim in args.limits]
    rows, t0 = [], time.perf_counter()
    for i, ((name, cin, cout, s, k), pass_, lim) in enumerate(cases):
        if args.deadline and time.perf_counter() - t0 > args.deadline:
            print(f"  time limit of {args.deadline:.0f} s reached: {len(cases) - i} of "
                  f"{len(cases)} cases skipped")
            break
        rows.append(run_case(name, pass_, args.batch, cin, cout, s, k, lim * MIB, np,
                             mb.cpu_algorithms, None, "cpu", args.reps, args.budget,
                             table_reps=args.table_reps))
        print(f"  [{time.perf_counter() - t0:5.1f} s] {name} {pass_} {lim} MiB: "
              f"{rows[-1][-1]:.2f}x", flush=True)
    print("\nCPU: micro-batched vs undivided (same workspace limit, same-run interleaved)")
    _print(rows)
    rs = [r[-1] for r in rows]
    print(f"geometric mean {float(np.exp(np.mean(np.log(rs)))):.2f}x, max {max(rs):.2f}x, "
          f"min {min(rs):.2f}x over {len(rs)} cases")


def run_gpu(args):
    try:
        import cupy as cp
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no GPU")
    except Exception as err:  # noqa: BLE001 - ImportError, no driver, no device
        print(f"GPU part skipped: no usable CuPy/GPU here ({type(err).__name__}: {err})")
        return
    from disttensor.ops.local import gpu
    sync = cp.cuda.get_current_stream().synchronize
    size = args.size * 2
    layers = cosmoflow_layers(size) + DEEPBENCH_3D
    rows = []
    for name, cin, cout, s, k in layers:
        for pass_ in mb.PASSES:
            for lim in args.limits:
                rows.append(run_case(name, pass_, args.batch * 2, cin, cout, s, k, lim * MIB,
                                     cp, gpu.conv_algorithms, sync, "gpu", args.reps,
                                     args.budget, table_reps=3))
    print("\nGPU: micro-batched vs undivided (cuDNN plans + im2col)")
    _print(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a subset that runs in ~90 s")
    ap.add_argument("--size", type=int, default=None, help="CosmoFlow resolution (default 32)")
    ap.add_argument("--batch", type=int, default=None, help="mini-batch (default 8, 4 with --quick)")
    ap.add_argument("--limits", type=int, nargs="+", default=None,
                    help="workspace limits in MiB (default 8 64 512; 8 64 with --quick)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds of candidate timing per case (default 2, 0.3 quick)")
    ap.add_argument("--cpu-only", action="store_true")
    ap.add_argument("--deadline", type=float, default=None,
                    help="stop starting CPU cases after this many seconds (default: 60 with "
                    "--quick, none otherwise)")
    args = ap.parse_args()
    q = args.quick
    args.size = args.size or 32
    args.batch = args.batch or (4 if q else 8)
    args.table_reps = 2
    args.limits = args.limits or ([8, 64] if q else [8, 64, 512])
    args.reps = args.reps or (3 if q else 5)
    args.budget = args.budget if args.budget is not None else (0.3 if q else 2.0)
    args.deadline = args.deadline if args.deadline is not None else (60.0 if q else 0.0)
    run_cpu(args)
    if not args.cpu_only:
        run_gpu(args)


if __name__ == "__main__":
    main()
