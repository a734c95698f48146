"""Parity (not a benchmark, not a test): every loss of ``disttensor.nn.losses`` and its input
gradient against PyTorch 2.13 CPU in float64, on a sample split and a spatial split of the
same arrays (uneven blocks), every reduction.

One line per configuration: ``max |ours - torch| / max |torch|`` of the loss (the per-voxel
loss for ``reduction='none'``) and of the input gradient (for ``'none'`` the backward of a
fixed random per-voxel gradient).  The soft Dice loss is not in PyTorch: its oracle is MONAI's
documented formula written with torch operations (autograd gives the gradient).  PyTorch is
an oracle only here::

    mpiexec -n 1 .venv/bin/python bench/parity_losses.py
    mpiexec -n 2 .venv/bin/python bench/parity_losses.py

``--speed`` (one process) times forward + backward of cross-entropy (labels, weights,
smoothing), soft Dice and DiceCE at a U-Net activation shape against PyTorch CPU in the same
run (medians of ``--repeats``; PyTorch and Numba on the same thread count,
``NUMBA_NUM_THREADS``).
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as TF  # noqa: E402
from mpi4py import MPI  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor.autograd import Tensor  # noqa: E402
from disttensor.nn import losses as L  # noqa: E402

COMM = MPI.COMM_WORLD
SIZE, RANK = COMM.Get_size(), COMM.Get_rank()
SHAPE = (3, 4, 5, 7)                      # (N, C, H, W): uneven on 2 ranks
LAYOUTS = {"sample": ((SIZE, 1), (0, None, None, 1)),
           "spatial": ((1, SIZE), (0, None, 1, None))}


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.abs(b).max(initial=0.0)
    err = np.abs(a - b).max(initial=0.0)
    return float(err / scale) if scale > 0 else float(err)


def dist(a, layout, drop_channel=False):
    dims, split = layout
    if drop_channel:
        split = split[:1] + split[2:]
    return dt.from_global(np.ascontiguousarray(a), grid=dt.ProcessGrid(dims), split=split)


def monai_dice(p, t, include_background, squared, jaccard, reduction, snr, sdr, batch,
               weight):
    """MONAI's DiceLoss.forward after its activation / one-hot steps, in torch."""
    if not include_background and p.shape[1] > 1:
        p, t = p[:, 1:], t[:, 1:]
    axes = list(range(2, p.ndim))
    if batch:
        axes = [0] + axes
    inter = (p * t).sum(axes)
    ground = (t * t if squared else t).sum(axes)
    pred = (p * p if squared else p).sum(axes)
    den = ground + pred
    if jaccard:
        den = 2.0 * (den - inter)
    f = 1.0 - (2.0 * inter + snr) / (den + sdr)
    if weight is not None and p.shape[1] != 1:
        f = f * torch.as_tensor(weight)
    return {"mean": f.mean, "sum": f.sum, "none": lambda: f}[reduction]()


def cases(rng):
    x = rng.standard_normal(SHAPE) * 2
    labels = rng.integers(0, SHAPE[1], (SHAPE[0],) + SHAPE[2:])
    labels_ign = labels.copy()
    labels_ign[0, :2] = -100
    probs = rng.dirichlet(np.ones(SHAPE[1]), SHAPE[:1] + SHAPE[2:]).transpose(0, 3, 1, 2)
    w = rng.uniform(0.3, 2.0, SHAPE[1])
    t = rng.standard_normal(SHAPE)
    t01 = rng.uniform(0, 1, SHAPE)
    xp01 = rng.uniform(0.02, 0.98, SHAPE)
    bw = rng.uniform(0.5, 1.5, (SHAPE[1], 1, 1))
    yield "cross_entropy labels", x, labels, {}, "class"
    yield "cross_entropy weight+ignore", x, labels_ign, dict(weight=w), "class"
    yield "cross_entropy smoothing 0.1 weight", x, labels_ign, \
        dict(weight=w, label_smoothing=0.1), "class"
    yield "cross_entropy probabilities", x, probs, dict(weight=w, label_smoothing=0.2), "prob"
    yield "nll_loss weight+ignore", x, labels_ign, dict(weight=w), "nll"
    yield "mse_loss", x, t, {}, "mse_loss"
    yield "l1_loss", x, t, {}, "l1_loss"
    yield "smooth_l1_loss beta=0.5", x, t, dict(beta=0.5), "smooth_l1_loss"
    yield "huber_loss delta=0.7", x, t, dict(delta=0.7), "huber_loss"
    yield "bce_with_logits w, pos_weight", x * 10, t01, dict(weight=bw, pos_weight=bw * 2), \
        "binary_cross_entropy_with_logits"
    yield "binary_cross_entropy w", xp01, t01, dict(weight=bw), "binary_cross_entropy"
    for opts in (dict(softmax=True), dict(sigmoid=True, batch=True, squared_pred=True),
                 dict(softmax=True, include_background=False, jaccard=True,
                      weight=[1.0, 2.0, 0.5])):
        yield "dice " + ",".join(k if v is True else f"{k}={v}" for k, v in opts.items()), \
            x, labels, opts, "dice"
    yield "dice_ce nnU-Net style, ce_weight, smoothing", x, labels, \
        dict(softmax=True, include_background=False, smooth_nr=1.0, smooth_dr=1.0,
             ce_weight=w, label_smoothing=0.1, lambda_ce=0.5), "dice_ce"


