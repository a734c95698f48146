"""CPU convolution benchmarks: our local conv3d algorithms vs torch.nn.functional.conv3d
(PyTorch CPU, oneDNN, where PyTorch happens to be installed; it is not a dependency) on the
CosmoFlow and 3D U-Net layer shapes, and the distributed conv on all ranks vs the same conv on
one rank.

Run on one rank for the local figures, two ranks for the distributed one::

    OPENBLAS_THREAD_TIMEOUT=4 .venv/bin/python bench/conv_bench.py --local [--quick]
    mpiexec -n 2 .venv/bin/python bench/conv_bench.py --distributed

Every figure is a ratio against a baseline measured in the same run, interleaved rep by rep
(median of ``--reps``).  Local layers (k=3 'same', float32, batch ``--batch``): CosmoFlow's
conv layers on a ``--size``^3 input (default 64: 4->32 on 64^3 ... 256->512 on 4^3) and the
3D U-Net's (encoder, bottom, decoder, 1x1 head) on a ``--unet-size``^3 input (default 32).
Our algorithms: ``im2col`` (:mod:`disttensor.ops.local.cpu.conv_im2col`, tiled columns + BLAS)
and every entry of :data:`disttensor.ops.local.cpu.conv_direct.ALGORITHMS`; "best" takes the
fastest algorithm per pass (forward, backward data, backward filter), as the planner would.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _results import record  # noqa: E402
from _timing import compare, timed, wall  # noqa: E402
from disttensor.ops.local.cpu import conv_direct as cpu_conv_direct  # noqa: E402
from disttensor.ops.local.cpu import conv_im2col as cpu_conv  # noqa: E402

ONE = (1, 1, 1)
ZERO = (0, 0, 0)


def cosmoflow_layers(size):
    """(name, cin, cout, spatial, k) of CosmoFlow's conv layers (MLPerf widths) at size^3."""
    out, c, s = [], 4, size
    for w in (32, 64, 128, 256, 512):
        if s < 2:
            break
        out.append((f"cosmoflow {c}->{w} @{s}^3", c, w, s, 3))
        c, s = w, s // 2
    return out


def unet_layers(size):
    """(name, cin, cout, spatial, k) of the 3D U-Net's conv layers (3 levels, 1 input channel,
    3 classes) at size^3, transposed convolutions left out."""
    enc = ((32, 64), (64, 128), (128, 256))
    out, c, s, skips = [], 1, size, []
    for lvl, (w1, w2) in enumerate(enc):
        out += [(f"unet enc{lvl}a {c}->{w1} @{s}^3", c, w1, s, 3),
                (f"unet enc{lvl}b {w1}->{w2} @{s}^3", w1, w2, s, 3)]
        skips.append((w2, s))
        c, s = w2, s // 2
    out += [(f"unet bottom_a {c}->256 @{s}^3", c, 256, s, 3),
            (f"unet bottom_b 256->512 @{s}^3", 256, 512, s, 3)]
    c = 512
    for lvl, (skip, s) in reversed(list(enumerate(skips))):
        out += [(f"unet dec{lvl}a {c + skip}->{skip} @{s}^3", c + skip, skip, s, 3),
                (f"unet dec{lvl}b {skip}->{skip} @{s}^3", skip, skip, s, 3)]
        c = skip
    out.append((f"unet head {c}->3 k1 @{size}^3", c, 3, size, 1))
    return out


def _algorithms(x_shape, w_shape, pad):
    """name -> (forward, backward_data, backward_filter) of each of our algorithms that
    supports the layer (stride 1, 'same' padding ``pad``, float32)."""
    algos = {"im2col": (cpu_conv.conv_forward, cpu_conv.conv_backward_data,
                        cpu_conv.conv_backward_filter)}
    if x_shape[0] > 1:
        algos["im2col_batched"] = (cpu_conv.conv_forward_batched,
                                   cpu_conv.conv_backward_data_batched,
                                   cpu_conv.conv_backward_filter_batched)
    for name, a in cpu_conv_direct.ALGORITHMS.items():
        if all(a.supports(ps, x_shape, w_shape, ONE, ONE, pad, pad, 1, np.float32)
               for ps in ("forward", "backward_data", "backward_filter")):
            algos[name] = (a.forward, a.backward_data, a.backward_filter)
    return algos


