"""Start-up and per-rank memory: import, memory before the first array, the first training
step (Numba cache, convolution tuning), and activation memory per rank.

1. Import: seconds to import ``disttensor``, ``disttensor.nn`` and ``disttensor.train`` and
   create a ProcessGrid (this process's first import), then the process's RSS, PSS and USS
   (``/proc/self/smaps_rollup``) and which heavy modules got loaded (none should: Numba, h5py,
   SciPy, ... load on first use).  Max over ranks.
2. First step: one CosmoFlow training step (widths 16,32,64,128, batch 4, Adam) on a depth
   split over all ranks, with an empty convolution plan cache (a fresh clone after set-up:
   the Numba kernels come from the cache ``python -m disttensor.warmup`` filled; whether it is
   warm is printed), wall and CPU seconds of steps 1 and 2 (max over ranks); ``--baseline``:
   also with ``DISTTENSOR_CONV_TUNE_SIMILAR``, ``DISTTENSOR_CONV_TUNE_PREFILTER``,
   ``DISTTENSOR_CONV_TUNE_ONLINE`` and ``DISTTENSOR_CONV_WORKSPACE_RATIO`` ``off``
   (every candidate of every layer-pass timed at full size under 64 MiB: the behaviour
   before all four).
3. A new shape: the first step of a model ``--new-size`` (default 3/4 of ``--size``) with the
   plan cache of step 2, once reusing similar tuned plans (the default) and once with
   ``DISTTENSOR_CONV_TUNE_SIMILAR=off`` (each from a copy of the same cache).
4. Activation memory (``--mem-size``, more than one rank): bytes NumPy holds after the
   forward pass of one batch (what the graph keeps for backward, tracemalloc: current after
   the forward minus before) and the peak during forward + backward, per rank on a
   ``(1, a, b, 1)`` spatial grid vs on rank 0 alone; the ratio (max over ranks / one rank).

    mpiexec -n 2 python -m mpi4py bench/startup_bench.py [--size 128] [--mem-size 64]
"""
import time

_T0 = time.perf_counter()
import sys  # noqa: E402

import disttensor as dt  # noqa: E402
import disttensor.nn  # noqa: E402,F401
import disttensor.train  # noqa: E402,F401

_GRID = dt.ProcessGrid()
_IMPORT_S = time.perf_counter() - _T0
_HEAVY = ("numba", "llvmlite", "h5py", "scipy", "yaml", "zarr", "tqdm", "matplotlib", "cupy")
_LOADED = sorted(m for m in _HEAVY if m in sys.modules)


def _memory_mb() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                out["rss"] = int(line.split()[1]) / 1024
    roll = {}
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    roll[parts[0].rstrip(":")] = int(parts[1])
    except OSError:
        pass
    out["pss"] = roll.get("Pss", 0) / 1024
    out["uss"] = (roll.get("Private_Clean", 0) + roll.get("Private_Dirty", 0)) / 1024
    return out


_MEM = _memory_mb()

import argparse  # noqa: E402
import gc  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _results import record  # noqa: E402

from disttensor import nn  # noqa: E402
from disttensor.autograd import Tensor  # noqa: E402
from disttensor.nn import functional as F  # noqa: E402
from disttensor.ops.local.microbatch import clear_plans  # noqa: E402
from disttensor.warmup import is_warm  # noqa: E402

WIDTHS = (16, 32, 64, 128)


def model(size, dtype="float32"):
    return nn.models.cosmoflow(input_size=size, in_channels=4, widths=WIDTHS, dense=(64, 32),
                               outputs=4, dtype=dtype, rng=np.random.default_rng(0))


def batch(grid, size, n=4):
    g = dt.random.default_rng(1)
    x = g.normal(shape=(n, 4) + (size,) * 3, dtype="float32", grid=grid,
                 split=(0, None, 1, 2, 3))
    y = g.uniform(-1, 1, shape=(n, 4), dtype="float32", grid=grid, split=(0, None))
    return x, y


