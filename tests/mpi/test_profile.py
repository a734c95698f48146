"""The step profiler (dt.profile) on 1-4 ranks: a distributed conv forward + backward and a
tiny CosmoFlow training step, profiled on a grid that splits a spatial axis and on one that
splits the samples.

Checked: profiling changes no result (gradients equal those of an unprofiled run); the
categories present are the ones the grid implies (point-to-point halo waits and packing only
when a spatial axis is split over several ranks, agreement only on several ranks, the weight
gradient's all-reduce in the conv backward); each row's categories add up to its time; the
summary is the same text on every rank; the Chrome traces load, pass the Trace Event checker
and put every region inside an op; bad arguments raise on every rank.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from conftest import assert_all_ranks, assert_allclose_all, assert_raises_all
from disttensor import nn
from disttensor.autograd import Tensor
from disttensor.core import profile_report as R
from disttensor.nn import functional as F

COMM = MPI.COMM_WORLD
SIZE = COMM.size
_GRIDS: dict = {}


def grid_of(dims) -> dt.ProcessGrid:
    if dims not in _GRIDS:
        _GRIDS[dims] = dt.ProcessGrid(dims)
    return _GRIDS[dims]


SPATIAL, SAMPLES = (1, SIZE, 1, 1), (SIZE, 1, 1, 1)


def _conv_case(grid):
    rng = np.random.default_rng(5)
    xg = rng.standard_normal((4, 2, 8, 6, 5))
    conv = nn.Conv3d(2, 3, 3, padding=1, dtype=np.float64, rng=np.random.default_rng(1))
    x = dt.from_global(xg, grid=grid, split=(0, None, 1, 2, 3))

    def step():
        conv.weight.grad = conv.bias.grad = None
        xt = Tensor(x, requires_grad=True)
        y = F.relu(conv(xt))
        (y * y).sum().backward()
        return conv.weight.grad.copy(), xt.grad
    return step


def _rows(prof, clock="wall") -> dict:
    t = prof.local_table(clock)
    return {k: v for k, v in t["rows"].items()}


@pytest.mark.parametrize("dims", [SPATIAL, SAMPLES], ids=["spatial", "samples"])
def test_profiled_conv_categories_and_results(dims, shared_tmp_path):
    grid = grid_of(dims)
    step = _conv_case(grid)
    ref = step()
    ref = ref[0], ref[1].to_numpy()
    with dt.profile(grid, cpu_time=True) as prof:
        for _ in range(2):
            got = step()
            prof.step()
    assert_allclose_all(COMM, got[0], ref[0], rtol=1e-12)
    assert_allclose_all(COMM, got[1].to_numpy(), ref[1], rtol=1e-12)
    rows = _rows(prof)
    fwd, bwd = rows[("conv", "forward")], rows[("conv", "backward")]
    split = dims[1] > 1
    ok = (fwd["calls"] == 2 and bwd["calls"] == 2 and fwd["kernel"] > 0 and bwd["kernel"] > 0
          and (fwd["p2p wait"] > 0) == split and (bwd["p2p wait"] > 0) == split
          and (fwd["pack"] > 0) == split and (bwd["pack"] > 0) == split
          and (fwd["agreement"] > 0) == (SIZE > 1 and split)  # (no halo: deferred)
          and (bwd["collective"] > 0) == (SIZE > 1)
          and ("relu", "forward") in rows and ("relu", "backward") in rows)
    assert_all_ranks(COMM, ok, f"categories of {dims}: {fwd} {bwd}")
    for clock in ("wall", "cpu"):
        t = prof.local_table(clock)
        sums = all(sum(r[c] for c in R.CATEGORIES) == r["total"] and r[c] >= 0
                   for key, r in t["rows"].items() if key != R.OUTSIDE for c in R.CATEGORIES)
        assert_all_ranks(COMM, sums and t["steps"] == 2, f"{clock} rows add up")
    text = prof.summary()
    cpu_text = prof.summary(clock="cpu")
    assert_all_ranks(COMM, len(set(COMM.allgather(text + cpu_text))) == 1,
                     "the summary differs between ranks")
    assert_all_ranks(COMM, f"{SIZE} rank" in text and "conv" in text and "CPU" in cpu_text)
    d = shared_tmp_path / f"trace-{dims[0]}"
    paths = prof.write_chrome_trace(str(d))
    assert len(paths) == SIZE + 1
    err = ""
    if COMM.rank == 0:
        try:
            for p in paths:
                doc = json.load(open(p))
                R.check_trace(doc)
                x = [e for e in doc["traceEvents"] if e["ph"] == "X"]
                ops = [e for e in x if e["tid"] == 1 and e["cat"] in ("forward", "backward",
                                                                      "update")]
                regions = [e for e in x if e["tid"] == 1 and e not in ops]
                for r in regions:
                    if not any(o["pid"] == r["pid"] and o["ts"] <= r["ts"] + 1e-3 and
                               r["ts"] + r["dur"] <= o["ts"] + o["dur"] + 1e-3 for o in ops):
                        raise AssertionError(f"region {r} lies in no op")
                pids = {e["pid"] for e in x}
                want = set(range(SIZE)) if p.endswith("trace.json") else {paths.index(p)}
                if pids != want:
                    raise AssertionError(f"{p}: pids {pids}, expected {want}")
                if split and not any(e["cat"] == "p2p wait" for e in regions):
                    raise AssertionError(f"{p}: no p2p wait")
        except (AssertionError, ValueError, OSError) as e:
            err = str(e)
    assert_all_ranks(COMM, not COMM.bcast(err), COMM.bcast(err))


def test_profiled_training_step_rows():
    grid = grid_of(SPATIAL)
    m = nn.models.cosmoflow(input_size=8, in_channels=2, widths=(2,), dense=(4,), outputs=2,
                            rng=np.random.default_rng(0))
    net = nn.DistributedDataParallel(m, grid)
    opt = nn.optim.Adam(m.parameters(), lr=1e-3)
    rng = np.random.default_rng(3)
    x = dt.from_global(rng.standard_normal((2, 2, 8, 8, 8)).astype(np.float32), grid=grid,
                       split=(0, None, 1, 2, 3))
    y = dt.from_global(rng.uniform(-1, 1, (2, 2)).astype(np.float32), grid=grid,
                       split=(0, None))

    def step():
        opt.zero_grad()
        F.mse_loss(net(Tensor(x)), Tensor(y)).backward()
        opt.step()
    step()
    with dt.profile(grid) as prof:
        for _ in range(2):
            step()
            prof.step()
    rows = _rows(prof)
    ok = (("Adam.step", "update") in rows and ("conv", "backward") in rows
          and ("mse", "forward") in rows and ("grad sync", "backward") in rows
          and rows[("Adam.step", "update")]["calls"] == 2)
    assert_all_ranks(COMM, ok, f"rows {sorted(rows)}")
    summary = R.summary_rows(COMM.allgather(prof.local_table()))
    all_ops, outside, whole = summary[-3:]
    assert_all_ranks(COMM, abs(all_ops["total"] + outside["total"] - whole["total"]) < 1e-9
                     and outside["total"] >= 0 and whole["imbalance"] >= 1.0)


def test_profile_bad_arguments_raise_everywhere(shared_tmp_path):
    grid = grid_of(SPATIAL)
    with dt.profile(grid) as prof:
        _conv_case(grid)()
        assert_raises_all(COMM, RuntimeError, "already active",
                          lambda: dt.profile(grid).__enter__())
    assert_raises_all(COMM, ValueError, "sort must be", lambda: prof.summary(sort="bogus"))
    assert_raises_all(COMM, ValueError, "clock must be", lambda: prof.summary(clock="cpu"))
    assert_raises_all(COMM, TypeError, "must be a path", lambda: prof.write_chrome_trace(3))
    assert_raises_all(COMM, TypeError, "ProcessGrid", lambda: dt.profile("grid"))
    assert_raises_all(COMM, TypeError, "not both", lambda: dt.profile(grid, comm=COMM))
    assert_raises_all(COMM, RuntimeError, "never entered",
                      lambda: dt.profile(grid).summary())
    if SIZE > 1:
        assert_raises_all(COMM, dt.ArgumentMismatchError, "directory",
                          lambda: prof.write_chrome_trace(
                              str(shared_tmp_path / f"r{COMM.rank}")))


def _cli_args(root, out, *extra):
    return ["cosmoflow", "--widths", "2", "--dense", "4", "--quiet", "--no-prefetch",
            "--data", os.path.join(root, "train"), "--val", os.path.join(root, "val"),
            "--out", out, "--grid", f"1x{SIZE}x1x1", "--batch-size", "2", "--epochs", "1",
            "--no-checkpoint", "--no-plots", "--no-tensorboard", *extra]


def test_training_command_profile(shared_tmp_path):
    """``--profile``: OUT/profile/summary.txt (wall and CPU tables of the profiled steps) and
    a valid trace per rank plus the merged one; a bad --profile-steps raises everywhere."""
    from disttensor import train
    from disttensor.io.synthetic import generate_synthetic
    root = str(shared_tmp_path)
    generate_synthetic(os.path.join(root, "train"), 8, size=8, channels=4, seed=0, comm=COMM)
    generate_synthetic(os.path.join(root, "val"), 2, size=8, channels=4, seed=1, comm=COMM)
    out = os.path.join(root, "out")
    res = train.run(_cli_args(root, out, "--profile", "--profile-steps", "2",
                              "--profile-warmup", "1"))
    assert_all_ranks(COMM, res.steps == 4, f"{res.steps} steps")
    err = ""
    if COMM.rank == 0:
        try:
            text = open(os.path.join(out, "profile", "summary.txt")).read()
            for want in ("2 steps", "CPU ms per step", "conv", "Adam.step", "(outside ops)"):
                if want not in text:
                    raise AssertionError(f"{want!r} not in the summary:\n{text}")
            for name in [f"trace-rank{r}.json" for r in range(SIZE)] + ["trace.json"]:
                R.check_trace(json.load(open(os.path.join(out, "profile", name))))
        except (AssertionError, ValueError, OSError) as e:
            err = str(e)
    err = COMM.bcast(err)
    assert_all_ranks(COMM, not err, err)
    assert_raises_all(COMM, ValueError, "--profile-steps must be",
                      lambda: train.run(_cli_args(root, out, "--profile",
                                                  "--profile-steps", "0")))
