"""Strong scaling of whole training steps on 2 ranks: one rank, the spatial split, the sample
split and PyTorch on 1 and 2 threads, all in one run, interleaved rep by rep.

    mpiexec -n 2 python -m mpi4py bench/step_scaling_bench.py [--sizes 32,64] [--unet]
    PYTHONPATH=/path/to/torch mpiexec -n 2 ...        # adds the PyTorch columns

One training step = forward, loss, backward, gradient sums
(:class:`disttensor.nn.DistributedDataParallel` on the 2-rank grids) and an Adam update, batch
``--batch`` (default 4):

* **CosmoFlow** (:func:`disttensor.nn.models.cosmoflow`), widths ``--widths`` (default
  16,32,64,128), dense 64 -> 32 -> 4, MSE loss, on ``--sizes``^3 x 4 samples;
* **U-Net** (``--unet``; :func:`disttensor.nn.models.unet3d`), encoder (16, 16), (32, 32),
  bottom (64, 64) (the widths 16, 32, 64), 1 input channel, 3 classes, batch-norm statistics
  over the whole batch, cross-entropy loss, at ``--unet-size``^3 (default 32).

Cases per model (one thread per rank, set here if unset; a rank sitting a case out sleeps
outside MPI, ``_timing.quiet_wait``; under ``bench/run_all.py`` the ranks run with the
repository's ``build/libmpi_idle_sleep.so`` preloaded, which this script gives a 2 ms spin
budget where ranks do not outnumber cores, ``_timing.spin_before_sleep``: a wait polls for up
to 2 ms before it sleeps, so a 2-rank step's meetings do not each end in a ~55 us sleep that
users, running without the shim, never pay; the CPU-time figures then count that polling as
work):
``1``: rank 0 alone on a one-rank grid over ``COMM_SELF`` (rank 1 waits); ``spatial``: grid
``(1, 2, 1, 1)`` (depth split); ``samples``: grid ``(2, 1, 1, 1)``; ``torch1``/``torch2``:
the same model in PyTorch on rank 0 with 1 and 2 intra-op threads (the other rank waits;
skipped when ``torch`` does not import).  ``--spatial-modes`` adds spatial cases run with
``DISTTENSOR_HALO_OVERLAP`` set to each mode (``off``, ``on``, ``poll``, ``thread``; see
``docs/performance.md``), to compare halo overlap in the same run.

A case's time is the median over ``--reps`` of the slowest rank's wall time; figures:
``efficiency`` = t(1) / (2 t(2 ranks)) and ``cpu_efficiency`` = CPU time of the 1-rank step
over the CPU time of the 2-rank step summed over both ranks (the work the split adds; it is
insensitive to other jobs taking the cores, which the wall time is not).  Figures go to
``$DISTTENSOR_BENCH_CSV`` (bench ``step_scaling``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

for _v in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import spin_before_sleep  # noqa: E402

# before MPI starts: waits poll for up to 2 ms before the idle-sleep shim sleeps, where ranks
# do not outnumber cores (bench/_timing.spin_before_sleep, bench/README.md "MPI waits")
SPIN_NS = spin_before_sleep()

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402
from _timing import compare, wall_and_cpu  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor import nn  # noqa: E402
from disttensor.autograd import Tensor  # noqa: E402
from disttensor.nn import functional as F  # noqa: E402

COMM = MPI.COMM_WORLD
DENSE = (64, 32)
UNET = dict(encoder=((16, 16), (32, 32)), bottom=(64, 64))


def load_torch():
    try:
        import torch
        return torch
    except Exception:  # noqa: BLE001 - optional peer
        return None


# -- the models in disttensor -----------------------------------------------------------------
def ours(kind: str, size: int, widths, grid, batch: int):
    """A step function of the model on ``grid`` (None: this rank sits the case out)."""
    if grid is None:
        return None
    rng = np.random.default_rng(0)
    if kind == "cosmoflow":
        m = nn.models.cosmoflow(input_size=size, in_channels=4, widths=widths, dense=DENSE,
                                outputs=4, rng=rng)
        xg = np.random.default_rng(1).standard_normal((batch, 4) + (size,) * 3)
        yg = np.random.default_rng(2).uniform(-1, 1, (batch, 4))
        y = dt.from_global(yg.astype(np.float32), grid=grid, split=(0, None))
        loss_fn = F.mse_loss
    else:
        m = nn.models.unet3d(in_channels=1, classes=3, rng=rng, **UNET)
        xg = np.random.default_rng(1).standard_normal((batch, 1) + (size,) * 3)
        yg = np.random.default_rng(2).integers(0, 3, (batch,) + (size,) * 3)
        y = dt.from_global(yg, grid=grid, split=(0, 1, 2, 3))
        loss_fn = F.cross_entropy
    x = dt.from_global(xg.astype(np.float32), grid=grid, split=(0, None, 1, 2, 3))
    net = nn.DistributedDataParallel(m, grid) if grid.size > 1 else m
    opt = nn.optim.Adam(m.parameters(), lr=1e-4)

    def step():
        loss = loss_fn(net(Tensor(x)), Tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


# -- the same models in PyTorch -----------------------------------------------------------------
def theirs(torch, kind: str, size: int, widths, batch: int, threads: int):
    tnn = torch.nn
    if kind == "cosmoflow":
        layers, c = [], 4
        for w in widths:
            layers += [tnn.Conv3d(c, w, 3, padding=1), tnn.LeakyReLU(0.3), tnn.MaxPool3d(2)]
            c = w
        f = c * (size // 2 ** len(widths)) ** 3
        layers.append(tnn.Flatten())
        for d in DENSE:
            layers += [tnn.Linear(f, d), tnn.LeakyReLU(0.3)]
            f = d
        layers.append(tnn.Linear(f, 4))
        body = tnn.Sequential(*layers)
        m = lambda x: 1.2 * torch.tanh(body(x))  # noqa: E731
        params = list(body.parameters())
        x = torch.randn(batch, 4, size, size, size)
        y = torch.rand(batch, 4) * 2 - 1
        loss_fn = tnn.functional.mse_loss
    else:
        def block(cin, cout):
            return [tnn.Conv3d(cin, cout, 3, padding=1, bias=False), tnn.BatchNorm3d(cout),
                    tnn.LeakyReLU(0.01)]
        downs, c, skips = tnn.ModuleList(), 1, []
        for w1, w2 in UNET["encoder"]:
            downs.append(tnn.Sequential(*block(c, w1), *block(w1, w2)))
            skips.append(w2)
            c = w2
        b1, b2 = UNET["bottom"]
        bottom = tnn.Sequential(*block(c, b1), *block(b1, b2))
        c = b2
        ups, decs = tnn.ModuleList(), tnn.ModuleList()
        for s in reversed(skips):
            ups.append(tnn.ConvTranspose3d(c, c, 2, stride=2))
            decs.append(tnn.Sequential(*block(c + s, s), *block(s, s)))
            c = s
        out = tnn.Conv3d(c, 3, 1)
        mods = tnn.ModuleList([downs, bottom, ups, decs, out])

        def m(x):
            kept = []
            for d in downs:
                x = d(x)
                kept.append(x)
                x = tnn.functional.max_pool3d(x, 2)
            x = bottom(x)
            for u, d, s in zip(ups, decs, reversed(kept)):
                x = d(torch.cat([u(x), s], 1))
            return out(x)
        params = list(mods.parameters())
        x = torch.randn(batch, 1, size, size, size)
        y = torch.randint(0, 3, (batch, size, size, size))
        loss_fn = tnn.functional.cross_entropy
    opt = torch.optim.Adam(params, lr=1e-4)

    def step():
        prev = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            loss = loss_fn(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        finally:
            torch.set_num_threads(prev)
    return step


def with_env(name: str, value: str, fn):
    def run():
        prev = os.environ.get(name)
        os.environ[name] = value
        try:
            fn()
        finally:
            if prev is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = prev
    return run


def cases_for(args, torch, kind: str, size: int) -> dict:
    widths = args.widths if kind == "cosmoflow" else None
    me = COMM.rank
    self_grid = dt.ProcessGrid((1, 1, 1, 1), comm=MPI.COMM_SELF) if me == 0 else None
    spatial = dt.ProcessGrid((1, 2, 1, 1), comm=COMM)
    samples = dt.ProcessGrid((2, 1, 1, 1), comm=COMM)
    cases = {"1": ours(kind, size, widths, self_grid, args.batch),
             "spatial": ours(kind, size, widths, spatial, args.batch),
             "samples": ours(kind, size, widths, samples, args.batch)}
    for mode in args.spatial_modes:
        cases[f"spatial/{mode}"] = with_env("DISTTENSOR_HALO_OVERLAP", mode,
                                            ours(kind, size, widths, spatial, args.batch))
    if torch is not None:
        for th in (1, 2):
            cases[f"torch{th}"] = theirs(torch, kind, size, widths, args.batch, th) \
                if me == 0 else None
    return {k: (f if f is not None else (lambda: None)) for k, f in cases.items()}


def run(args, torch, kind: str, size: int) -> None:
    fns = cases_for(args, torch, kind, size)
    cpu = {key: [] for key in fns}
    t = compare(fns, args.reps, args.warmup, timer=wall_and_cpu(fns, cpu))
    if COMM.rank:
        return
    c = {key: statistics.median(v) for key, v in cpu.items()}
    label = (f"cosmoflow {size}^3 widths {','.join(map(str, args.widths))}"
             if kind == "cosmoflow" else f"unet {size}^3 widths 16,32,64") + \
        f" batch {args.batch} adam"
    t1 = t["1"]
    print(f"{label}: 1 rank {t1 * 1e3:.1f} ms", flush=True)
    targets = {("cosmoflow", 32): 0.85, ("cosmoflow", 64): 0.92, ("unet", 32): 0.85}
    for key in fns:
        if key == "1":
            continue
        tk = t[key]
        if key.startswith("torch"):
            print(f"  {key:16s} {tk * 1e3:8.1f} ms  (ours on 1 rank / this {t1 / tk:.2f})",
                  flush=True)
            record("step_scaling", f"{label}: {key}", "ours_1rank_over_torch", t1 / tk, "x",
                   better="lower", ranks=2)
            continue
        eff, ceff = t1 / (2 * tk), c["1"] / c[key]
        print(f"  {key:16s} {tk * 1e3:8.1f} ms  efficiency {eff:.3f}  CPU-time efficiency "
              f"{ceff:.3f}", flush=True)
        target = targets.get((kind, size)) if key == "spatial" else None
        record("step_scaling", f"{label}: {key}", "efficiency", eff, "fraction",
               target=target, ranks=2)
        record("step_scaling", f"{label}: {key}", "cpu_efficiency", ceff, "fraction", ranks=2)
    if "samples" in t:
        gap = t1 / (2 * t["samples"]) - t1 / (2 * t["spatial"])
        print(f"  sample - spatial efficiency gap {gap:.3f}", flush=True)
        record("step_scaling", f"{label}", "samples_minus_spatial_efficiency", gap,
               "fraction", target=0.05, better="lower", ranks=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="32,64")
    ap.add_argument("--widths", default="16,32,64,128")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--unet", action="store_true", help="also the U-Net step")
    ap.add_argument("--unet-only", action="store_true")
    ap.add_argument("--unet-size", type=int, default=32)
    ap.add_argument("--spatial-modes", default="", help="comma list of DISTTENSOR_HALO_OVERLAP "
                    "modes to add as spatial cases (off,on,poll,thread)")
    ap.add_argument("--tune", default=None, help="DISTTENSOR_CONV_TUNE for the run (default: "
                    "as configured; 'off': one fixed conv kernel on every block shape, so the "
                    "figures measure the distribution, not the tuner's choices per shape)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=30,
                    help="steps before timing (online conv tuning settles a fresh plan cache "
                         "in up to 25 calls per pass)")
    args = ap.parse_args()
    if COMM.size != 2:
        raise SystemExit("step_scaling_bench runs on exactly 2 ranks")
    args.widths = tuple(int(v) for v in args.widths.split(","))
    args.spatial_modes = [m for m in args.spatial_modes.split(",") if m]
    if args.tune:
        os.environ["DISTTENSOR_CONV_TUNE"] = args.tune
    torch = None if args.no_torch else load_torch()
    if COMM.rank == 0:
        print(f"# step_scaling_bench: 2 ranks, median of {args.reps} interleaved reps after "
              f"{args.warmup} warm-up; PyTorch {torch.__version__ if torch else 'absent'}; "
              f"DISTTENSOR_CONV_TUNE={os.environ.get('DISTTENSOR_CONV_TUNE')}; "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
    if not args.unet_only:
        for size in (int(s) for s in args.sizes.split(",")):
            run(args, torch, "cosmoflow", size)
    if args.unet or args.unet_only:
        run(args, torch, "unet", args.unet_size)
    if COMM.rank == 0:
        print(f"# load after {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
