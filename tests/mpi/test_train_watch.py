"""Watching a training run under MPI: TensorBoard event files against ``metrics.csv``, the
best checkpoint, the ``--target-mae`` stop and its time to train, the MLPerf HPC preset's
per-step learning rate and MLPerf log, the progress output on and off a terminal, and bad
options refused on every rank.

One short CosmoFlow run per module (4 x 8^3 samples, 2 steps per epoch, 3 epochs) is shared
by several tests; the event files are parsed here from their record framing (length, masked
CRC-32C, payload, masked CRC-32C) with tensorboardX's protobuf classes.
"""
from __future__ import annotations

import csv
import glob
import io
import json
import math
import os
import re
import struct
import sys

import numpy as np
import pytest
from mpi4py import MPI

from disttensor import train
from disttensor.io.synthetic import generate_synthetic
from conftest import assert_all_ranks, assert_raises_all

SIZE = MPI.COMM_WORLD.Get_size()
GRID = {1: "1x1x1x1", 2: "1x2x1x1", 3: "1x3x1x1", 4: "2x2x1x1"}.get(SIZE, f"1x{SIZE}x1x1")
COSMO = ["cosmoflow", "--widths", "2,3", "--dense", "6", "--no-prefetch", "--grid", GRID,
         "--batch-size", "4"]


def _bcast(value):
    return MPI.COMM_WORLD.bcast(value, root=0)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """8 training + 4 validation samples of 4 x 8^3 (on 3 ranks the depth splits 3/3/2)."""
    comm = MPI.COMM_WORLD
    root = _bcast(str(tmp_path_factory.mktemp("watch")) if comm.rank == 0 else None)
    paths = {"root": root, "train": os.path.join(root, "train"),
             "val": os.path.join(root, "val")}
    generate_synthetic(paths["train"], 8, size=8, channels=4, seed=0, comm=comm)
    generate_synthetic(paths["val"], 4, size=8, channels=4, seed=1, comm=comm)
    return paths


def _args(data, out, *extra):
    return COSMO + ["--data", data["train"], "--val", data["val"], "--out", out, *extra]


def _read_csv(path):
    def read():
        with open(path, newline="") as f:
            return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    return _bcast(read() if MPI.COMM_WORLD.rank == 0 else None)


def _events(directory):
    """``{tag: {step: value}}`` of every event file in ``directory`` (rank 0, broadcast),
    with each record's length and payload CRCs checked."""
    def read():
        from tensorboardX.crc32c import crc32c
        from tensorboardX.proto.event_pb2 import Event

        def masked(data):
            c = crc32c(data)
            return (((c >> 15) | (c << 17)) + 0xa282ead8) & 0xffffffff

        out = {}
        for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
            buf = open(path, "rb").read()
            pos = 0
            while pos < len(buf):
                head = buf[pos:pos + 8]
                (n,) = struct.unpack("<Q", head)
                (hcrc,) = struct.unpack("<I", buf[pos + 8:pos + 12])
                payload = buf[pos + 12:pos + 12 + n]
                (pcrc,) = struct.unpack("<I", buf[pos + 12 + n:pos + 16 + n])
                assert hcrc == masked(head) and pcrc == masked(payload), path
                pos += 16 + n
                ev = Event.FromString(payload)
                for v in ev.summary.value:
                    out.setdefault(v.tag, {})[ev.step] = v.simple_value
        return out
    return _bcast(read() if MPI.COMM_WORLD.rank == 0 else None)


def _scalars(path):
    """The scalars of a disttensor checkpoint (rank 0 reads, broadcast)."""
    def read():
        import h5py
        with h5py.File(path, "r") as f:
            return {k: (v.decode() if isinstance(v, bytes) else v.item() if hasattr(v, "item")
                        else v) for k, v in f["scalars"].attrs.items()}
    return _bcast(read() if MPI.COMM_WORLD.rank == 0 else None)


@pytest.fixture(scope="module")
def watched(data):
    """The shared run: 3 epochs of 2 steps, Adam at a rate high enough that the validation
    MAE moves; event files, best.h5, curves.png."""
    pytest.importorskip("tensorboardX")
    out = os.path.join(data["root"], "watched")
    res = train.run(_args(data, out, "--epochs", "3", "--lr", "5e-2", "--quiet"))
    return out, res


