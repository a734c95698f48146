"""Does the convolution tuner settle on each problem's fastest plan?

For every convolution layer-pass of the CosmoFlow 32^3 step (widths 16, 32, 64, 128, batch 4,
4 input channels, k3 'same') as each rank of each split computes it: the whole problem (one
rank), the depth split over two ranks (rank 0 and rank 1: half the depth plus the one-cell
halo, padded only at the global boundary) and the sample split (2 samples each), this bench
(one process, no MPI):

1. runs the calls step after step, as a training step does (every layer-pass once per
   "step"), through the CPU entry points, until every plan has settled (the online tuner
   tunes the large ones on their calls; the small ones are timed at their first call); each
   rank's problems start with an empty plan store, as a rank of a real run does;
2. times every candidate the tuner had (each ``(algorithm, micro_batch)`` of its short list
   as a uniform plan) and the settled plan, best-of-``--reps`` CPU time, in the step's
   context: step ``j`` runs the ``j``-th candidate of every problem (the candidates rotate, so
   they interleave, and each problem's operands leave the cache between its calls as in
   training);
3. reports settled / best per problem (pass: ``<= --target``, default 1.03).

Figures are recorded as ``tuner_choice`` (``bench/_results.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from _results import record  # noqa: E402


def layer_calls(split: str, size=32, widths=(16, 32, 64, 128), batch=4, cin=4):
    """``[(label, pass, x_shape, w_shape, pad_lo, pad_hi)]`` of one rank's conv calls."""
    out = []
    c, s = cin, size
    for i, w in enumerate(widths):
        n, depth, lo, hi = batch, s, (1, 1, 1), (1, 1, 1)
        if split == "samples":
            n = batch // 2
        elif split.startswith("spatial"):
            depth = s // 2 + 1                       # half the depth plus the halo cell
            lo, hi = ((1, 1, 1), (0, 1, 1)) if split.endswith("0") else ((0, 1, 1), (1, 1, 1))
        xs, ws = (n, c, depth, s, s), (w, c, 3, 3, 3)
        passes = ("forward", "backward_data", "backward_filter") if i else \
            ("forward", "backward_filter")         # the input needs no gradient
        out += [(f"conv{i + 1} {p}", p, xs, ws, lo, hi) for p in passes]
        c, s = w, s // 2
    return out


def operands(pass_, xs, ws, lo, hi, rng):
    """The entry point's call and the planner's ``(a, b, extra, geo)`` for one conv call."""
    from disttensor.ops.local.cpu.conv_operands import conv_out_shape
    ones = (1, 1, 1)
    osp = tuple(conv_out_shape(xs[2:], ws[2:], ones, ones, lo, hi))
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.standard_normal(ws, dtype=np.float32)
    dy = rng.standard_normal((xs[0], ws[0]) + osp, dtype=np.float32)
    geo = (ones, ones, tuple(lo), tuple(hi), 1)
    if pass_ == "forward":
        return (x, w, None, geo)
    if pass_ == "backward_data":
        return (dy, w, tuple(xs[2:]), geo)
    return (x, dy, tuple(ws[2:]), geo)


def entry_call(pass_, a, b, extra, geo):
    from disttensor.ops.local import microbatch as mb
    st, di, lo, hi, g = geo
    if pass_ == "forward":
        return mb.conv_forward(a, b, st, di, lo, hi, g)
    if pass_ == "backward_data":
        return mb.conv_backward_data(a, b, extra, st, di, lo, hi, g)
    return mb.conv_backward_filter(a, b, extra, st, di, lo, hi, g)


def candidate_plans(pass_, a, b, extra, geo, xs, ws):
    """The uniform plans of the tuner's short list (what it chose among)."""
    from disttensor.ops.local.microbatch import cpu_algorithms, limit_for, policy
    from disttensor.ops.local.microbatch.online import online_order, uniform_plan
    from disttensor.ops.local.microbatch.planner import fitting_candidates
    from disttensor.ops.local.microbatch.problem import ConvProblem
    from disttensor.ops.local.microbatch.settings import model_prefilter
    problem = ConvProblem.make(pass_, xs, ws, *geo, a.dtype)
    limit = limit_for(problem, relative=True)
    algos = cpu_algorithms(limit)
    fit, _ = fitting_candidates(problem, algos, limit, policy())
    order = online_order(problem, algos, fit, model_prefilter())
    return problem, algos, [uniform_plan(problem.batch, k, fit[k]) for k in order]