def timed_steps(comm, grid, size, steps):
    """Wall and CPU seconds (max over ranks) of the first ``steps`` training steps."""
    m = model(size)
    opt = nn.optim.Adam(m.parameters(), lr=1e-4)
    x, y = batch(grid, size)
    out = []
    for _ in range(steps):
        comm.Barrier()
        t, c = time.perf_counter(), time.process_time()
        loss = F.mse_loss(m(Tensor(x)), Tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        c = time.process_time() - c
        comm.Barrier()
        t = time.perf_counter() - t
        out.append((comm.allreduce(t, op=MPI.MAX), comm.allreduce(c, op=MPI.MAX)))
    return out


def with_plan_dir(comm, path, fn):
    """Run ``fn()`` with ``DISTTENSOR_CACHE_DIR=path`` and no plans in memory."""
    old = os.environ.get("DISTTENSOR_CACHE_DIR")
    os.environ["DISTTENSOR_CACHE_DIR"] = path
    clear_plans()
    try:
        return fn()
    finally:
        clear_plans()
        if old is None:
            os.environ.pop("DISTTENSOR_CACHE_DIR", None)
        else:
            os.environ["DISTTENSOR_CACHE_DIR"] = old


def activation_bytes(grid, size):
    """(bytes held after the forward pass, peak during forward + backward) on this rank."""
    m = model(size)
    x, y = batch(grid, size)

    def step():
        F.mse_loss(m(Tensor(x)), Tensor(y)).backward()
    step()  # plans, workspaces, kernels
    m.zero_grad()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    loss = F.mse_loss(m(Tensor(x)), Tensor(y))
    held = tracemalloc.get_traced_memory()[0] - base
    loss.backward()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del loss
    return held, peak


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--new-size", type=int, default=0)
    p.add_argument("--mem-size", type=int, default=64)
    p.add_argument("--baseline", action="store_true",
                   help="also time the first step with plan reuse off (the old behaviour)")
    p.add_argument("--skip", default="", help="comma list of parts to skip: step,new,memory")
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    comm = MPI.COMM_WORLD
    n = comm.size
    say = print if comm.rank == 0 else (lambda *a, **k: None)

    # 1. import and memory before the first array
    imp = comm.allreduce(_IMPORT_S, op=MPI.MAX)
    mem = {k: comm.allreduce(v, op=MPI.MAX) for k, v in _MEM.items()}
    loaded = sorted(set().union(*comm.allgather(set(_LOADED))))
    say(f"# start-up on {n} rank(s); load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    say(f"import disttensor+nn+train+grid: {imp:.3f} s; per rank (max) RSS {mem['rss']:.0f} "
        f"MB, PSS {mem['pss']:.0f} MB, USS {mem['uss']:.0f} MB; heavy modules loaded: "
        f"{loaded or 'none'}")
    record("startup", "import disttensor+nn+train", "import_s", imp, "s", better="lower",
           ranks=n, rank=comm.rank)
    record("startup", "before the first array", "rss_mb", mem["rss"], "MB", target=200,
           better="lower", ranks=n, rank=comm.rank)
    record("startup", "before the first array", "pss_mb", mem["pss"], "MB", better="lower",
           ranks=n, rank=comm.rank)
    record("startup", "before the first array", "uss_mb", mem["uss"], "MB", better="lower",
           ranks=n, rank=comm.rank)

    grid = dt.ProcessGrid((1, n, 1, 1))
    tmp = comm.bcast(tempfile.mkdtemp(prefix="dt-startup-") if comm.rank == 0 else None)
    try:
        if "step" not in skip:
            warm = comm.allreduce(int(is_warm()), op=MPI.MIN)
            fresh = os.path.join(tmp, "fresh")
            (t1, c1), (t2, c2) = with_plan_dir(comm, fresh,
                                               lambda: timed_steps(comm, grid, args.size, 2))
            if args.baseline:  # the same with reuse (and half-extent proxies) off
                base_env = ("DISTTENSOR_CONV_TUNE_SIMILAR", "DISTTENSOR_CONV_TUNE_PREFILTER",
                            "DISTTENSOR_CONV_TUNE_ONLINE", "DISTTENSOR_CONV_WORKSPACE_RATIO")
                saved = {v: os.environ.get(v) for v in base_env}
                os.environ.update({v: "off" for v in base_env})
                try:
                    (b1, bc1), _ = with_plan_dir(comm, os.path.join(tmp, "base"),
                                                 lambda: timed_steps(comm, grid, args.size, 2))
                finally:
                    for v, old in saved.items():
                        if old is None:
                            os.environ.pop(v, None)
                        else:
                            os.environ[v] = old
                say(f"baseline first step (every candidate of every layer-pass timed at full "
                    f"size): {b1:.2f} s (cpu {bc1:.2f}); with proxies and the model prefilter: "
                    f"ratio {c1 / bc1:.2f} (cpu), {t1 / b1:.2f} (wall)")
                record("startup", f"cosmoflow {args.size}^3 first step (warm kernels, no plans)",
                       "proxy_over_full_tuning_cpu", c1 / bc1, "x", better="lower", ranks=n,
                       rank=comm.rank)
            say(f"first step CosmoFlow {args.size}^3 x4 batch 4, {n} rank(s), kernel cache "
                f"{'warm' if warm else 'COLD'}, empty plan cache: {t1:.2f} s (cpu {c1:.2f}); "
                f"second step {t2:.2f} s (cpu {c2:.2f}); rss after "
                f"{comm.allreduce(_memory_mb()['rss'], op=MPI.MAX):.0f} MB")
            tgt = 10.0 if args.size >= 128 else None
            record("startup", f"cosmoflow {args.size}^3 first step (warm kernels, no plans)",
                   "first_step_s", t1, "s", target=tgt, better="lower", ranks=n,
                   rank=comm.rank)
            record("startup", f"cosmoflow {args.size}^3 first step (warm kernels, no plans)",
                   "first_over_second", t1 / t2, "x", better="lower", ranks=n, rank=comm.rank)
            if "new" not in skip:
                new = args.new_size or max(16, (args.size * 3 // 4) // 16 * 16)
                res = {}
                for mode in ("reuse", "off"):
                    d = os.path.join(tmp, mode)
                    if comm.rank == 0:
                        shutil.copytree(fresh, d)
                    comm.Barrier()
                    if mode == "off":
                        os.environ["DISTTENSOR_CONV_TUNE_SIMILAR"] = "off"
                    try:
                        res[mode] = with_plan_dir(comm, d,
                                                  lambda: timed_steps(comm, grid, new, 1))[0]
                    finally:
                        os.environ.pop("DISTTENSOR_CONV_TUNE_SIMILAR", None)
                say(f"new shape {new}^3 first step with plans of {args.size}^3: reusing "
                    f"similar plans {res['reuse'][0]:.2f} s (cpu {res['reuse'][1]:.2f}), "
                    f"tuning it {res['off'][0]:.2f} s (cpu {res['off'][1]:.2f}): ratio "
                    f"{res['reuse'][1] / res['off'][1]:.2f} (cpu)")
                record("startup", f"cosmoflow {new}^3 first step after {args.size}^3",
                       "reuse_over_tuning_cpu", res["reuse"][1] / res["off"][1], "x",
                       better="lower", ranks=n, rank=comm.rank)
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)

    # 4. activation memory per rank vs one rank
    if "memory" not in skip and n > 1:
        dims = (1,) + tuple(MPI.Compute_dims(n, 2)) + (1,)
        held, peak = activation_bytes(dt.ProcessGrid(dims), args.mem_size)
        held, peak = comm.allreduce(held, op=MPI.MAX), comm.allreduce(peak, op=MPI.MAX)
        one = activation_bytes(dt.ProcessGrid((1, 1, 1, 1), comm=MPI.COMM_SELF),
                               args.mem_size) if comm.rank == 0 else (1, 1)
        say(f"activation memory CosmoFlow {args.mem_size}^3 batch 4 on grid {dims}: held after "
            f"forward {held / 2**20:.1f} MiB/rank vs {one[0] / 2**20:.1f} MiB on 1 rank "
            f"(ratio {held / one[0]:.3f}); peak fwd+bwd {peak / 2**20:.1f} vs "
            f"{one[1] / 2**20:.1f} MiB (ratio {peak / one[1]:.3f})")
        record("startup", f"cosmoflow {args.mem_size}^3 grid {dims}", "activations_vs_1rank",
               held / one[0], "x", target=0.3 if n == 4 else None, better="lower", ranks=n,
               rank=comm.rank)
        record("startup", f"cosmoflow {args.mem_size}^3 grid {dims}", "peak_vs_1rank",
               peak / one[1], "x", better="lower", ranks=n, rank=comm.rank)


if __name__ == "__main__":
    main()
