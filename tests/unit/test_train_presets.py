"""The MLPerf HPC preset's optimizer and per-step learning rate against the reference's rule
computed by hand, batch scaling, --decay-epochs parsing, the best-epoch rule, the curves'
notice without matplotlib, and the plain progress output (no MPI needed)."""
from __future__ import annotations

import builtins
import io
import math
import sys

import numpy as np
import pytest

from disttensor import nn
from disttensor.train import build_optimizer, build_schedule, parse_args
from disttensor.train.plots import plot_curves
from disttensor.train.presets import EpochCosmoFlowLR, lr_scale, parse_decay, peak_lr
from disttensor.train.progress import Progress
from disttensor.train.watch import is_better


def _reference(epoch, base, peak, warmup, decay):
    """The reference's ``_lr_schedule`` (MLCommons HPC cosmoflow/utils/optimizers.py)."""
    if epoch < warmup:
        return epoch * (peak - base) / warmup + base
    factor, last = 1.0, 0
    for e, d in decay.items():
        if e >= last and e < epoch:
            last, factor = e, d
    return peak * factor


def _params():
    return [nn.Parameter(np.zeros(3, dtype=np.float32))]


@pytest.mark.parametrize("batch, scaling, expect_scale", [
    (256, None, 4.0), (16, None, 0.25), (256, "sqrt", 2.0), (256, "none", 1.0)])
def test_preset_lr_per_step_matches_reference(batch, scaling, expect_scale):
    argv = ["cosmoflow", "--data", "x", "--preset", "mlperf-hpc", "--batch-size", str(batch)]
    if scaling:
        argv += ["--lr-scaling", scaling]
    args = parse_args(argv)
    assert math.isclose(lr_scale(args), expect_scale)
    opt = build_optimizer(args, _params())
    assert isinstance(opt, nn.optim.SGD)
    group = opt.param_groups[0]
    assert group["momentum"] == 0.9 and group["weight_decay"] == 0.0
    assert math.isclose(group["lr"], 0.001 * expect_scale)
    spe = 3
    sched = build_schedule(args, opt, spe)
    assert isinstance(sched, EpochCosmoFlowLR)
    peak = 0.001 * expect_scale
    for step in range(70 * spe):
        want = _reference(step // spe, 0.001, peak, 4, {32: 0.25, 64: 0.125})
        assert math.isclose(opt.param_groups[0]["lr"], want, rel_tol=1e-12), step
        opt.step()
        sched.step()


def test_epoch_schedule_resumes_bit_for_bit():
    args = parse_args(["cosmoflow", "--data", "x", "--preset", "mlperf-hpc", "--batch-size",
                       "128", "--decay-epochs", "5:0.5,7:0.1"])
    opt = build_optimizer(args, _params())
    sched = build_schedule(args, opt, 4)
    for _ in range(17):
        sched.step()
    state = sched.state_dict()
    rest = []
    for _ in range(20):
        sched.step()
        rest.append(sched.get_last_lr()[0])
    opt2 = build_optimizer(args, _params())
    sched2 = build_schedule(args, opt2, 4)
    sched2.load_state_dict(state)
    again = []
    for _ in range(20):
        sched2.step()
        again.append(sched2.get_last_lr()[0])
    assert rest == again
    assert rest[-1] == pytest.approx(0.002 * 0.1)


def test_cosmoflow_schedule_without_decay_epochs_unchanged_by_scaling_none():
    args = parse_args(["cosmoflow", "--data", "x", "--schedule", "cosmoflow", "--epochs", "4",
                       "--lr", "0.01", "--optimizer", "sgd"])
    sched = build_schedule(args, build_optimizer(args, _params()), 5)
    assert isinstance(sched, nn.lr_scheduler.CosmoFlowLR)
    assert not isinstance(sched, EpochCosmoFlowLR)
    assert sched.warmup_factor == 1.0 and sched.boundaries == [10, 15]


def test_peak_lr_and_parse_decay():
    args = parse_args(["cosmoflow", "--data", "x", "--lr", "0.5", "--lr-scaling", "linear",
                       "--base-batch-size", "4", "--batch-size", "8"])
    assert peak_lr(args) == 1.0
    assert parse_decay("64:0.125, 32:0.25") == ((64, 32), (0.125, 0.25))
    for bad in ("", "32", "a:b", "32:0.5,32:0.25", "-1:0.5", "3:0"):
        with pytest.raises(ValueError):
            parse_decay(bad)


def test_is_better():
    assert is_better({"val_mae": 0.3}, None, False)
    assert is_better({"val_mae": 0.3}, {"val_mae": 0.4}, False)
    assert not is_better({"val_mae": 0.4}, {"val_mae": 0.4}, False)  # ties keep the first
    assert is_better({"val_dice": 0.6}, {"val_dice": 0.5}, True)
    assert not is_better({"val_dice": 0.5}, {"val_dice": 0.6}, True)


def test_curves_skipped_with_one_line_without_matplotlib(tmp_path, monkeypatch):
    real = builtins.__import__

    def no_matplotlib(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    line = plot_curves(str(tmp_path / "curves.png"), [1.0], [], False)
    assert "skipped" in line and "matplotlib" in line and "\n" not in line
    assert not (tmp_path / "curves.png").exists()


def test_curves_png_written(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [{"epoch": e, "step": 2 * e, "val_loss": 1.0 / e, "val_mae": 0.5 / e,
             "baseline_mae": 0.6} for e in (1, 2, 3)]
    path = tmp_path / "curves.png"
    assert plot_curves(str(path), [1.0, 0.8, 0.7, 0.5, 0.4, 0.3], rows, False, 0.2) == \
        f"curves: {path}"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]  # no temporary left


def test_progress_plain_when_not_a_terminal(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    p = Progress(True)
    p.step("epoch 1/1 step 1/2 loss 0.5 3.0 samples/s", "epoch 1/1", 1, 2, 0.5, 3.0)
    p.update("epoch 1/1 train loss 0.5", final=True)
    p.say("final: x")
    p.close()
    assert out.getvalue() == "epoch 1/1 train loss 0.5\nfinal: x\n"
    quiet = io.StringIO()
    monkeypatch.setattr(sys, "stdout", quiet)
    q = Progress(False)
    q.step("x", "e", 1, 2, 0.5, 3.0)
    q.update("y", final=True)
    assert quiet.getvalue() == ""
