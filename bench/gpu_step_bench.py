"""A CosmoFlow training step at 128^3 on one GPU: disttensor (CuPy blocks, cuDNN / RawKernels)
vs the same architecture in PyTorch eager on the same GPU.

Ours: ``nn.models.cosmoflow`` (MLPerf HPC's layout: five stages of Conv3d k3 'same' ->
LeakyReLU(0.3) -> MaxPool3d 2 with 32..512 filters, dense 128 -> 64 -> 4, ``1.2 * tanh``) on a
one-rank grid over ``MPI.COMM_SELF`` with CuPy blocks, Adam, ``F.mse_loss``; one step is
forward, loss, ``zero_grad``, backward, ``opt.step()``.  PyTorch: the same layers
(``torch.nn.Conv3d`` ...), float32, Adam, ``mse_loss``, eager, PyTorch's default cuDNN
settings (TF32 convolutions allowed, ``cudnn.benchmark`` off); it is only a peer to compare
with and is skipped (ours still timed) where it is not installed or sees no GPU.

The two steps are called interleaved rep by rep (who goes first rotates) after warm-up steps
(NVRTC compilation, cuDNN plans, memory pools); each time is the wall time of one step between
two device synchronisations, and each figure the median over the reps.  One line:

    cosmoflow 128^3 batch 4 float32: ours 123.4 ms  torch 98.7 ms  torch/ours 0.80

Figures go to ``$DISTTENSOR_BENCH_CSV`` (``bench/_results.py``, device ``gpu``):
``torch_over_ours_step`` (target 1.0: as fast as PyTorch) and each side's ``step_s``.
Without CuPy or a GPU it says so and exits 0.

    python bench/gpu_step_bench.py [--quick] [--size 128] [--batch 4] [--reps 5]

``--quick``: batch 2, 3 reps.  ``--cpu-smoke``: the same code on the CPU at 16^3 (checks the
script where there is no GPU; records nothing).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402
from _timing import compare, gpu_module  # noqa: E402

SLOPE, SCALE = 0.3, 1.2


def ours_step(args, device):
    """A function running one training step of disttensor's CosmoFlow on a 1-rank grid."""
    from mpi4py import MPI

    import disttensor as dt
    from disttensor import nn
    from disttensor.autograd import Tensor
    from disttensor.nn import functional as F

    grid = dt.ProcessGrid((1, 1, 1, 1), comm=MPI.COMM_SELF)
    model = nn.models.cosmoflow(input_size=args.size, in_channels=4, widths=args.widths,
                                dense=args.dense, outputs=4, negative_slope=SLOPE,
                                output_scale=SCALE, device=device,
                                rng=np.random.default_rng(0))
    opt = nn.optim.Adam(model.parameters(), lr=1e-4)
    g = dt.random.default_rng(1)
    x = g.normal(shape=(args.batch, 4) + (args.size,) * 3, dtype="float32", grid=grid,
                 split=(0, None, 1, 2, 3), device=device)
    y = g.uniform(-1, 1, shape=(args.batch, 4), dtype="float32", grid=grid, split=(0, None),
                  device=device)

    def step():
        loss = F.mse_loss(model(Tensor(x)), Tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return step, x.to_numpy(), y.to_numpy()


def torch_step(args, torch, device, x_host, y_host):
    """The same architecture and step in PyTorch eager."""
    tnn = torch.nn

    class ScaledTanh(tnn.Module):
        def forward(self, v):
            return SCALE * torch.tanh(v)

    layers, c, s = [], 4, args.size
    for w in args.widths:
        layers += [tnn.Conv3d(c, w, 3, padding=1), tnn.LeakyReLU(SLOPE), tnn.MaxPool3d(2)]
        c, s = w, s // 2
    layers.append(tnn.Flatten())
    f = c * s ** 3
    for d in args.dense:
        layers += [tnn.Linear(f, d), tnn.LeakyReLU(SLOPE)]
        f = d
    layers += [tnn.Linear(f, 4), ScaledTanh()]
    model = tnn.Sequential(*layers).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.as_tensor(x_host).to(device)
    y = torch.as_tensor(y_host).to(device)

    def step():
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step


def _torch(gpu: bool):
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return None, f"PyTorch is not installed ({type(e).__name__})"
    if gpu and not torch.cuda.is_available():
        return None, "PyTorch sees no CUDA GPU"
    return torch, ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="batch 2, 3 reps")
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--batch", type=int, default=None, help="default 4 (quick: 2)")
    ap.add_argument("--widths", default="32,64,128,256,512")
    ap.add_argument("--dense", default="128,64")
    ap.add_argument("--reps", type=int, default=None, help="default 5 (quick: 3)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-torch", action="store_true", help="time ours alone")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run the same code on the CPU at 16^3, record nothing")
    args = ap.parse_args(argv)
    args.batch = args.batch or (2 if args.quick else 4)
    args.reps = args.reps or (3 if args.quick else 5)
    args.widths = tuple(int(w) for w in args.widths.split(","))
    args.dense = tuple(int(d) for d in args.dense.split(","))

    if args.cpu_smoke:
        args.size, args.widths, args.dense, args.batch = 16, (8, 16), (16, 8), 2
        args.reps, args.warmup = 2, 1
        cp, device, tdevice = None, "cpu", "cpu"
        sync = lambda: None  # noqa: E731
        rec = lambda *a, **k: None  # noqa: E731
    else:
        cp = gpu_module()
        if cp is None:
            print("gpu_step_bench: no CUDA GPU (or no CuPy) here; nothing to measure")
            return 0
        device, tdevice = "cuda", "cuda"
        sync = cp.cuda.runtime.deviceSynchronize
        rec = record

    def timer(fn):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    case = f"cosmoflow {args.size}^3 batch {args.batch} float32"
    print(f"# {case}, widths {args.widths}, dense {args.dense}; reps {args.reps}, warm-up "
          f"{args.warmup}; device {device}; conv planner DISTTENSOR_CONV_TUNE="
          f"{os.environ.get('DISTTENSOR_CONV_TUNE', '(default)')}, DISTTENSOR_CONV_WORKSPACE_MB="
          f"{os.environ.get('DISTTENSOR_CONV_WORKSPACE_MB', '(default)')}", flush=True)
    t0 = time.perf_counter()
    ours, x_host, y_host = ours_step(args, device)
    steps = {"ours": ours}
    torch, why = (None, "--no-torch") if args.no_torch else _torch(cp is not None)
    if torch is not None:
        try:
            steps["torch"] = torch_step(args, torch, tdevice, x_host, y_host)
            print(f"# PyTorch {torch.__version__}, cuDNN "
                  f"{torch.backends.cudnn.version() if cp is not None else '-'}", flush=True)
        except Exception as e:  # noqa: BLE001 - the peer failing must not hide our figure
            why = f"PyTorch step could not be built ({type(e).__name__}: {e})"
    if "torch" not in steps:
        print(f"# no PyTorch comparison: {why}", flush=True)
    del x_host, y_host
    # the first step of each side alone: NVRTC compilation, cuDNN plans, pools (cold start)
    for name, fn in steps.items():
        print(f"# first {name} step (cold): {timer(fn) * 1e3:.1f} ms", flush=True)
    t = compare(steps, args.reps, max(0, args.warmup - 1), timer=timer)
    line = f"{case}: ours {t['ours'] * 1e3:.1f} ms"
    rec("gpu_step", f"{case} ours", "step_s", t["ours"], "s", better="lower", device="gpu")
    if "torch" in t:
        ratio = t["torch"] / t["ours"]
        line += f"  torch {t['torch'] * 1e3:.1f} ms  torch/ours {ratio:.2f}"
        rec("gpu_step", f"{case} torch", "step_s", t["torch"], "s", better="lower",
            device="gpu")
        rec("gpu_step", case, "torch_over_ours_step", ratio, "x", target=1.0,
            better="higher", device="gpu")
    print(line, flush=True)
    if cp is not None:
        pool = cp.get_default_memory_pool()
        print(f"# CuPy pool: {pool.total_bytes() / 2**30:.2f} GiB held; "
              f"{time.perf_counter() - t0:.0f} s in all", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
