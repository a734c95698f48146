"""The training command under MPI: loss curves on several grids equal the one-rank run, exact
resume, checkpoints on SIGTERM, and bad input refused on every rank before training starts.

The one-rank reference is the same ``disttensor.train.run`` on ``MPI.COMM_SELF`` (rank 0 runs
it, the result is broadcast), on the same files with the same seed and global batch.
"""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from mpi4py import MPI

from disttensor import train
from disttensor.io.synthetic import generate_synthetic
from conftest import assert_all_ranks, assert_raises_all

SIZE = MPI.COMM_WORLD.Get_size()
COSMO = ["cosmoflow", "--widths", "2,3", "--dense", "6", "--quiet", "--no-prefetch"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """16 training + 4 validation samples of 4 x 8^3 (and a 4^3 set), on every rank."""
    comm = MPI.COMM_WORLD
    root = comm.bcast(str(tmp_path_factory.mktemp("train")) if comm.rank == 0 else None)
    paths = {"train": os.path.join(root, "train"), "val": os.path.join(root, "val"),
             "tiny": os.path.join(root, "tiny"), "stacked": os.path.join(root, "s.h5")}
    generate_synthetic(paths["train"], 16, size=8, channels=4, seed=0, comm=comm)
    generate_synthetic(paths["val"], 4, size=8, channels=4, seed=1, comm=comm)
    generate_synthetic(paths["tiny"], 4, size=4, channels=4, seed=2, comm=comm)
    generate_synthetic(paths["stacked"], 16, size=8, channels=2, seed=0, layout="stacked",
                       comm=comm)
    return paths


def _args(data, out, *extra):
    return COSMO + ["--data", data["train"], "--val", data["val"], "--out", out, *extra]


def _reference(argv):
    """``train.run(argv)`` on one rank (rank 0, broadcast)."""
    comm = MPI.COMM_WORLD
    res = train.run(argv, comm=MPI.COMM_SELF) if comm.rank == 0 else None
    return comm.bcast(res, root=0)


def _out(tmp_root, name):
    comm = MPI.COMM_WORLD
    return comm.bcast(os.path.join(str(tmp_root), name) if comm.rank == 0 else None)


def _grids():
    if SIZE == 1:
        return ["1x1x1x1"]
    if SIZE == 2:
        return ["2x1x1x1", "1x2x1x1"]
    if SIZE == 3:
        return ["1x3x1x1", "1x1x3x1"]
    return ["1x2x2x1", "2x2x1x1", "4x1x1x1"]


@pytest.mark.parametrize("grid", _grids())
def test_loss_curve_matches_one_rank_float64(data, tmp_path, grid):
    """50 steps (16 samples, batch 4: 4 steps per epoch) in float64 on this grid give the
    one-rank loss curve and validation metrics to 1e-9."""
    comm = MPI.COMM_WORLD
    extra = ["--dtype", "float64", "--batch-size", "4", "--epochs", "13", "--max-steps", "50",
             "--lr", "3e-3", "--no-checkpoint"]
    ref = _reference(_args(data, _out(tmp_path, "ref"), "--grid", "1x1x1x1", *extra))
    got = train.run(_args(data, _out(tmp_path, "dist"), "--grid", grid, *extra))
    assert_all_ranks(comm, len(got.losses) == 50 == len(ref.losses),
                     f"{len(got.losses)} steps, reference {len(ref.losses)}")
    err = np.max(np.abs(np.subtract(got.losses, ref.losses)) / np.abs(ref.losses))
    assert_all_ranks(comm, err < 1e-9, f"loss curve differs from one rank by {err:.3g}")
    vals = [(g["val_loss"], r["val_loss"]) for g, r in zip(got.val, ref.val)]
    verr = max(abs(a - b) / abs(b) for a, b in vals)
    assert_all_ranks(comm, verr < 1e-9, f"validation differs by {verr:.3g}")
    assert_all_ranks(comm, got.grid == tuple(int(t) for t in grid.split("x")), "grid")


@pytest.mark.skipif(SIZE != 4, reason="float32 comparison on the 4-rank grids")
def test_loss_curve_float32_close(data, tmp_path):
    """float32: the same curve up to float32 rounding of sums taken in another order."""
    comm = MPI.COMM_WORLD
    extra = ["--batch-size", "4", "--epochs", "13", "--max-steps", "50", "--lr", "3e-3",
             "--no-checkpoint"]
    ref = _reference(_args(data, _out(tmp_path, "ref"), "--grid", "1x1x1x1", *extra))
    got = train.run(_args(data, _out(tmp_path, "dist"), "--grid", "2x2x1x1", *extra))
    err = np.max(np.abs(np.subtract(got.losses, ref.losses)) / np.abs(ref.losses))
    if comm.rank == 0:
        print(f"\nfloat32 loss curve, 50 steps, 2x2x1x1 vs 1 rank: max rel diff {err:.2e}")
    assert_all_ranks(comm, err < 1e-3, f"float32 loss curve differs by {err:.3g}")


def test_resume_continues_the_curve(data, tmp_path):
    """Stopping inside an epoch (--max-steps 6) and resuming gives exactly the losses and
    parameters of the uninterrupted run; so does resuming at an epoch boundary."""
    comm = MPI.COMM_WORLD
    grid = _grids()[0]
    base = ["--dtype", "float64", "--batch-size", "4", "--epochs", "3", "--grid", grid]
    whole = train.run(_args(data, _out(tmp_path, "whole"), *base))
    out = _out(tmp_path, "parts")
    first = train.run(_args(data, out, *base, "--max-steps", "6"))
    assert_all_ranks(comm, first.steps == 6 and first.epochs_done == 1, "stopped at step 6")
    rest = train.run(_args(data, out, *base, "--resume"))
    assert_all_ranks(comm, rest.losses == whole.losses,
                     f"resumed curve {rest.losses} != uninterrupted {whole.losses}")
    assert_all_ranks(comm, [v["val_loss"] for v in rest.val] ==
                     [v["val_loss"] for v in whole.val], "validation after resume")


def test_sigterm_checkpoints_and_resume_is_exact(data, tmp_path):
    """SIGTERM on one rank only: every rank stops at the same step with a checkpoint, and
    the resumed run finishes with the uninterrupted curve."""
    comm = MPI.COMM_WORLD
    grid = _grids()[0]
    base = ["--dtype", "float64", "--batch-size", "4", "--epochs", "2", "--grid", grid]
    whole = train.run(_args(data, _out(tmp_path, "whole"), *base))
    out = _out(tmp_path, "sig")

    def kill_last_rank(step):  # a real SIGTERM, delivered to one rank during step 3
        if step == 3 and comm.rank == SIZE - 1:
            os.kill(os.getpid(), signal.SIGTERM)
    part = train.run(_args(data, out, *base), on_step=kill_last_rank)
    steps = comm.allgather(part.steps)
    assert_all_ranks(comm, steps == [3] * SIZE, f"ranks stopped at steps {steps}, not 3")
    assert_all_ranks(comm, part.interrupted, "stopped by the signal")
    assert_all_ranks(comm, os.path.exists(os.path.join(out, train.CHECKPOINT)), "checkpoint")
    rest = train.run(_args(data, out, *base, "--resume"))
    assert_all_ranks(comm, rest.losses == whole.losses, "resumed curve after SIGTERM")


def test_metrics_csv_and_baseline(data, tmp_path):
    comm = MPI.COMM_WORLD
    out = _out(tmp_path, "m")
    res = train.run(_args(data, out, "--batch-size", "4", "--epochs", "2"))
    rows = open(os.path.join(out, train.METRICS)).read().splitlines()
    assert_all_ranks(comm, len(rows) == 3 and rows[0].startswith("val_loss,val_mae"),
                     f"metrics.csv: {rows}")
    m = res.val[-1]
    assert_all_ranks(comm, m["baseline_mae"] > 0 and np.isfinite(m["val_mae"]), str(m))


def test_unet_trains_on_segmentation_data(tmp_path):
    """The U-Net runs end to end on labelled data on this grid and equals one rank."""
    comm = MPI.COMM_WORLD
    root = _out(tmp_path, "seg")
    generate_synthetic(os.path.join(root, "train"), 8, size=8, channels=1, seed=0,
                       task="segmentation", classes=3, comm=comm)
    generate_synthetic(os.path.join(root, "val"), 2, size=8, channels=1, seed=1,
                       task="segmentation", classes=3, comm=comm)
    argv = ["unet3d", "--data", os.path.join(root, "train"), "--val", os.path.join(root, "val"),
            "--unet-widths", "2,3:3,4", "--batch-size", "2", "--epochs", "1", "--max-steps",
            "3", "--dtype", "float64", "--quiet", "--no-prefetch", "--no-checkpoint"]
    grid = {1: "1x1x1x1", 2: "1x1x2x1", 3: "1x3x1x1", 4: "2x1x2x1"}[SIZE]
    ref = _reference(argv + ["--out", os.path.join(root, "r"), "--grid", "1x1x1x1"])
    got = train.run(argv + ["--out", os.path.join(root, "d"), "--grid", grid])
    err = np.max(np.abs(np.subtract(got.losses, ref.losses)) / np.abs(ref.losses))
    assert_all_ranks(comm, len(got.losses) == 3 and err < 1e-9, f"U-Net curve differs {err}")


# -- bad input, refused on every rank before training --------------------------------------
def test_grid_size_must_match_ranks(data, tmp_path):
    assert_raises_all(MPI.COMM_WORLD, ValueError, "ranks but the job runs on",
                      lambda: train.run(_args(data, _out(tmp_path, "x"), "--grid",
                                              f"{SIZE + 1}x1x1x1")))


@pytest.mark.skipif(SIZE < 2, reason="needs a sample axis of 2 or more ranks")
def test_batch_must_divide_sample_axis(data, tmp_path):
    assert_raises_all(MPI.COMM_WORLD, ValueError, "not divisible",
                      lambda: train.run(_args(data, _out(tmp_path, "x"), "--grid",
                                              f"{SIZE}x1x1x1", "--batch-size",
                                              str(SIZE + 1))))


def test_sample_too_small_for_pooling(data, tmp_path):
    argv = COSMO[:1] + ["--widths", "2,3,4", "--dense", "4", "--quiet", "--data", data["tiny"],
                        "--val", data["tiny"], "--out", _out(tmp_path, "x"), "--batch-size",
                        "2"]
    assert_raises_all(MPI.COMM_WORLD, ValueError, "too small for 3 pooling stages",
                      lambda: train.run(argv))


def test_validation_shape_must_match(data, tmp_path):
    argv = _args(data, _out(tmp_path, "x"), "--batch-size", "2")
    argv[argv.index("--val") + 1] = data["tiny"]
    assert_raises_all(MPI.COMM_WORLD, ValueError, "validation samples have shape",
                      lambda: train.run(argv))


def test_checkpoint_of_another_model_is_refused(data, tmp_path):
    out = _out(tmp_path, "ck")
    train.run(_args(data, out, "--batch-size", "4", "--epochs", "1", "--max-steps", "1"))
    other = _args(data, out, "--batch-size", "4", "--epochs", "1", "--resume")
    other[other.index("--widths") + 1] = "3,3"
    assert_raises_all(MPI.COMM_WORLD, ValueError, "another model",
                      lambda: train.run(other))


@pytest.mark.skipif(SIZE < 2, reason="needs 2 ranks")
def test_arguments_differing_between_ranks(data, tmp_path):
    comm = MPI.COMM_WORLD
    lr = "1e-3" if comm.rank == 0 else "2e-3"
    assert_raises_all(comm, ValueError, r"differ between ranks.*'argv\[\d+\]' \(rank 0: '1e-3', "
                      r"rank 1: '2e-3'", lambda: train.run(_args(data, _out(tmp_path, "x"),
                                                                 "--lr", lr)))


def test_amp_needs_a_gpu(data, tmp_path):
    assert_raises_all(MPI.COMM_WORLD, ValueError, "--amp",
                      lambda: train.run(_args(data, _out(tmp_path, "x"), "--amp")))