def torch_loss(kind, name, x, target, opts, reduction):
    xt = torch.tensor(x, requires_grad=True)
    if kind in ("class", "prob"):
        kw = {k: torch.tensor(v) if k == "weight" else v for k, v in opts.items()}
        return xt, TF.cross_entropy(xt, torch.tensor(target), reduction=reduction, **kw)
    if kind == "nll":
        return xt, TF.nll_loss(TF.log_softmax(xt, 1), torch.tensor(target),
                               weight=torch.tensor(opts["weight"]), reduction=reduction)
    if kind == "dice_ce":
        oh = TF.one_hot(torch.tensor(target), SHAPE[1]).movedim(-1, 1).double()
        dice = monai_dice(torch.softmax(xt, 1), oh, False, False, False, reduction, 1.0, 1.0,
                          False, None)
        ce = TF.cross_entropy(xt, torch.tensor(target), weight=torch.tensor(opts["ce_weight"]),
                              label_smoothing=0.1, reduction=reduction)
        return xt, dice + 0.5 * ce
    if kind == "dice":
        p = torch.softmax(xt, 1) if opts.get("softmax") else torch.sigmoid(xt)
        oh = TF.one_hot(torch.tensor(target), SHAPE[1]).movedim(-1, 1).double()
        return xt, monai_dice(p, oh, opts.get("include_background", True),
                              opts.get("squared_pred", False), opts.get("jaccard", False),
                              reduction, 1e-5, 1e-5, opts.get("batch", False),
                              opts.get("weight"))
    kw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in opts.items()}
    return xt, getattr(TF, kind)(xt, torch.tensor(target), reduction=reduction, **kw)


def ours(kind, x, target, opts, reduction, layout):
    X = Tensor(dist(x, layout), requires_grad=True)
    if kind in ("class", "nll"):
        T = dist(target, layout, drop_channel=True)
    elif kind in ("dice", "dice_ce"):
        T = dist(target, layout, drop_channel=True)
    else:
        T = dist(target, layout)
    if kind == "nll":
        lx = dt.nn.functional.log_softmax(X) if hasattr(dt, "nn") else None
        return X, L.nll_loss(lx, T, weight=opts["weight"], reduction=reduction)
    if kind in ("class", "prob"):
        return X, L.cross_entropy(X, T, reduction=reduction, **opts)
    if kind == "dice":
        return X, L.dice_loss(X, T, reduction=reduction, **opts)
    if kind == "dice_ce":
        return X, L.dice_ce_loss(X, T, reduction=reduction, **opts)
    return X, getattr(L, kind)(X, T, reduction=reduction, **opts)