def test_event_file_matches_metrics_csv(watched):
    out, res = watched
    rows = _read_csv(os.path.join(out, train.METRICS))
    ev = _events(os.path.join(out, "tensorboard"))
    ok = len(rows) == 3 == res.epochs_done
    bad = []
    for row in rows:
        for key, value in row.items():
            if key in ("epoch", "step"):
                continue
            got = ev.get(f"epoch/{key}", {}).get(int(row["step"]))
            if got is None or not math.isclose(got, value, rel_tol=1e-6, abs_tol=1e-12):
                bad.append((key, int(row["epoch"]), got, value))
    ok = ok and not bad
    losses = ev.get("train/loss", {})
    steps_ok = sorted(losses) == list(range(1, 7))
    loss_err = max(abs(losses[s + 1] - v) / abs(v) for s, v in enumerate(res.losses)) \
        if steps_ok else math.inf
    lrs = ev.get("train/lr", {})
    assert_all_ranks(MPI.COMM_WORLD, ok and steps_ok and loss_err < 1e-6 and
                     all(math.isclose(v, 5e-2, rel_tol=1e-6) for v in lrs.values()) and
                     len(lrs) == 6 and len(ev.get("train/samples_per_s", {})) == 6,
                     f"event file vs metrics.csv: {len(rows)} rows, mismatches {bad[:4]}, "
                     f"loss steps {sorted(losses)}, loss error {loss_err}")


def test_best_checkpoint_is_the_best_epoch(watched):
    out, res = watched
    rows = _read_csv(os.path.join(out, train.METRICS))
    maes = [r["val_mae"] for r in rows]
    best = int(np.argmin(maes)) + 1
    b, last = _scalars(os.path.join(out, "best.h5")), _scalars(os.path.join(out, "checkpoint.h5"))
    val = json.loads(b["val"])
    assert_all_ranks(MPI.COMM_WORLD, b["epoch"] == best == res.best_epoch and
                     last["epoch"] == 3 and len(val) == best and
                     math.isclose(val[-1]["val_mae"], min(maes), rel_tol=1e-12),
                     f"best.h5 at epoch {b['epoch']}, result {res.best_epoch}, MAEs {maes}")


def test_curves_png(watched):
    pytest.importorskip("matplotlib")
    out, _ = watched
    head = _bcast(open(os.path.join(out, "curves.png"), "rb").read(8)
                  if MPI.COMM_WORLD.rank == 0 else None)
    assert_all_ranks(MPI.COMM_WORLD, head == b"\x89PNG\r\n\x1a\n", f"curves.png: {head!r}")


def test_target_mae_stops_at_first_epoch_reaching_it(watched, data, capsys):
    """The same run with --target-mae set to its second epoch's MAE stops at the first epoch
    whose MAE is at or below it, with that epoch's elapsed time as the time to train."""
    out0, _ = watched
    maes = [r["val_mae"] for r in _read_csv(os.path.join(out0, train.METRICS))]
    target = maes[1]
    expect = next(i for i, m in enumerate(maes) if m <= target) + 1
    out = os.path.join(data["root"], "target")
    res = train.run(_args(data, out, "--epochs", "3", "--lr", "5e-2", "--target-mae",
                          repr(target), "--no-tensorboard", "--no-plots"))
    rows = _read_csv(os.path.join(out, train.METRICS))
    text = capsys.readouterr().out
    line_ok = MPI.COMM_WORLD.rank != 0 or \
        f"target MAE {target} reached at epoch {expect}" in text
    assert_all_ranks(MPI.COMM_WORLD,
                     res.epochs_done == expect == len(rows) and
                     [r["target_reached"] for r in rows] == [0] * (expect - 1) + [1] and
                     res.time_to_train == rows[-1]["elapsed_s"] > 0 and line_ok and
                     [r["val_mae"] for r in rows] == maes[:expect],
                     f"stopped after {res.epochs_done} epochs (expected {expect}, MAEs {maes},"
                     f" target {target}); time to train {res.time_to_train}")


