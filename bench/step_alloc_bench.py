"""What a steady training step allocates, and what that costs: the buffer pool against glibc
``malloc`` tuning against neither, each in its own processes (the settings are read at
import), rounds interleaved.

    python bench/step_alloc_bench.py [--sizes 8,32] [--ranks 1,2] [--splits depth,samples]
                                     [--rounds 3] [--steps 20]

The step is CosmoFlow's (forward, MSE loss, ``zero_grad``, backward, Adam): at 8^3 the
overhead-floor model (widths 2,2, dense 128,64, batch 2), otherwise widths 16,32,64,128,
dense 64,32, batch 4; on 1 rank, or on 2 ranks split along depth (grid ``(1, 2, 1, 1)``)
or samples (``(2, 1, 1, 1)``), through :class:`disttensor.nn.DistributedDataParallel`.  Configurations
(``DISTTENSOR_BUFFER_POOL`` / ``DISTTENSOR_MALLOC_TUNING``): ``neither`` (off/off), ``pool``
(on/off), ``malloc`` (off/on), ``both`` (on/on, the default); with ``--baseline PYTHON``
also ``baseline``: the same worker run by another checkout's interpreter (its own
disttensor, e.g. the tree before this work), in the same rounds.

Per configuration, size and rank count (median over the rounds, range beside): the step's
wall time (slowest rank), its CPU time and its system CPU time summed over the ranks (page
faults are system time: the kernel zero-fills every fresh page), the minor page faults of a
step summed over the ranks (``getrusage``), the bytes NumPy allocates and frees inside one
step (tracemalloc peak above what the step keeps; the largest rank), and the data buffers
NumPy allocates in one steady step, however briefly (count and bytes, the largest rank;
:mod:`disttensor.testing.allocations`, loaded from this checkout so that a baseline tree
without it is measured alike).  Figures go to
``$DISTTENSOR_BENCH_CSV`` (bench ``step_alloc``).  One thread per rank.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

CONFIGS = {"neither": ("off", "off"), "pool": ("on", "off"), "malloc": ("off", "on"),
           "both": ("on", "on")}


def _allocation_counter():
    """:func:`disttensor.testing.allocations.numpy_allocations` from this checkout's file
    (a ``--baseline`` tree may not have it)."""
    import importlib.util
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(
        "_bench_allocations", os.path.join(here, "disttensor", "testing", "allocations.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.numpy_allocations


def worker(size: int, steps: int, split: str) -> None:
    """One configuration in this MPI job: print a JSON line of per-step figures (rank 0)."""
    import resource
    import time
    import tracemalloc

    import numpy as np
    from mpi4py import MPI

    import disttensor as dt
    from disttensor import nn
    from disttensor.autograd import Tensor
    from disttensor.nn import functional as F
    comm = MPI.COMM_WORLD
    widths, dense, batch = ((2, 2), (128, 64), 2) if size == 8 else \
        ((16, 32, 64, 128), (64, 32), 4)
    dims = (comm.size, 1, 1, 1) if split == "samples" else (1, comm.size, 1, 1)
    grid = dt.ProcessGrid(dims, comm=comm)
    m = nn.models.cosmoflow(input_size=size, in_channels=4, widths=widths, dense=dense,
                            outputs=4, rng=np.random.default_rng(0))
    net = nn.DistributedDataParallel(m, grid) if grid.size > 1 else m
    opt = nn.optim.Adam(m.parameters(), lr=1e-4)
    rng = np.random.default_rng(1)
    x = dt.from_global(rng.standard_normal((batch, 4) + (size,) * 3).astype(np.float32),
                       grid=grid, split=(0, None, 1, 2, 3))
    y = dt.from_global(rng.uniform(-1, 1, (batch, 4)).astype(np.float32), grid=grid,
                       split=(0, None))

    def step():
        loss = F.mse_loss(net(Tensor(x)), Tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
    for _ in range(8):
        step()
    walls = []
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(steps):
        comm.Barrier()
        t0 = time.perf_counter()
        step()
        walls.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    step()
    cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    numpy_allocations = _allocation_counter()
    step()
    with numpy_allocations() as seen:
        step()
    mine = {"cpu": (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / steps,
            "sys": (r1.ru_stime - r0.ru_stime) / steps,
            "faults": (r1.ru_minflt - r0.ru_minflt) / steps}
    total = {k: comm.allreduce(v, op=MPI.SUM) for k, v in mine.items()}
    total["transient"] = comm.allreduce(max(0, peak - max(cur, base)), op=MPI.MAX)
    total["np_allocs"] = comm.allreduce(seen.count, op=MPI.MAX)
    total["np_bytes"] = comm.allreduce(seen.nbytes, op=MPI.MAX)
    total["wall"] = statistics.median(walls)
    if comm.rank == 0:
        print("RESULT " + json.dumps(total), flush=True)


def run_config(name: str, size: int, ranks: int, steps: int, baseline: str | None,
               split: str = "depth") -> dict:
    pool, tuning = CONFIGS.get(name, ("on", "on"))
    env = dict(os.environ, DISTTENSOR_BUFFER_POOL=pool, DISTTENSOR_MALLOC_TUNING=tuning,
               PYTHONDONTWRITEBYTECODE="1")
    for v in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        env.setdefault(v, "1")
    python = baseline if name == "baseline" else sys.executable
    cwd = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(python)))) \
        if name == "baseline" else None
    cmd = [shutil.which("mpiexec") or "mpiexec", "-n", str(ranks), python, "-m",
           "mpi4py", os.path.abspath(__file__), "--worker", str(size), "--steps", str(steps),
           "--splits", split]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=cwd)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode or not lines:
        raise SystemExit(f"{name} {size}^3 on {ranks} ranks ({split}) failed:\n"
                         f"{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,32")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--splits", default="depth", help="how 2 ranks split the batch: depth, "
                    "samples or both (comma-separated)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--baseline", default=None, help="another checkout's .venv/bin/python: "
                    "adds the case 'baseline' (that tree's disttensor)")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker, args.steps, args.splits)
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _results import record
    names = [c for c in args.configs.split(",") if c] + (["baseline"] if args.baseline else [])
    splits = [p for p in args.splits.split(",") if p]
    cases = [(int(sz), int(r), p) for sz in args.sizes.split(",") for r in args.ranks.split(",")
             for p in (splits if int(r) > 1 else ["depth"])]
    for size, ranks, split in cases:
        seen = {n: [] for n in names}
        for i in range(args.rounds):
            for n in names[i % len(names):] + names[:i % len(names)]:
                seen[n].append(run_config(n, size, ranks, args.steps, args.baseline, split))
        label = (f"cosmoflow {size}^3 " + ("widths 2,2 batch 2" if size == 8 else
                                           "widths 16,32,64,128 batch 4") +
                 f" adam, {ranks} rank{'s' if ranks > 1 else ''}" +
                 (f" {split} split" if ranks > 1 else ""))
        print(f"{label} (load {os.getloadavg()[0]:.2f}); median [range] of "
              f"{args.rounds} rounds", flush=True)
        for n in names:
            row = {k: [r[k] for r in seen[n]] for k in seen[n][0]}
            med = {k: statistics.median(v) for k, v in row.items()}

            def rng(k, scale, fmt):
                return (f"{format(med[k] * scale, fmt)} [{format(min(row[k]) * scale, fmt)}"
                        f"-{format(max(row[k]) * scale, fmt)}]")
            print(f"  {n:8s} step {rng('wall', 1e3, '.3f')} ms  cpu {rng('cpu', 1e3, '.3f')}"
                  f" ms  sys {rng('sys', 1e3, '.2f')} ms  faults/step "
                  f"{rng('faults', 1, '.1f')}  transient {med['transient'] / 1024:.1f} KiB  "
                  f"numpy allocations {med['np_allocs']:.0f} ({med['np_bytes'] / 1024:.1f} KiB)",
                  flush=True)
            case = f"{label}: {n}"
            for k, unit, metric in (("wall", "s", "step_s"), ("cpu", "s", "cpu_s"),
                                    ("sys", "s", "sys_s"), ("faults", "", "faults_per_step"),
                                    ("transient", "B", "transient_bytes"),
                                    ("np_allocs", "", "numpy_allocations_per_step"),
                                    ("np_bytes", "B", "numpy_allocated_bytes_per_step")):
                record("step_alloc", case, metric, med[k], unit, better="lower", ranks=ranks)


if __name__ == "__main__":
    main()
