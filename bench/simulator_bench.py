"""The scaling simulator against the seed's published strong scaling, and its predictions.

No MPI and nothing timed: :func:`disttensor.nn.perfmodel.simulate.simulate` on the shipped
machine descriptions.  Printed and recorded:

* the seed's two figures (Oyama, V100 + EDR InfiniBand): CosmoFlow 512^3, batch 64, 1.77x
  from 512 to 2,048 GPUs; 3D U-Net 256^3, batch 16, 1.42x from 256 to 512 GPUs; the
  simulator's speedup of the best grids with the shipped ``v100-edr`` description (target:
  within 25%, ``abs_error_fraction``);
* the calibration: the convolution's half-performance size that makes CosmoFlow's speedup
  1.77x (bisection), against the value shipped (``conv_half_elems``, one wave of output
  tiles); U-Net's 1.42x is then a prediction;
* the same speedups with each mechanism switched off alone (kernel efficiency vs local
  size, per-op host and launch cost, sample I/O, the spatially partitioned reader, a shared
  file-system limit of 200 GB/s, halo exchange not hidden, gradient all-reduce not overlapped
  with backward, a sample split over depth only), to show which effects move them;
* per model and device count (64 ... 2,048): the best grid, its step and memory per device
  on ``v100-edr`` and ``h100-ndr`` (the H100 figures are predictions).

    python bench/simulator_bench.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _results import record  # noqa: E402

from disttensor.nn.perfmodel.layerspec import (  # noqa: E402
    cosmoflow_layers, cosmoflow_sample_bytes, unet_layers, unet_sample_bytes)
from disttensor.nn.perfmodel.machine import H100_NDR, V100_EDR  # noqa: E402
from disttensor.nn.perfmodel.simulate import simulate, speedup  # noqa: E402

CF = ("cosmoflow 512^3 batch 64",
      cosmoflow_layers(512, 4, (16, 32, 64, 128, 256, 256, 256), (2048, 256), 4),
      (4, 512, 512, 512), 64, (512, 2048), 1.77)
UNET = ("unet 256^3 batch 16", unet_layers(1, 3), (1, 256, 256, 256), 16, (256, 512), 1.42)
SAMPLE_BYTES = {CF[0]: cosmoflow_sample_bytes(CF[2]), UNET[0]: unet_sample_bytes(UNET[2])}

#: (label, machine changes, simulate arguments): each mechanism switched off alone
VARIANTS = [
    ("no kernel-size effect (conv_half_elems 0)", dict(conv_half_elems=0.0), {}),
    ("no per-op host and launch cost", dict(host_op_s=0.0, launch_s=0.0), {}),
    ("no sample I/O", {}, dict(sample_bytes=0.0)),
    ("reader not spatially partitioned", {}, dict(spatial_io=False)),
    ("file system shared at 200 GB/s", dict(io_aggregate_bandwidth=200e9), {}),
    ("halo exchange not hidden", {}, dict(halo_overlap=False)),
    ("all-reduce after backward", {}, dict(overlap=False)),
]


def seed_speedup(case, machine=V100_EDR, **kw):
    """``(speedup, plan_from, plan_to)`` of a seed case on ``machine``."""
    name, layers, shape, batch, (a, b), _ = case
    kw.setdefault("sample_bytes", SAMPLE_BYTES[name])
    return speedup(layers, shape, batch, a, b, machine, **kw)


def calibrate_half(case=CF, lo=1e5, hi=1e8, steps=16):
    """The ``conv_half_elems`` at which ``case``'s simulated speedup equals its published
    one (bisection on a log scale; the speedup falls as the half size grows)."""
    for _ in range(steps):
        mid = (lo * hi) ** 0.5
        r, *_ = seed_speedup(case, V100_EDR.with_(conv_half_elems=mid))
        lo, hi = (mid, hi) if r > case[-1] else (lo, mid)
    return (lo * hi) ** 0.5


def depth_only(devices, batch):
    return [(batch, devices // batch, 1, 1)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer device counts in the table")
    args = p.parse_args(argv)
    fitted = calibrate_half()
    print(f"# calibration: conv_half_elems making CosmoFlow 1.77x = {fitted:.4g} output "
          f"elements; shipped {V100_EDR.conv_half_elems:.4g} (one wave of 128x128 tiles on "
          "80 SMs, 2 per SM)")
    record("simulator", "v100-edr calibration", "conv_half_elems_fitted", fitted, "elements")
    print("\n# the seed's strong scaling (Oyama, V100 + EDR): simulated vs published")
    print(f"{'model':26s} {'GPUs':>10s} {'published':>9s} {'simulated':>9s} {'error':>7s}  "
          "best grids, steps")
    for case in (CF, UNET):
        name, layers, shape, batch, (a, b), seed = case
        r, pa, pb = seed_speedup(case)
        err = r / seed - 1
        role = "calibrated" if case is CF else "predicted"
        print(f"{name:26s} {a:>4d}->{b:<5d} {seed:9.2f} {r:9.2f} {err:+7.0%}  "
              f"{'x'.join(map(str, pa.best.grid))} {pa.best.step_s * 1e3:.1f} ms -> "
              f"{'x'.join(map(str, pb.best.grid))} {pb.best.step_s * 1e3:.1f} ms ({role})")
        case_name = f"{name} {a}->{b} v100-edr"
        record("simulator", case_name, "speedup", r, "x")
        record("simulator", case_name, "published_speedup", seed, "x")
        record("simulator", case_name, "abs_error_fraction", abs(err), "fraction",
               target=0.25, better="lower")
        for label, changes, kw in VARIANTS:
            rv, va, vb = seed_speedup(case, V100_EDR.with_(**changes), **kw)
            print(f"{'':26s} {'':10s} {'':9s} {rv:9.2f} {rv / seed - 1:+7.0%}  ({label}: "
                  f"{va.best.step_s * 1e3:.1f} -> {vb.best.step_s * 1e3:.1f} ms)")
            record("simulator", f"{case_name} ({label})", "speedup", rv, "x")
        try:
            kw = dict(halo_overlap=False, overlap=False)
            pa = simulate(layers, shape, batch, a, V100_EDR, candidates=depth_only(a, batch),
                          sample_bytes=SAMPLE_BYTES[name], **kw)
            pb = simulate(layers, shape, batch, b, V100_EDR, candidates=depth_only(b, batch),
                          sample_bytes=SAMPLE_BYTES[name], **kw)
            rv = pa.best.step_s / pb.best.step_s
            print(f"{'':26s} {'':10s} {'':9s} {rv:9.2f} {rv / seed - 1:+7.0%}  (halos not "
                  "hidden, all-reduce after backward, one sample per group split over depth "
                  "only)")
            record("simulator", f"{case_name} (depth only, no overlap)", "speedup", rv, "x")
        except (ValueError, IndexError):
            print(f"{'':26s} {'':10s} {'':9s} {'-':>9s}          (depth only: invalid on "
                  f"{b} GPUs: a deep layer has fewer cells than ranks along depth)")
    counts = (64, 512, 2048) if args.quick else (64, 128, 256, 512, 1024, 2048)
    print("\n# best grid per device count: step ms, memory GiB per device (H100: predicted)")
    for name, layers, shape, batch, _, _ in (CF, UNET):
        print(f"{name}")
        print(f"  {'GPUs':>5s} | {'v100-edr grid':>14s} {'step ms':>9s} {'GiB':>5s} | "
              f"{'h100-ndr grid':>14s} {'step ms':>9s} {'GiB':>5s} | H100 over V100")
        for n in counts:
            row = []
            for m in (V100_EDR, H100_NDR):
                plan = simulate(layers, shape, batch, n, m, sample_bytes=SAMPLE_BYTES[name])
                if plan.ranked:
                    best = plan.best
                    row.append(("x".join(map(str, best.grid)), best.step_s,
                                best.memory["total"] / 2 ** 30))
                    record("simulator", f"{name} {n} GPUs {m.name}", "step_s", best.step_s,
                           "s", better="lower")
                else:
                    row.append(("none fits", float("nan"), float("nan")))
            cells = " | ".join(f"{g:>14s} {s * 1e3:9.1f} {gb:5.1f}" for g, s, gb in row)
            print(f"  {n:5d} | {cells} | {row[0][1] / row[1][1]:.2f}x")


if __name__ == "__main__":
    main()