def test_resume_keeps_best_elapsed_and_events(watched, data):
    """Stopped after step 3 (inside epoch 2) and resumed: the same losses as the run without
    a stop, event files covering steps 1..6 between them, best.h5 at the best of all three
    epochs, elapsed_s increasing."""
    out0, res0 = watched
    out = os.path.join(data["root"], "resumed")
    argv = _args(data, out, "--epochs", "3", "--lr", "5e-2", "--quiet")
    first = train.run(argv + ["--max-steps", "3"])
    res = train.run(argv + ["--resume"])
    rows = _read_csv(os.path.join(out, train.METRICS))
    ev = _events(os.path.join(out, "tensorboard"))
    maes = [r["val_mae"] for r in rows]
    best = _scalars(os.path.join(out, "best.h5"))["epoch"]
    elapsed = [r["elapsed_s"] for r in rows]
    assert_all_ranks(MPI.COMM_WORLD,
                     first.steps == 3 and res.losses == res0.losses and len(rows) == 3 and
                     sorted(ev["train/loss"]) == list(range(1, 7)) and
                     best == int(np.argmin(maes)) + 1 == res.best_epoch and
                     elapsed == sorted(elapsed) and elapsed[0] > 0,
                     f"resumed: {len(res.losses)} losses, rows {len(rows)}, event steps "
                     f"{sorted(ev.get('train/loss', {}))}, best {best}, MAEs {maes}, "
                     f"elapsed {elapsed}")


def test_unwritable_tensorboard_dir_fails_every_rank(data):
    assert_raises_all(MPI.COMM_WORLD, OSError, "Not a directory", lambda: train.run(_args(
        data, os.path.join(data["root"], "tbfail"), "--tensorboard", os.devnull + "/tb",
        "--quiet")))


def _reference_lr(step, spe, base, peak, warmup, decay):
    """The MLPerf HPC reference's rate (its utils/optimizers.py) at epoch step // spe."""
    e = step // spe
    if e < warmup:
        return e * (peak - base) / warmup + base
    factor, last = 1.0, 0
    for b, f in decay.items():
        if last <= b < e:
            last, factor = b, f
    return peak * factor


def test_mlperf_preset_lr_per_step_and_log(data):
    """--preset mlperf-hpc on a tiny model: SGD momentum 0.9, the rate of every step (from the
    event file) equals the reference's per-epoch rule with linear batch scaling (global batch
    4 over a base batch of 2: the rate goes from the base to twice it over 2 warm-up epochs
    and is a quarter of that after epoch 2 here, to see each part in 4 epochs), and the
    MLPerf log's events."""
    pytest.importorskip("tensorboardX")
    out = os.path.join(data["root"], "mlperf")
    res = train.run(_args(data, out, "--preset", "mlperf-hpc", "--widths", "2,3", "--dense",
                          "6", "--epochs", "4", "--base-batch-size", "2", "--decay-epochs",
                          "2:0.25,5:0.125", "--warmup-epochs", "2", "--lr", "1e-3", "--quiet",
                          "--no-plots"))
    ev = _events(os.path.join(out, "tensorboard"))["train/lr"]
    want = [_reference_lr(s, 2, 1e-3, 2e-3, 2, {2: 0.25, 5: 0.125}) for s in range(8)]
    got = [ev.get(s + 1) for s in range(8)]
    err = max(abs(g - w) / w for g, w in zip(got, want)) if None not in got else math.inf
    ok = err < 1e-6 and res.epochs_done == 4 and len(set(want)) == 4
    keys, status, errors = None, None, []
    if MPI.COMM_WORLD.rank == 0 and os.path.exists(os.path.join(out, "mlperf.log")):
        lines = [json.loads(x.split(":::MLLOG ", 1)[1]) for x in
                 open(os.path.join(out, "mlperf.log")) if ":::MLLOG" in x]
        keys = [x["key"] for x in lines]
        status = [x["metadata"].get("status") for x in lines if x["key"] == "run_stop"]
        errors = [x["value"] for x in lines if x["key"] == "eval_error"]
        base = [x["value"] for x in lines if x["key"] == "opt_base_learning_rate"]
        ok = ok and base == [2e-3]
    keys, status, errors, ok = _bcast((keys, status, errors, ok))
    have_mllog = _bcast(_importable("mlperf_logging") if MPI.COMM_WORLD.rank == 0 else None)
    if have_mllog:
        ok = ok and keys is not None and {"run_start", "init_stop", "epoch_start",
                                          "eval_stop", "run_stop", "opt_name"} <= set(keys) \
            and status == ["aborted" if res.time_to_train is None else "success"] and \
            np.allclose(errors, [v["val_mae"] for v in res.val], rtol=1e-12)
    assert_all_ranks(MPI.COMM_WORLD, ok, f"lr per step {got} vs reference {want} (error "
                     f"{err}); mllog keys {keys}, run_stop {status}")


