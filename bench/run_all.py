"""Run every benchmark in bench/, collect one CSV of every figure, plot it, summarise targets.

    .venv/bin/python bench/run_all.py                 # CPU, quick settings (~15 min, 2 cores)
    .venv/bin/python bench/run_all.py --full          # the benchmarks' own (larger) defaults
    .venv/bin/python bench/run_all.py --gpu           # also the GPU benchmarks (GPU machine)
    .venv/bin/python bench/run_all.py --only conv,halo --out build/bench-x

``scripts/bench.sh`` wraps this with the set-up (MPI, .venv, matplotlib, PyTorch as a peer).

Each benchmark runs as its own process (under ``mpiexec -n N`` for the MPI ones, with the
MPICH idle-sleep shim when it is built, see scripts/test.sh; the 2-rank step benchmarks give
it a spin budget themselves, bench/README.md "MPI waits in the benchmarks") under a timeout;
a benchmark that fails or times out is reported in the summary and the others still run.
Benchmarks append their figures to ``$DISTTENSOR_BENCH_CSV`` through ``bench/_results.py``;
this script points that variable at ``<out>/results.csv`` (started afresh), keeps each
run's output in ``<out>/logs/``, and writes:

``results.csv``       every figure (bench, case, metric, value, unit, target, better, ranks,
                      device)
``summary.md``        every figure that has a target, whether it meets it, and the runs' status
``scaling.png``       strong scaling (parallel efficiency against ranks)
``overlap.png``       overlapped / not overlapped time ratios
``microbatch.png``    micro-batched vs undivided convolution under workspace limits
``perfmodel.png``     predicted vs measured step times (the 25% band shaded)
``targets.png``       every targeted figure as value / target (1 = just meets it)

Timings on a shared 2-core machine are noisy: every figure is a ratio against a baseline
measured in the same process run, never an absolute time compared across runs.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _results import read  # noqa: E402


@dataclass
class Job:
    """One benchmark invocation: ``script`` with ``quick``/``full`` arguments on each rank
    count of ``ranks`` (1 without mpiexec when ``mpi`` is False)."""
    name: str
    script: str
    quick: list
    full: list = field(default_factory=list)
    ranks: tuple = (1,)
    mpi: bool = True
    gpu: bool = False            # only with --gpu
    threads_per_rank: int = 1    # NUMBA/OPENBLAS/OMP threads per rank (0: leave as is)
    timeout: int = 420


JOBS = [
    # kernels
    Job("conv", "conv_bench.py", ["--local", "--quick"], ["--local"], mpi=False,
        threads_per_rank=0),
    Job("microbatch", "microbatch_bench.py", ["--quick"], [], mpi=False, threads_per_rank=0),
    Job("tuner_choice", "tuner_choice_bench.py", ["--reps", "7"], ["--reps", "15"], mpi=False),
    Job("split_kernels", "split_kernels_bench.py", ["--reps", "15"], ["--reps", "40"],
        mpi=False),
    # communication
    Job("halo", "halo_bench.py", ["--quick"], [], ranks=(2, 4)),
    Job("halo_call", "halo_call_bench.py", ["--reps", "5", "--calls", "20"], [], ranks=(2,)),
    Job("conv_operand", "conv_operand_bench.py", ["--reps", "5", "--calls", "5"], [],
        ranks=(2,)),
    Job("redistribute", "redistribute_bench.py", ["--quick"], [], ranks=(2, 4)),
    Job("flatten_gather", "flatten_gather_bench.py", ["--reps", "200"], ["--reps", "800"],
        ranks=(2,)),
    Job("agreement", "agreement_bench.py", ["--size", "16", "--reps", "8"], [], ranks=(2,)),
    # scaling, overlap, the performance model
    Job("scaling", "scaling_bench.py", ["--quick"], [], ranks=(2, 3, 4)),
    Job("step_scaling", "step_scaling_bench.py", ["--sizes", "32", "--unet", "--reps", "5"],
        [], ranks=(2,), timeout=900),
    Job("perfmodel", "perfmodel_bench.py", ["--quick"], [], ranks=(1, 2, 4), timeout=600),
    Job("profile", "profile_bench.py", ["--size", "16", "--widths", "8,16", "--reps", "2"],
        ["--size", "32", "--reps", "5"], ranks=(2,)),
    Job("simulator", "simulator_bench.py", ["--quick"], [], mpi=False, threads_per_rank=0),
    Job("train", "train_bench.py", ["--size", "16", "--widths", "8,16", "--reps", "3"], [],
        ranks=(2,)),
    Job("step_floor", "step_floor_bench.py", ["--reps", "150"], ["--reps", "400"], ranks=(2,)),
    Job("rank_skew", "rank_skew_bench.py", ["--steps", "10", "--reps", "2"], [], ranks=(2,)),
    Job("step_alloc", "step_alloc_bench.py", ["--sizes", "8,32", "--rounds", "1"],
        ["--sizes", "8,32,64", "--rounds", "3", "--splits", "depth,samples"], mpi=False,
        threads_per_rank=1, timeout=900),
    # training features
    Job("pipeline", "pipeline_bench.py", ["--models", "cosmoflow", "--steps", "3"], [],
        ranks=(2,)),
    Job("startup", "startup_bench.py", ["--size", "32", "--new-size", "24", "--mem-size", "32"],
        ["--size", "128", "--mem-size", "64", "--baseline"], ranks=(1, 2, 4), timeout=600),
    Job("memory_plan", "memory_plan_bench.py", ["--size", "16", "--reps", "2"], [], ranks=(1,)),
    Job("optim_step", "optim_step_bench.py", ["--reps", "20"], ["--reps", "100"], mpi=False,
        threads_per_rank=1),
    Job("backward_update", "backward_update_bench.py",
        ["--size", "16", "--widths", "8,16,32", "--reps", "3"], [], ranks=(2,)),
    # the array library and I/O
    Job("fft", "fft_bench.py", ["--size", "64"], [], ranks=(2,)),
    Job("matmul", "matmul_bench.py", ["--n", "1024"], [], ranks=(2,)),
    Job("sort", "sort_bench.py", ["--n", "1e6"], [], ranks=(2,)),
    Job("io", "io_bench.py", ["--size", "64", "--reps", "3", "--no-cold"], [], ranks=(2,)),
    Job("zarr", "zarr_bench.py", ["--size", "64", "--reps", "3"], [], ranks=(1, 2)),
    Job("dataset_transform", "dataset_transform_bench.py",
        ["--size", "64", "--crop", "32", "--samples", "16", "--reps", "5"], [], ranks=(1, 2)),
    # the NumPy front: local paths, per-call cost, indexing, stencils, statistics, linalg
    Job("numpy_local", "numpy_local_bench.py", ["--sizes", "1e6", "--reps", "3"], [],
        ranks=(1, 2)),
    Job("elementwise_overhead", "elementwise_overhead_bench.py", ["--reps", "7"], [],
        ranks=(1, 2)),
    Job("fancy_index", "fancy_index_bench.py", ["--reps", "5"], [], ranks=(1, 2)),
    Job("stencil", "stencil_bench.py", ["--n", "64", "--reps", "5"], [], ranks=(1, 2)),
    Job("stats_calculus", "stats_calculus_bench.py", ["--n", "1e6", "--reps", "3"], [],
        ranks=(1, 2)),
    Job("linalg_more", "linalg_more_bench.py", ["--reps", "3"], [], ranks=(1, 2)),
    # nn layers, losses and optimizers: speed and parity with PyTorch (the parity scripts need
    # PyTorch, which scripts/bench.sh installs as a peer)
    Job("normalization", "normalization_bench.py", ["--quick"], [], ranks=(1, 2)),
    Job("parity_normalization", "parity_normalization.py", [], [], ranks=(2,)),
    Job("parity_losses", "parity_losses.py", [], [], ranks=(2,)),
    Job("parity_activations", "parity_activations.py", [], [], ranks=(2,)),
    Job("parity_resampling", "parity_resampling.py", [], [], ranks=(2,)),
    Job("parity_module_api", "parity_module_api.py", [], [], ranks=(2,)),
    Job("parity_optim", "parity_optim.py", [], [], ranks=(1,)),
    Job("parity_prune", "parity_prune.py", [], [], ranks=(2,)),
    # sparse matrices and pruned networks
    Job("sparse", "sparse_bench.py", ["--quick"], [], mpi=False, threads_per_rank=0),
    Job("sparse_dist", "sparse_dist_bench.py", ["--n", "32", "--reps", "3"], [],
        ranks=(1, 2)),
    Job("prune", "prune_bench.py", ["--size", "16", "--samples", "48", "--epochs", "3"], [],
        ranks=(1,)),
    # GPU (each exits 0 with a message where there is no GPU)
    Job("conv_gpu", "conv_gpu_bench.py", ["--quick"], [], mpi=False, gpu=True,
        threads_per_rank=0),
    Job("gpu_kernels", "gpu_kernels_bench.py", ["--quick"], [], mpi=False, gpu=True,
        threads_per_rank=0),
    Job("gpu_step", "gpu_step_bench.py", ["--quick"], [], mpi=False, gpu=True,
        threads_per_rank=0),
]


def _python() -> str:
    venv = os.path.join(ROOT, ".venv", "bin", "python")
    return venv if os.path.exists(venv) else sys.executable


def _command(job: Job, n: int, args) -> list:
    py = _python()
    script = os.path.join(HERE, job.script)
    argv = list(job.full if args.full else job.quick)
    if not job.mpi:
        return [py, script] + argv
    launcher = [shutil.which("mpiexec") or "mpiexec"]
    shim = os.path.join(ROOT, "build", "libmpi_idle_sleep.so")
    if os.path.exists(shim) and os.environ.get("DISTTENSOR_MPI_IDLE_SLEEP", "1") != "0":
        launcher += ["-genv", "LD_PRELOAD", shim]
    return launcher + ["-n", str(n), py, "-m", "mpi4py", script] + argv


def _run(job: Job, n: int, args, logdir: str) -> tuple[str, float]:
    """Run one invocation; returns (status, seconds).  status: ok | failed (rc) | timeout."""
    env = dict(os.environ)
    env["DISTTENSOR_BENCH_CSV"] = os.path.abspath(os.path.join(args.out, "results.csv"))
    env.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    if job.threads_per_rank:
        for var in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                    "MKL_NUM_THREADS"):
            env[var] = str(job.threads_per_rank)
    if args.gpu:
        env.setdefault("DISTTENSOR_BENCH_GPU", "1")
    cmd = _command(job, n, args)
    log = os.path.join(logdir, f"{job.name}-n{n}.log")
    t0 = time.time()
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                             start_new_session=True)
        try:
            rc = p.wait(timeout=args.timeout_scale * job.timeout)
            status = "ok" if rc == 0 else f"failed (rc {rc})"
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            status = "timeout"
    return status, time.time() - t0


# -- plots -------------------------------------------------------------------------------------
def _plots(rows: list, out: str) -> list:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("run_all: matplotlib is not installed: no plots (scripts/bench.sh installs it)")
        return []
    made = []

    def save(fig, name):
        path = os.path.join(out, name)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)

    # strong scaling: efficiency against ranks, one line per case
    eff = [r for r in rows if r["metric"] == "efficiency"]
    if eff:
        fig, ax = plt.subplots(figsize=(7.0, 6.2))
        for case in sorted({(r["bench"], r["case"]) for r in eff}):
            # the 1-rank run is every case's baseline: efficiency 1 by definition
            pts = [(1, 1.0)] + sorted((r["ranks"], r["value"]) for r in eff
                                      if (r["bench"], r["case"]) == case)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{case[0]}: {case[1]}")
        ax.axhline(0.9, color="grey", ls="--", lw=1, label="target 0.9 (2 ranks)")
        ax.axvline(os.cpu_count() + 0.5, color="red", ls=":", lw=1,
                   label=f"{os.cpu_count()} cores: beyond, ranks share cores")
        ax.set_xlabel("MPI ranks")
        ax.set_ylabel("parallel efficiency (1-rank time / (ranks x time))")
        ax.set_ylim(0, 1.15)
        ax.set_title("strong scaling (same-run 1-rank baseline)")
        ax.set_xticks(sorted({1} | {r["ranks"] for r in eff}))
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.14))
        save(fig, "scaling.png")

    def bars(sel, name, title, ylabel, ref=1.0):
        if not sel:
            return
        fig, ax = plt.subplots(figsize=(max(6.4, 0.45 * len(sel)), 4.4))
        labels = [f"{r['case']} [{r['metric']}] n={r['ranks']} {r['device']}" for r in sel]
        ax.bar(range(len(sel)), [r["value"] for r in sel], color="tab:blue")
        ax.axhline(ref, color="grey", ls="--", lw=1)
        ax.set_xticks(range(len(sel)))
        ax.set_xticklabels(labels, rotation=70, ha="right", fontsize=6)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        save(fig, name)

    bars([r for r in rows if "overlap" in r["metric"]], "overlap.png",
         "overlap: time with overlap / time without (below 1: overlap helps)", "ratio")
    bars([r for r in rows if r["bench"] == "microbatch"], "microbatch.png",
         "micro-batched conv vs best undivided algorithm, same workspace limit",
         "speed-up (x)")

    pm = [r for r in rows if r["bench"] == "perfmodel"]
    pred = {(r["case"], r["ranks"]): r["value"] for r in pm if r["metric"] == "predicted_s"}
    meas = {(r["case"], r["ranks"]): r["value"] for r in pm if r["metric"] == "measured_s"}
    both = sorted(set(pred) & set(meas), key=lambda k: (k[1], k[0]))
    if both:
        fig, ax = plt.subplots(figsize=(5.6, 5.2))
        for n in sorted({k[1] for k in both}):
            ks = [k for k in both if k[1] == n]
            ax.scatter([meas[k] for k in ks], [pred[k] for k in ks], label=f"{n} ranks")
            for k in ks:
                ax.annotate(k[0], (meas[k], pred[k]), fontsize=6)
        hi = max(max(pred[k], meas[k]) for k in both) * 1.15
        xs = [0, hi]
        ax.plot(xs, xs, "k-", lw=1)
        ax.fill_between(xs, [0.75 * v for v in xs], [1.25 * v for v in xs], color="grey",
                        alpha=0.2, label="within 25%")
        ax.set_xlim(0, hi)
        ax.set_ylim(0, hi)
        ax.set_xlabel("measured step time (s)")
        ax.set_ylabel("predicted step time (s)")
        ax.set_title("performance model: predicted vs measured")
        ax.legend(fontsize=7)
        save(fig, "perfmodel.png")

    tg = [r for r in rows if r["target"] is not None]
    if tg:
        fig, ax = plt.subplots(figsize=(max(6.4, 0.4 * len(tg)), 4.6))
        vals = [(r["value"] / r["target"]) if r["better"] == "higher"
                else (r["target"] / r["value"] if r["value"] else float("inf")) for r in tg]
        ax.bar(range(len(tg)), vals, color=["tab:green" if v >= 1 else "tab:red" for v in vals])
        ax.axhline(1.0, color="k", lw=1)
        ax.set_xticks(range(len(tg)))
        ax.set_xticklabels([f"{r['bench']}: {r['case']} [{r['metric']}] n={r['ranks']}"
                            for r in tg], rotation=75, ha="right", fontsize=5)
        ax.set_ylabel("how far past the target (>= 1 meets it)")
        ax.set_title("every targeted figure")
        save(fig, "targets.png")
    return made


def _meets(r) -> bool:
    return r["value"] >= r["target"] if r["better"] == "higher" else r["value"] <= r["target"]


def _summary(rows: list, runs: list, plots: list, out: str, args) -> str:
    lines = ["# Benchmark suite summary", "",
             f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {os.cpu_count()} cores, "
             f"{'full' if args.full else 'quick'} settings{', GPU' if args.gpu else ''}.", "",
             "## Runs", "", "| bench | ranks | status | seconds |", "|---|---|---|---|"]
    lines += [f"| {j} | {n} | {s} | {t:.0f} |" for j, n, s, t in runs]
    lines += ["", "## Figures with a target", "",
              "| bench | case | metric | ranks | device | value | target | met |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["target"] is None:
            continue
        cmp_ = ">=" if r["better"] == "higher" else "<="
        lines.append(f"| {r['bench']} | {r['case']} | {r['metric']} | {r['ranks']} | "
                     f"{r['device']} | {r['value']:.3g} {r['unit']} | {cmp_} {r['target']:.3g} "
                     f"| {'yes' if _meets(r) else '**no**'} |")
    n_t = sum(r["target"] is not None for r in rows)
    n_m = sum(r["target"] is not None and _meets(r) for r in rows)
    lines += ["", f"{n_m} of {n_t} targeted figures meet their target; {len(rows)} figures in "
              "all (results.csv).", "", "Plots: " + ", ".join(os.path.basename(p)
                                                               for p in plots), ""]
    text = "\n".join(lines)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench"))
    ap.add_argument("--full", action="store_true", help="each benchmark's own defaults")
    ap.add_argument("--gpu", action="store_true", help="also run the GPU benchmarks")
    ap.add_argument("--only", default="", help="comma-separated job names")
    ap.add_argument("--skip", default="", help="comma-separated job names")
    ap.add_argument("--ranks", default="", help="restrict MPI jobs to these rank counts")
    ap.add_argument("--timeout-scale", type=float, default=1.0)
    ap.add_argument("--plots-only", action="store_true", help="re-plot an existing results.csv")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.list:
        for j in JOBS:
            print(f"{j.name:16s} {j.script:26s} ranks {j.ranks}{'  (gpu)' if j.gpu else ''}")
        return 0
    only = {s for s in args.only.split(",") if s}
    skip = {s for s in args.skip.split(",") if s}
    unknown = (only | skip) - {j.name for j in JOBS}
    if unknown:
        raise SystemExit(f"run_all: unknown job(s) {sorted(unknown)}; --list shows them")
    keep_ranks = {int(v) for v in args.ranks.split(",") if v}
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "results.csv")
    runs = []
    if not args.plots_only:
        if os.path.exists(csv_path):
            os.remove(csv_path)
        logdir = os.path.join(args.out, "logs")
        os.makedirs(logdir, exist_ok=True)
        for job in JOBS:
            if (only and job.name not in only) or job.name in skip or (job.gpu and not args.gpu):
                continue
            if not os.path.exists(os.path.join(HERE, job.script)):
                runs.append((job.name, "-", "missing script", 0.0))
                continue
            for n in job.ranks:
                if keep_ranks and job.mpi and n not in keep_ranks:
                    continue
                print(f"run_all: {job.name} on {n} rank(s) ...", flush=True)
                status, secs = _run(job, n, args, logdir)
                print(f"run_all: {job.name} n={n}: {status} in {secs:.0f} s", flush=True)
                runs.append((job.name, n, status, secs))
    rows = read(csv_path) if os.path.exists(csv_path) else []
    plots = _plots(rows, args.out)
    print(_summary(rows, runs, plots, args.out, args))
    print(f"run_all: results in {args.out}/ (results.csv, summary.md, *.png, logs/)")
    return 1 if any(s != "ok" for _, _, s, _ in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