def main():
    import disttensor.nn  # noqa: F401  (dt.nn)
    rng = np.random.default_rng(0)
    rows = []
    for name, x, target, opts, kind in cases(rng):
        for reduction in ("mean", "sum") + (("none",) if kind != "dice_ce" else ()):
            xt, lt = torch_loss(kind, name, x, target, opts, reduction)
            gout = rng.uniform(0.5, 1.5, tuple(lt.shape)) if reduction == "none" else None
            lt.backward(torch.tensor(gout) if gout is not None else None)
            for lname, layout in LAYOUTS.items():
                X, loss = ours(kind, x, target, opts, reduction, layout)
                if reduction == "none" and kind != "dice":
                    like = loss.data
                    g = dt.from_global(gout, grid=like.grid, split=like.split)
                    value = like.to_numpy()
                else:
                    g = gout if gout is not None else None
                    value = loss.data
                loss.backward(g)
                rows.append((name, reduction, lname, rel(value, lt.detach().numpy()),
                             rel(X.grad.to_numpy(), xt.grad.numpy())))
    if RANK == 0:
        print(f"losses vs PyTorch {torch.__version__} CPU float64, {SIZE} rank(s), shape "
              f"{SHAPE}: max relative error")
        print(f"{'loss':42s} {'reduction':9s} {'layout':8s} {'loss':>9s} {'d input':>9s}")
        for r in rows:
            print(f"{r[0]:42s} {r[1]:9s} {r[2]:8s} {r[3]:9.1e} {r[4]:9.1e}")
        print(f"worst: loss {max(r[3] for r in rows):.1e}, gradient "
              f"{max(r[4] for r in rows):.1e}")


def speed(repeats: int, shape=(2, 4, 48, 48, 48)):
    """Median seconds of forward + backward, ours vs PyTorch, on one process."""
    import time

    import numba
    torch.set_num_threads(numba.get_num_threads())
    rng = np.random.default_rng(1)
    g = dt.ProcessGrid((1, 1), comm=MPI.COMM_SELF)
    split = (0, None, 1) + (None,) * (len(shape) - 3)
    for dtype in (np.float32, np.float64):
        x = rng.standard_normal(shape).astype(dtype)
        lab = rng.integers(0, shape[1], shape[:1] + shape[2:])
        w = rng.uniform(0.5, 2, shape[1])
        X = dt.from_global(x, grid=g, split=split)
        Lb = dt.from_global(lab, grid=g, split=split[:1] + split[2:])

        def ours_ce():
            xt = Tensor(X, requires_grad=True)
            L.cross_entropy(xt, Lb, weight=w, label_smoothing=0.1).backward()

        def torch_ce():
            xt = torch.tensor(x, requires_grad=True)
            TF.cross_entropy(xt, torch.tensor(lab), weight=torch.tensor(w, dtype=xt.dtype),
                             label_smoothing=0.1).backward()

        def ours_dice():
            xt = Tensor(X, requires_grad=True)
            L.dice_loss(xt, Lb, softmax=True, include_background=False).backward()

        def torch_dice():
            xt = torch.tensor(x, requires_grad=True)
            oh = TF.one_hot(torch.tensor(lab), shape[1]).movedim(-1, 1).to(xt.dtype)
            monai_dice(torch.softmax(xt, 1), oh, False, False, False, "mean", 1e-5, 1e-5,
                       False, None).backward()

        def ours_dice_ce():
            xt = Tensor(X, requires_grad=True)
            L.dice_ce_loss(xt, Lb, softmax=True, include_background=False).backward()

        def torch_dice_ce():
            xt = torch.tensor(x, requires_grad=True)
            oh = TF.one_hot(torch.tensor(lab), shape[1]).movedim(-1, 1).to(xt.dtype)
            (monai_dice(torch.softmax(xt, 1), oh, False, False, False, "mean", 1e-5, 1e-5,
                        False, None) + TF.cross_entropy(xt, torch.tensor(lab))).backward()

        for name, a, b in (("cross_entropy", ours_ce, torch_ce), ("dice", ours_dice, torch_dice),
                           ("dice_ce", ours_dice_ce, torch_dice_ce)):
            times = {}
            for who, fn in (("ours", a), ("torch", b)):
                fn()
                ts = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t0)
                times[who] = float(np.median(ts))
            print(f"{name:14s} {np.dtype(dtype).name:8s} {shape}  ours {times['ours']:.4f} s  "
                  f"torch {times['torch']:.4f} s  ratio {times['ours'] / times['torch']:.2f}x")


if __name__ == "__main__":
    if "--speed" in sys.argv:
        reps = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 7
        speed(reps)
    else:
        main()