def _importable(name):
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def test_preset_values_and_overrides():
    a = train.parse_args(["cosmoflow", "--data", "x", "--preset", "mlperf-hpc"])
    b = train.parse_args(["cosmoflow", "--dropout", "0.1", "--preset", "mlperf-hpc", "--data",
                          "x", "--optimizer", "adam", "--epochs", "6", "--target-mae", "0.2"])
    c = train.parse_args(["cosmoflow", "--data", "x"])
    assert (a.widths, a.dense, a.dropout, a.optimizer, a.momentum, a.weight_decay, a.lr,
            a.lr_scaling, a.base_batch_size, a.schedule, a.warmup_epochs, a.decay_epochs,
            a.epochs, a.target_mae) == ("32,64,128,256,512", "128,64", 0.5, "sgd", 0.9, 0.0,
                                        0.001, "linear", 64, "cosmoflow", 4,
                                        "32:0.25,64:0.125", 128, 0.124)
    assert (b.dropout, b.optimizer, b.epochs, b.target_mae, b.widths) == \
        (0.1, "adam", 6, 0.2, "32,64,128,256,512")
    assert (c.widths, c.dropout, c.optimizer, c.lr_scaling, c.decay_epochs, c.target_mae) == \
        (None, 0.0, "adam", "none", None, None)


@pytest.mark.parametrize("extra, match", [
    (["--target-mae", "0"], "--target-mae must be positive"),
    (["--decay-epochs", "2:0.5"], "--decay-epochs is for --schedule cosmoflow"),
    (["--schedule", "cosmoflow", "--decay-epochs", "2-0.5"], "EPOCH:FACTOR"),
    (["--tensorboard", "tb", "--no-tensorboard"], "contradict"),
    (["--base-batch-size", "0"], "--base-batch-size must be >= 1"),
])
def test_bad_watch_options_raise_on_every_rank(data, extra, match):
    assert_raises_all(MPI.COMM_WORLD, ValueError, match, lambda: train.run(
        _args(data, os.path.join(data["root"], "bad"), *extra)))


def test_preset_and_target_need_a_regression_model(data):
    for extra, match in ((["--preset", "mlperf-hpc"], "CosmoFlow recipe"),
                         (["--target-mae", "0.1"], "needs a regression model")):
        argv = ["unet3d", "--data", data["train"], "--val", data["val"], *extra]
        assert_raises_all(MPI.COMM_WORLD, ValueError, match, lambda: train.run(argv))


class _FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_output_off_and_on_a_terminal(data, capsys, monkeypatch):
    """Not a terminal: only the plain final lines (no carriage returns, no per-step lines).
    A terminal: tqdm's bar (carriage returns, 'loss=') then the same epoch line."""
    comm = MPI.COMM_WORLD
    out = os.path.join(data["root"], "progress")
    argv = _args(data, out, "--epochs", "1", "--no-tensorboard",
                 "--no-plots", "--no-checkpoint")
    train.run(argv)
    plain = capsys.readouterr().out
    fake = _FakeTerminal()
    monkeypatch.setattr(sys, "stdout", fake)
    train.run(argv)
    monkeypatch.undo()
    tty = fake.getvalue()
    if comm.rank == 0:
        epoch_plain = [x for x in plain.splitlines() if x.startswith("epoch 1/1")]
        ok = ("\r" not in plain and "step 1/" not in plain and len(epoch_plain) == 1 and
              "train loss" in epoch_plain[0] and "samples/s" in epoch_plain[0] and
              "\r" in tty and "loss=" in tty and "epoch 1/1" in tty and
              any(x.startswith("epoch 1/1 train loss") for x in re.split("[\r\n]", tty)))
    else:
        ok = plain == "" and tty == ""
    assert_all_ranks(comm, ok, f"rank {comm.rank}: plain output {plain!r}; terminal "
                     f"output {tty[-400:]!r}")
