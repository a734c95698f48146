"""Parity of disttensor's GroupNorm, InstanceNorm1d/2d/3d and LayerNorm with PyTorch 2.13 CPU.

Float64, forward and every gradient (input, weight, bias) of each layer on a few shapes, the
input split over all ranks along a spatial axis (balanced: uneven blocks, empty ones with more
ranks than rows) and, from 2 ranks, along the sample axis; gathered and compared on rank 0
with PyTorch's: ``max |ours - torch| / max |torch|`` per array, and instance norm's running
statistics after two training steps.  PyTorch is an oracle only here::

    .venv/bin/python bench/parity_normalization.py
    mpiexec -n 2 .venv/bin/python -m mpi4py bench/parity_normalization.py
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor.autograd import Tensor  # noqa: E402
from disttensor.nn import normalization as N  # noqa: E402

from _results import record  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()

# name, shape, our layer, PyTorch's layer (same arguments)
CASES = [
    ("GroupNorm(4, 8)", (2, 8, 5, 6, 7), lambda: N.GroupNorm(4, 8, dtype="float64"),
     lambda: torch.nn.GroupNorm(4, 8)),
    ("GroupNorm(1, 6) 2d", (3, 6, 9, 5), lambda: N.GroupNorm(1, 6, dtype="float64"),
     lambda: torch.nn.GroupNorm(1, 6)),
    ("InstanceNorm3d(4, affine)", (2, 4, 6, 5, 3),
     lambda: N.InstanceNorm3d(4, affine=True, dtype="float64"),
     lambda: torch.nn.InstanceNorm3d(4, affine=True)),
    ("InstanceNorm2d(3, affine)", (3, 3, 7, 4),
     lambda: N.InstanceNorm2d(3, affine=True, dtype="float64"),
     lambda: torch.nn.InstanceNorm2d(3, affine=True)),
    ("InstanceNorm1d(5, affine)", (4, 5, 9),
     lambda: N.InstanceNorm1d(5, affine=True, dtype="float64"),
     lambda: torch.nn.InstanceNorm1d(5, affine=True)),
    ("LayerNorm(C,D,H,W)", (2, 3, 5, 4, 6), lambda: N.LayerNorm((3, 5, 4, 6), dtype="float64"),
     lambda: torch.nn.LayerNorm((3, 5, 4, 6))),
    ("LayerNorm(H,W)", (2, 3, 7, 5), lambda: N.LayerNorm((7, 5), dtype="float64"),
     lambda: torch.nn.LayerNorm((7, 5))),
]


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.abs(b).max() if b.size else 0.0
    diff = np.abs(a - b).max() if b.size else 0.0
    return float(diff / scale) if scale > 0 else float(diff)


def _randomize(ours, theirs, rng):
    """Random affine parameters, the same in both layers."""
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            v = rng.standard_normal(tuple(p.shape)) * 0.5 + (1.0 if name == "weight" else 0.0)
            p.copy_(torch.from_numpy(v))
            getattr(ours, name).data[...] = v


def compare(case, split, grid):
    name, shape, make_ours, make_theirs = case
    rng = np.random.default_rng(len(name))
    x = rng.standard_normal(shape) * 2.5 + 1.0
    dy = rng.standard_normal(shape)
    ours, theirs = make_ours(), make_theirs().double()
    _randomize(ours, theirs, rng)
    xd = Tensor(dt.from_global(x, grid=grid, split=split), requires_grad=True)
    y = ours(xd)
    y.backward(dt.from_global(dy, grid=grid, split=split))
    got = {"y": y.data.to_numpy(), "dx": xd.grad.to_numpy(),
           "dweight": np.asarray(ours.weight.grad), "dbias": np.asarray(ours.bias.grad)}
    tx = torch.from_numpy(x).requires_grad_()
    ty = theirs(tx)
    ty.backward(torch.from_numpy(dy))
    want = {"y": ty.detach().numpy(), "dx": tx.grad.numpy(),
            "dweight": theirs.weight.grad.numpy(), "dbias": theirs.bias.grad.numpy()}
    return {k: rel(got[k], want[k]) for k in want}


def running_stats(grid, split):
    """InstanceNorm3d(track_running_stats=True): running mean/var after two steps."""
    ours = N.InstanceNorm3d(3, momentum=0.2, track_running_stats=True, dtype="float64")
    theirs = torch.nn.InstanceNorm3d(3, momentum=0.2, track_running_stats=True).double()
    rng = np.random.default_rng(5)
    for _ in range(2):
        x = rng.standard_normal((3, 3, 4, 5, 6)) * 2 + 3
        ours(Tensor(dt.from_global(x, grid=grid, split=split)))
        theirs(torch.from_numpy(x))
    return (rel(ours.running_mean, theirs.running_mean.numpy()),
            rel(ours.running_var, theirs.running_var.numpy()))


def main():
    grid = dt.ProcessGrid((SIZE,))
    rows = []
    for case in CASES:
        nd = len(case[1])
        splits = {"spatial": tuple(0 if i == 2 else None for i in range(nd))}
        if SIZE > 1:
            splits["sample"] = (0,) + (None,) * (nd - 1)
        for sname, split in splits.items():
            rows.append((case[0], sname, compare(case, split, grid)))
    rm, rv = running_stats(grid, (None, None, 0, None, None))
    worst = 0.0
    if RANK == 0:
        print(f"disttensor vs PyTorch {torch.__version__} CPU, float64, {SIZE} rank(s): "
              "max |ours - torch| / max |torch|")
        print(f"{'layer':28s} {'split':8s} {'y':>9s} {'dx':>9s} {'dweight':>9s} {'dbias':>9s}")
        for name, sname, errs in rows:
            print(f"{name:28s} {sname:8s} " + " ".join(f"{errs[k]:9.2e}" for k in
                                                      ("y", "dx", "dweight", "dbias")))
            worst = max(worst, *errs.values())
            for k, v in errs.items():
                record("parity_normalization", f"{name} {sname}", f"rel_err_{k}", v, "",
                       target=1e-12, better="lower", ranks=SIZE)
        print(f"InstanceNorm3d running_mean {rm:.2e}  running_var {rv:.2e} (two steps)")
        worst = max(worst, rm, rv)
        print(f"worst {worst:.2e}")
    return worst


if __name__ == "__main__":
    main()
