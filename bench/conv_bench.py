"""CPU convolution benchmarks: our local conv3d kernels vs a straightforward im2col +
numpy.matmul baseline (and torch.nn.functional.conv3d where PyTorch happens to be installed),
and the distributed conv on all ranks vs the same conv on one rank.

Run on one rank for the local figures, two ranks for the distributed one::

    .venv/bin/python bench/conv_bench.py --local
    mpiexec -n 2 .venv/bin/python bench/conv_bench.py --distributed

Every figure is a ratio against a baseline measured in the same run, interleaved rep by rep
(median of ``--reps``).  Local layers are CosmoFlow's first four conv layers (k=3, 'same') at
a reduced resolution (``--size``, default 64: 4->32 on 64^3, 32->64 on 32^3, 64->128 on 16^3,
128->256 on 8^3), float32, batch ``--batch``.
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

from _timing import compare, timed, wall  # noqa: E402
from disttensor.ops.local import cpu_conv  # noqa: E402

ONE = (1, 1, 1)


# -- the baseline: im2col of the whole input at once + one matmul ---------------------------------
def _cols(x, k):
    """(N, C, D, H, W) padded by 1 -> (N, C*27, D*H*W) column matrix, one big copy."""
    n, c = x.shape[:2]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k, k), axis=(2, 3, 4))
    d, h, w = win.shape[2:5]
    return np.ascontiguousarray(win.transpose(0, 1, 5, 6, 7, 2, 3, 4)).reshape(n, c * k ** 3,
                                                                              d * h * w)


def baseline_forward(x, w):
    n = x.shape[0]
    cols = _cols(x, w.shape[2])
    y = np.matmul(w.reshape(w.shape[0], -1), cols)
    return y.reshape((n, w.shape[0]) + x.shape[2:])


def baseline_backward(x, w, dy):
    n, c = x.shape[:2]
    k = w.shape[2]
    cols = _cols(x, k)
    dyf = dy.reshape(n, dy.shape[1], -1)
    dw = np.einsum("nop,nkp->ok", dyf, cols).reshape(w.shape)
    dcols = np.matmul(w.reshape(w.shape[0], -1).T, dyf).reshape((n, c, k, k, k) + x.shape[2:])
    dxp = np.zeros((n, c) + tuple(s + 2 for s in x.shape[2:]), dtype=x.dtype)
    d, h, ww = x.shape[2:]
    for a in range(k):
        for b in range(k):
            for e in range(k):
                dxp[:, :, a:a + d, b:b + h, e:e + ww] += dcols[:, :, a, b, e]
    return dxp[:, :, 1:-1, 1:-1, 1:-1], dw


def ours_forward(x, w):
    return cpu_conv.conv_forward(x, w, ONE, ONE, ONE, ONE, 1)


def ours_backward(x, w, dy):
    dx = cpu_conv.conv_backward_data(dy, w, x.shape[2:], ONE, ONE, ONE, ONE, 1)
    dw = cpu_conv.conv_backward_filter(x, dy, w.shape[2:], ONE, ONE, ONE, ONE, 1)
    return dx, dw


def local_bench(args) -> None:
    try:
        import torch
        import torch.nn.functional as F
        torch.set_num_threads(os.cpu_count() or 1)
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    s = args.size
    layers = [(4, 32, s), (32, 64, s // 2), (64, 128, s // 4), (128, 256, s // 8)]
    print(f"# local conv3d k=3 'same' float32, batch {args.batch}, threads: numba "
          f"{os.environ.get('NUMBA_NUM_THREADS', 'default')}, torch "
          f"{'not installed' if torch is None else torch.__version__}")
    for cin, cout, n in layers:
        x = rng.standard_normal((args.batch, cin, n, n, n)).astype(np.float32)
        w = (rng.standard_normal((cout, cin, 3, 3, 3)) / np.sqrt(cin * 27)).astype(np.float32)
        dy = rng.standard_normal((args.batch, cout, n, n, n)).astype(np.float32)
        # the two implementations agree (float32 tolerance) before anything is timed
        yo, yb = ours_forward(x, w), baseline_forward(x, w)
        dxo, dwo = ours_backward(x, w, dy)
        dxb, dwb = baseline_backward(x, w, dy)
        for a, b in ((yo, yb), (dxo, dxb), (dwo, dwb)):
            err = np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)
            assert err < 1e-4, err
        fns = {"ours_fwd": lambda: ours_forward(x, w), "base_fwd": lambda: baseline_forward(x, w),
               "ours_bwd": lambda: ours_backward(x, w, dy),
               "base_bwd": lambda: baseline_backward(x, w, dy)}
        if torch is not None:
            xt, wt, dyt = (torch.from_numpy(a) for a in (x, w, dy))

            def torch_fwd():
                with torch.no_grad():
                    F.conv3d(xt, wt, padding=1)

            def torch_bwd():
                xr = xt.clone().requires_grad_(True)
                wr = wt.clone().requires_grad_(True)
                F.conv3d(xr, wr, padding=1).backward(dyt)
            fns["torch_fwd"] = torch_fwd
            fns["torch_fwdbwd"] = torch_bwd
        t = compare(fns, args.reps, args.warmup, timer=wall)
        flops = 2 * args.batch * cout * cin * 27 * n ** 3
        line = (f"conv3d {cin:>3}->{cout:<3} {n:>3}^3: fwd ours {t['ours_fwd'] * 1e3:8.1f} ms "
                f"({flops / t['ours_fwd'] / 1e9:5.1f} GFLOP/s)  im2col+matmul/ours "
                f"{t['base_fwd'] / t['ours_fwd']:.2f}x;  bwd(data+filter) ours "
                f"{t['ours_bwd'] * 1e3:8.1f} ms  im2col+matmul/ours "
                f"{t['base_bwd'] / t['ours_bwd']:.2f}x")
        if torch is not None:
            line += (f";  torch fwd/ours {t['torch_fwd'] / t['ours_fwd']:.2f}x, torch fwd+bwd/"
                     f"ours {t['torch_fwdbwd'] / (t['ours_fwd'] + t['ours_bwd']):.2f}x")
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
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args()
    if not (args.local or args.distributed):
        args.local = True
    if args.local:
        local_bench(args)
    if args.distributed:
        distributed_bench(args)


if __name__ == "__main__":
    main()
