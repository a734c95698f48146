"""The scaling simulator against the seed's published strong scaling, and its predictions.

No MPI and nothing timed: :func:`disttensor.nn.perfmodel.simulate.simulate` on the shipped
machine descriptions.  Printed and recorded:

* the seed's two figures (Oyama, V100 + EDR InfiniBand): CosmoFlow 512^3, batch 64, 1.77x
  from 512 to 2,048 GPUs; 3D U-Net 256^3, batch 16, 1.42x from 256 to 512 GPUs; the
  simulator's speedup of the best grids with the shipped ``v100-edr`` description (target:
  within 25%, ``abs_error_fraction``);
* the same speedups under changed assumptions (halo exchange not hidden, gradient
  all-reduce not overlapped with backward, a sample split over depth only, each alone), to
  show which effects move them;
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

from disttensor.nn.perfmodel.layerspec import cosmoflow_layers, unet_layers  # noqa: E402
from disttensor.nn.perfmodel.machine import H100_NDR, V100_EDR  # noqa: E402
from disttensor.nn.perfmodel.simulate import simulate, speedup  # noqa: E402

CF = ("cosmoflow 512^3 batch 64",
      cosmoflow_layers(512, 4, (16, 32, 64, 128, 256, 256, 256), (2048, 256), 4),
      (4, 512, 512, 512), 64, (512, 2048), 1.77)
UNET = ("unet 256^3 batch 16", unet_layers(1, 3), (1, 256, 256, 256), 16, (256, 512), 1.42)


def depth_only(devices, batch):
    return [(batch, devices // batch, 1, 1)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer device counts in the table")
    args = p.parse_args(argv)
    print("# the seed's strong scaling (Oyama, V100 + EDR): simulated vs published")
    print(f"{'model':26s} {'GPUs':>10s} {'published':>9s} {'simulated':>9s} {'error':>7s}  "
          "best grids, steps")
    for name, layers, shape, batch, (a, b), seed in (CF, UNET):
        r, pa, pb = speedup(layers, shape, batch, a, b, V100_EDR)
        err = r / seed - 1
        print(f"{name:26s} {a:>4d}->{b:<5d} {seed:9.2f} {r:9.2f} {err:+7.0%}  "
              f"{'x'.join(map(str, pa.best.grid))} {pa.best.step_s * 1e3:.1f} ms -> "
              f"{'x'.join(map(str, pb.best.grid))} {pb.best.step_s * 1e3:.1f} ms")
        case = f"{name} {a}->{b} v100-edr"
        record("simulator", case, "speedup", r, "x")
        record("simulator", case, "published_speedup", seed, "x")
        record("simulator", case, "abs_error_fraction", abs(err), "fraction", target=0.25,
               better="lower")
        variants = [("halo exchange not hidden", dict(halo_overlap=False)),
                    ("all-reduce after backward", dict(overlap=False)),
                    ("both", dict(halo_overlap=False, overlap=False))]
        for label, kw in variants:
            rv, *_ = speedup(layers, shape, batch, a, b, V100_EDR, **kw)
            print(f"{'':26s} {'':10s} {'':9s} {rv:9.2f} {rv / seed - 1:+7.0%}  ({label})")
            record("simulator", f"{case} ({label})", "speedup", rv, "x")
        try:
            pa = simulate(layers, shape, batch, a, V100_EDR, halo_overlap=False, overlap=False,
                          candidates=depth_only(a, batch))
            pb = simulate(layers, shape, batch, b, V100_EDR, halo_overlap=False, overlap=False,
                          candidates=depth_only(b, batch))
            rv = pa.best.step_s / pb.best.step_s
            print(f"{'':26s} {'':10s} {'':9s} {rv:9.2f} {rv / seed - 1:+7.0%}  (both, one "
                  "sample per group split over depth only)")
            record("simulator", f"{case} (depth only, no overlap)", "speedup", rv, "x")
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
                plan = simulate(layers, shape, batch, n, m)
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