def local_bench(args) -> None:
    try:
        import torch
        import torch.nn.functional as F
        torch.set_num_threads(args.threads or os.cpu_count() or 1)
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    layers = cosmoflow_layers(args.size) + unet_layers(args.unet_size)
    seen, uniq = {}, []
    for name, cin, cout, n, k in layers:      # a shape shared by both models is timed once
        key = (cin, cout, n, k)
        if key in seen:
            uniq[seen[key]] = (uniq[seen[key]][0] + " = " + name.split(" @")[0],) + key
        else:
            seen[key] = len(uniq)
            uniq.append((name,) + key)
    if args.quick:   # CosmoFlow's layers (all but 32->64 shared with U-Net), U-Net's widest
        keep = ("cosmoflow", "dec2a", "head")   # decoder layer at 8^3 and its 1x1 head
        uniq = [u for u in uniq if any(t in u[0] for t in keep)]
    print(f"# local conv3d 'same' float32, batch {args.batch}, threads: numba "
          f"{os.environ.get('NUMBA_NUM_THREADS', 'default')}, torch "
          f"{'not installed' if torch is None else torch.__version__}; OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', '')}")
    passes = ("fwd", "bwdd", "bwdf")
    for name, cin, cout, n, k in uniq:
        p = k // 2
        pad = (p, p, p)
        x = rng.standard_normal((args.batch, cin, n, n, n)).astype(np.float32)
        w = (rng.standard_normal((cout, cin, k, k, k)) / np.sqrt(cin * k ** 3)).astype(
            np.float32)
        dy = rng.standard_normal((args.batch, cout, n, n, n)).astype(np.float32)
        algos = _algorithms(x.shape, w.shape, pad)
        fns = {}
        y0 = dx0 = dw0 = None
        for an, (f, bd, bf) in algos.items():
            # every algorithm agrees with im2col (float32 tolerance) before anything is timed
            y = f(x, w, ONE, ONE, pad, pad, 1)
            dx = bd(dy, w, x.shape[2:], ONE, ONE, pad, pad, 1)
            dw = bf(x, dy, w.shape[2:], ONE, ONE, pad, pad, 1)
            if y0 is None:
                y0, dx0, dw0 = y, dx, dw
            for a, b in ((y, y0), (dx, dx0), (dw, dw0)):
                err = np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)
                assert err < 1e-4, (an, err)
            fns[an + ":fwd"] = lambda f=f: f(x, w, ONE, ONE, pad, pad, 1)
            fns[an + ":bwdd"] = lambda bd=bd: bd(dy, w, x.shape[2:], ONE, ONE, pad, pad, 1)
            fns[an + ":bwdf"] = lambda bf=bf: bf(x, dy, w.shape[2:], ONE, ONE, pad, pad, 1)
        if torch is not None:
            xt, wt, dyt = (torch.from_numpy(a) for a in (x, w, dy))

            def torch_fwd():
                with torch.no_grad():
                    F.conv3d(xt, wt, padding=p)

            def torch_fwdbwd():
                xr = xt.clone().requires_grad_(True)
                wr = wt.clone().requires_grad_(True)
                F.conv3d(xr, wr, padding=p).backward(dyt)
            fns["torch:fwd"] = torch_fwd
            fns["torch:fwdbwd"] = torch_fwdbwd
        t = compare(fns, args.reps, args.warmup, timer=wall)
        flops = 2 * args.batch * cout * cin * k ** 3 * n ** 3
        best = {ps: min(algos, key=lambda a: t[f"{a}:{ps}"]) for ps in passes}
        tb = {ps: t[f"{best[ps]}:{ps}"] for ps in passes}
        t_fb = tb["fwd"] + tb["bwdd"] + tb["bwdf"]
        per = "  ".join(f"{an} " + "/".join(f"{t[f'{an}:{ps}'] * 1e3:.1f}" for ps in passes)
                        for an in algos)
        line = (f"{name}: ms fwd/bwd-data/bwd-filter {per};  best {tb['fwd'] * 1e3:.1f} "
                f"({flops / tb['fwd'] / 1e9:.0f} GFLOP/s, {best['fwd']}) / "
                f"{tb['bwdd'] * 1e3:.1f} ({best['bwdd']}) / {tb['bwdf'] * 1e3:.1f} "
                f"({best['bwdf']}), fwd+bwd {3 * flops / t_fb / 1e9:.0f} GFLOP/s")
        if torch is not None:
            r_f = t["torch:fwd"] / tb["fwd"]
            r_fb = t["torch:fwdbwd"] / t_fb
            line += (f";  torch fwd {t['torch:fwd'] * 1e3:.1f} ms "
                     f"({flops / t['torch:fwd'] / 1e9:.0f} GFLOP/s), fwd+bwd "
                     f"{t['torch:fwdbwd'] * 1e3:.1f} ms;  torch/ours fwd {r_f:.2f}x, "
                     f"fwd+bwd {r_fb:.2f}x")
            case = f"{name} b{args.batch}"
            record("conv", case, "torch_over_ours_fwd", r_f, "x", target=1.0, better="higher")
            record("conv", case, "torch_over_ours_fwdbwd", r_fb, "x", target=1.0,
                   better="higher")
        print(line, flush=True)


