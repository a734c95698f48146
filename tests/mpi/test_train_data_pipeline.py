"""The training command's read-time data pipeline (--channels-last, --x-dtype, --log1p,
--crop, --augment) on raw CosmoFlow int16 files: the loss curve on this grid equals the
one-rank run (the crops, flips and permutations do not depend on the grid), a run stopped
inside an epoch and resumed reads the same crops, and bad options raise on every rank."""
from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

from disttensor import train
from disttensor.io.synthetic import generate_synthetic
from conftest import assert_all_ranks, assert_raises_all

SIZE = MPI.COMM_WORLD.Get_size()
PIPE = ["cosmoflow", "--widths", "2,3", "--dense", "6", "--quiet", "--no-prefetch",
        "--channels-last", "--log1p", "--crop", "8", "--augment", "all", "--dtype", "float64",
        "--batch-size", "4", "--no-tensorboard", "--no-plots"]


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """8 training + 4 validation raw samples (int16 10^3 x 2, D,H,W,C)."""
    comm = MPI.COMM_WORLD
    root = comm.bcast(str(tmp_path_factory.mktemp("rawtrain")) if comm.rank == 0 else None)
    tr, va = os.path.join(root, "train"), os.path.join(root, "val")
    generate_synthetic(tr, 8, size=10, channels=2, seed=0, layout="raw", comm=comm)
    generate_synthetic(va, 4, size=10, channels=2, seed=1, layout="raw", comm=comm)
    return tr, va, root


def _argv(raw, out, *extra):
    return PIPE + ["--data", raw[0], "--val", raw[1], "--out", out, *extra]


def _out(root, name):
    return os.path.join(root, f"{name}-n{SIZE}")


def _grid():
    return {1: "1x1x1x1", 2: "1x2x1x1", 3: "1x1x3x1"}.get(SIZE, "2x2x1x1")


def test_pipeline_loss_curve_matches_one_rank_and_resumes(raw):
    comm = MPI.COMM_WORLD
    extra = ["--epochs", "2", "--lr", "3e-3"]
    ref = train.run(_argv(raw, _out(raw[2], "ref"), "--grid", "1x1x1x1", *extra),
                    comm=MPI.COMM_SELF) if comm.rank == 0 else None
    ref = comm.bcast(ref, root=0)
    got = train.run(_argv(raw, _out(raw[2], "dist"), "--grid", _grid(), *extra))
    assert_all_ranks(comm, len(got.losses) == len(ref.losses) == 4, f"{len(got.losses)}")
    err = np.max(np.abs(np.subtract(got.losses, ref.losses)) / np.abs(ref.losses))
    assert_all_ranks(comm, err < 1e-9, f"loss curve differs from one rank by {err:.3g}")
    verr = max(abs(g["val_loss"] - r["val_loss"]) / abs(r["val_loss"])
               for g, r in zip(got.val, ref.val))
    assert_all_ranks(comm, verr < 1e-9, f"validation differs by {verr:.3g}")
    # stopped inside epoch 2 and resumed: the resumed batches see the epoch's crops
    out = _out(raw[2], "parts")
    train.run(_argv(raw, out, "--grid", _grid(), *extra, "--max-steps", "3"))
    rest = train.run(_argv(raw, out, "--grid", _grid(), *extra, "--resume"))
    assert_all_ranks(comm, np.allclose(rest.losses, got.losses, rtol=1e-12, atol=0),
                     f"resumed {rest.losses} != {got.losses}")


def test_bad_pipeline_options_raise_on_every_rank(raw):
    comm = MPI.COMM_WORLD
    for opts, exc, match in [(["--crop", "12"], ValueError, "larger than"),
                             (["--crop", "8,8"], ValueError, "crop must be"),
                             (["--x-dtype", "int8"], TypeError, "cannot convert")]:
        argv = _argv(raw, _out(raw[2], "bad"), "--grid", _grid(), "--epochs", "1")
        i = argv.index(opts[0]) if opts[0] in argv else None
        if i is not None:
            argv[i + 1] = opts[1]
        else:
            argv += opts
        assert_raises_all(comm, exc, match, lambda: train.run(argv))
