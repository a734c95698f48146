"""The optimizer's share of a training step: ``step()`` of Adam, AdamW, Adam with amsgrad,
SGD with momentum, RMSprop, Adagrad, NAdam and RAdam over the parameters of a CosmoFlow
(default 32^3 input, 4 channels, conv widths 16,32,64,128, dense 64,32 as in
``step_scaling_bench.py``: 360k float32 parameters in 14 arrays), with the compiled one-pass updates
(:mod:`disttensor.ops.local.cpu.optim_update`) against the NumPy passes through scratch
buffers that the optimizers take without them, in the same run, interleaved.

Every rank of a data- or spatially-parallel step updates every replicated parameter in full,
so this cost does not shrink with the number of ranks.  Two settings: *warm* (the
parameters, gradients and moments stay in cache between steps, as in a loop of ``step()``
alone) and *cold* (a 64 MB buffer is written before each step, as the convolutions of a real
step evict the optimizer's arrays).  One process, no MPI::

    python bench/optim_step_bench.py [--size 32] [--reps 60]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _results import record  # noqa: E402

from disttensor import nn  # noqa: E402
from disttensor.nn import optim_compiled  # noqa: E402
from disttensor.ops.local.cpu import optim_update  # noqa: E402

CASES = {
    "Adam": lambda ps: nn.optim.Adam(ps, lr=1e-4),
    "AdamW": lambda ps: nn.optim.AdamW(ps, lr=1e-4, weight_decay=1e-2),
    "Adam amsgrad": lambda ps: nn.optim.Adam(ps, lr=1e-4, amsgrad=True),
    "SGD momentum": lambda ps: nn.optim.SGD(ps, lr=1e-3, momentum=0.9, weight_decay=1e-4),
    "RMSprop": lambda ps: nn.optim.RMSprop(ps, lr=1e-3),
    "Adagrad": lambda ps: nn.optim.Adagrad(ps, lr=1e-2),
    "NAdam": lambda ps: nn.optim.NAdam(ps),
    "RAdam": lambda ps: nn.optim.RAdam(ps),
}


def refuse(*args) -> bool:
    """Stands in for a compiled update: takes nothing, so the NumPy path runs."""
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--reps", type=int, default=60)
    args = ap.parse_args()
    model = nn.models.cosmoflow(input_size=args.size, in_channels=4, widths=(16, 32, 64, 128),
                                dense=(64, 32), outputs=4, rng=np.random.default_rng(0))
    ps = list(model.parameters())
    rng = np.random.default_rng(1)
    for p in ps:
        p.grad = (rng.standard_normal(p.data.shape) * 1e-3).astype(p.data.dtype)
    n = sum(p.data.size for p in ps)
    real = {f: getattr(optim_update, f) for f in optim_update.__all__}
    evict = np.empty(64 * 2 ** 20 // 8)
    print(f"optimizer step over {len(ps)} parameters, {n} elements (float32), "
          f"{args.size}^3 CosmoFlow; medians of {args.reps} interleaved steps (ms)")
    print(f"{'optimizer':14s} {'cache':5s} {'compiled':>9s} {'NumPy':>9s} {'speed-up':>9s}")
    for name, make in CASES.items():
        opts = {"compiled": make(ps), "NumPy": make(ps)}
        times = {(k, c): [] for k in opts for c in ("warm", "cold")}
        for i in range(args.reps + 5):
            for k in (list(opts) if i % 2 else list(opts)[::-1]):
                for fn in real:
                    setattr(optim_compiled, fn, real[fn] if k == "compiled" else refuse)
                for cache in ("warm", "cold"):
                    if cache == "cold":
                        evict.fill(i)
                    t0 = time.perf_counter()
                    opts[k].step()
                    if i >= 5:
                        times[k, cache].append(time.perf_counter() - t0)
        for fn in real:
            setattr(optim_compiled, fn, real[fn])
        for cache in ("warm", "cold"):
            c = statistics.median(times["compiled", cache]) * 1e3
            p = statistics.median(times["NumPy", cache]) * 1e3
            print(f"{name:14s} {cache:5s} {c:9.3f} {p:9.3f} {p / c:8.2f}x")
            case = f"{name}, {args.size}^3 CosmoFlow parameters, {cache} cache"
            record("optim_step", case, "compiled_ms", c, "ms", better="lower")
            record("optim_step", case, "numpy_ms", p, "ms", better="lower")
            record("optim_step", case, "speedup", p / c, "x")


if __name__ == "__main__":
    main()