def distributed_bench(args) -> None:
    from mpi4py import MPI

    import disttensor as dt
    from disttensor.ops import convolution as C

    comm = MPI.COMM_WORLD
    p = comm.size
    rng = np.random.default_rng(1)
    s = args.size
    x = rng.standard_normal((args.batch, 4, s, s, s)).astype(np.float32)
    w = (rng.standard_normal((32, 4, 3, 3, 3)) / np.sqrt(108)).astype(np.float32)
    grid_all = dt.ProcessGrid((p,), comm=comm)
    grid_one = dt.ProcessGrid((1,), comm=MPI.COMM_SELF)
    xa = dt.from_global(x, grid=grid_all, split=(None, None, 0))
    x1 = dt.from_global(x, grid=grid_one, split=(None, None, 0))

    def step(xx, overlap=True):
        y, saved = C.conv_forward(xx, w, None, 1, "same", overlap=overlap)
        C.conv_backward(saved, y)

    for _ in range(args.warmup):
        step(xa)
        if comm.rank == 0:
            step(x1)
    t_all, t_one = [], []
    for _ in range(args.reps):
        t_all.append(timed(lambda: step(xa)))
        comm.Barrier()
        t0 = time.perf_counter()
        if comm.rank == 0:
            step(x1)
        t_one.append(comm.bcast(time.perf_counter() - t0, root=0))
    ta, t1 = statistics.median(t_all), statistics.median(t_one)
    t_ov = compare({"overlap": lambda: step(xa, True), "no": lambda: step(xa, False)},
                   args.reps, 1)
    if comm.rank == 0:
        print(f"# distributed conv3d 4->32 k=3 'same' float32 batch {args.batch} {s}^3, split "
              f"along D over {p} ranks; threads numba={os.environ.get('NUMBA_NUM_THREADS')} "
              f"blas={os.environ.get('OPENBLAS_NUM_THREADS')}")
        print(f"conv fwd+bwd: 1 rank {t1 * 1e3:.1f} ms, {p} ranks {ta * 1e3:.1f} ms, speedup "
              f"{t1 / ta:.2f}x (ideal {p}x), parallel efficiency {t1 / ta / p:.2f}")
        print(f"conv fwd+bwd on {p} ranks: interior overlapped with the halo exchange "
              f"{t_ov['overlap'] * 1e3:.1f} ms, exchange then compute {t_ov['no'] * 1e3:.1f} ms, "
              f"no-overlap/overlap {t_ov['no'] / t_ov['overlap']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--local", action="store_true")
    ap.add_argument("--distributed", action="store_true")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--unet-size", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=None, help="default 5 (3 with --quick)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="default 1 (0 with --quick: the agreement check runs each once)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    ap.add_argument("--quick", action="store_true",
                    help="--local: fewer layers (CosmoFlow's + U-Net's widest decoder and "
                         "head layers), 3 reps, no warm-up round")
    args = ap.parse_args()
    if args.reps is None:
        args.reps = 3 if args.quick else 5
    if args.warmup is None:
        args.warmup = 0 if args.quick else 1
    if not (args.local or args.distributed):
        args.local = True
    if args.local:
        local_bench(args)
    if args.distributed:
        distributed_bench(args)


if __name__ == "__main__":
    main()