def describe(plan) -> str:
    return "+".join(f"{n}:{b}" for n, b in plan.micro_batches)


def run_rank(split: str, reps: int, max_steps: int):
    from disttensor.ops.local import microbatch as mb
    os.environ["DISTTENSOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="tuner_choice_")
    mb.clear_plans()
    rng = np.random.default_rng(0)
    calls = [(lab, p, xs, ws, operands(p, xs, ws, lo, hi, rng))
             for lab, p, xs, ws, lo, hi in layer_calls(split)]
    settled, steps = {}, {}
    for step in range(max_steps):
        for lab, p, xs, ws, ops in calls:
            if lab in settled:
                continue
            entry_call(p, *ops)
            plan = mb.last_plan()
            if plan.note != "online tuning":
                settled[lab], steps[lab] = plan, step + 1
        if len(settled) == len(calls):
            break
    table = []
    for lab, p, xs, ws, ops in calls:
        problem, algos, plans = candidate_plans(p, *ops, xs, ws)
        chosen = settled.get(lab) or mb.last_plan()
        keyed = {describe(q): q for q in plans}
        keyed.setdefault(describe(chosen), chosen)
        table.append((lab, p, ops, algos, chosen, keyed, {k: np.inf for k in keyed}))
    # in the step's context (each problem's operands fall out of cache between its calls, as
    # in training): step j runs candidate j mod n of every problem, so each runs >= reps times
    longest = max(len(keyed) for *_, keyed, _ in table)
    for j in range(reps * longest):
        for lab, p, ops, algos, chosen, keyed, best in table:
            names = list(keyed)
            k = names[(j + j // len(names)) % len(names)]
            t0 = time.process_time()
            mb.run_plan(keyed[k], algos, p, *ops)
            best[k] = min(best[k], time.process_time() - t0)
    rows = []
    for lab, p, ops, algos, chosen, keyed, best in table:
        fastest = min(best, key=best.get)
        ratio = best[describe(chosen)] / best[fastest]
        rows.append((split, lab, describe(chosen), steps.get(lab, -1), fastest, ratio,
                     best[describe(chosen)], best[fastest]))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--steps", type=int, default=30, help="most steps to wait for settling")
    ap.add_argument("--target", type=float, default=1.03)
    ap.add_argument("--splits", default="1,spatial0,spatial1,samples")
    ap.add_argument("--one", help=argparse.SUPPRESS)   # one rank's problems, this process
    args = ap.parse_args(argv)
    if args.one:
        for row in run_rank(args.one, args.reps, args.steps):
            print(json.dumps(row), flush=True)
        return 0
    print(f"# tuner choice, CosmoFlow 32^3 widths 16,32,64,128 batch 4; load "
          f"{os.getloadavg()[0]:.1f}; best of {args.reps}, CPU time; one fresh process "
          f"per rank")
    print(f"{'rank':9} {'layer-pass':24} {'settled':24} {'calls':>5} {'fastest':24} "
          f"{'ratio':>6} {'ms':>7} {'best ms':>7}")
    worst, most = 0.0, 0
    for split in args.splits.split(","):
        # a fresh process per rank, as a rank of a real run: first calls pay their one-offs
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", split,
                              "--reps", str(args.reps), "--steps", str(args.steps)],
                             check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            if not line.startswith("["):
                continue
            split_, lab, chosen, n, fastest, ratio, t, tb = json.loads(line)
            worst, most = max(worst, ratio), max(most, n)
            print(f"{split_:9} {lab:24} {chosen:24} {n:5d} {fastest:24} {ratio:6.3f} "
                  f"{t * 1e3:7.2f} {tb * 1e3:7.2f}", flush=True)
            record(bench="tuner_choice", case=f"{split_} {lab}", metric="settled_over_best",
                   value=ratio, unit="x", target=args.target, better="lower")
    ok = worst <= args.target
    print(f"# worst settled/best {worst:.3f} (target <= {args.target}): "
          f"{'pass' if ok else 'MISS'}; most calls to settle {most}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
