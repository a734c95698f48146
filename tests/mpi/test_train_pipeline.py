"""The training command's issue-12 options: pipeline stages (``--stages``, GPipe and 1F1B,
groups x stages, a spatial split inside a stage), the weight update inside backward
(``--update-in-backward``), the memory planner (``--memory-budget``) and GroPipe's hybrid
learning-rate schedule give the loss curve and validation metrics of the plain one-rank run
(float64); a pipelined run resumes exactly from its checkpoint; bad combinations are refused on
every rank.  Shares the data of tests/mpi/test_train.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from disttensor import train
from conftest import assert_all_ranks, assert_raises_all
from test_train import SIZE, _args, _out, _reference, data  # noqa: F401 (fixture)

BASE = ["--dtype", "float64", "--batch-size", "4", "--lr", "3e-3", "--optimizer", "sgd",
        "--momentum", "0.9"]


def _same_curve(got, ref, what):
    comm = MPI.COMM_WORLD
    assert_all_ranks(comm, len(got.losses) == len(ref.losses) > 0,
                     f"{what}: {len(got.losses)} steps, reference {len(ref.losses)}")
    err = np.max(np.abs(np.subtract(got.losses, ref.losses)) / np.abs(ref.losses))
    assert_all_ranks(comm, err < 1e-10, f"{what}: loss curve differs by {err:.3g}")
    assert_all_ranks(comm, len(got.val) == len(ref.val) > 0,
                     f"{what}: {len(got.val)} validations, reference {len(ref.val)}")
    for key in ("val_loss", "val_mae"):
        verr = max(abs(g[key] - r[key]) / abs(r[key]) for g, r in zip(got.val, ref.val))
        assert_all_ranks(comm, verr < 1e-10, f"{what}: {key} differs by {verr:.3g}")


def _pipeline_cases():
    """(stages, per-stage grid, extra options) for this rank count."""
    if SIZE == 2:
        return [(2, "1x1x1x1", ["--pipeline-schedule", "gpipe"]),
                (2, "1x1x1x1", ["--pipeline-schedule", "1f1b", "--micro-batches", "4",
                                "--update-in-backward"])]
    if SIZE == 3:
        return [(3, "1x1x1x1", ["--partition", "0:3,3:6,6:11", "--micro-batches", "4"])]
    if SIZE == 4:
        return [(2, "2x1x1x1", ["--micro-batches", "2"]),
                (2, "1x2x1x1", ["--pipeline-schedule", "gpipe", "--partition", "auto"]),
                (4, "1x1x1x1", ["--micro-batches", "4", "--schedule", "hybrid"])]
    return []


@pytest.mark.skipif(SIZE < 2, reason="pipelines need 2 or more ranks")
@pytest.mark.parametrize("case", range(3))
def test_pipelined_run_equals_one_rank(data, tmp_path, case):  # noqa: F811
    cases = _pipeline_cases()
    if case >= len(cases):
        pytest.skip("fewer cases on this rank count")
    stages, grid, extra = cases[case]
    sched = ["--schedule", "hybrid"] if "hybrid" in extra else []
    argv = BASE + ["--epochs", "2", "--max-steps", "6", "--no-checkpoint"]
    ref = _reference(_args(data, _out(tmp_path, "ref"), "--grid", "1x1x1x1", *argv, *sched))
    got = train.run(_args(data, _out(tmp_path, "pipe"), "--grid", grid, "--stages",
                          str(stages), *argv, *extra))
    _same_curve(got, ref, f"{stages} stages on {grid} {extra}")


def test_update_in_backward_and_hybrid_schedule_equal_the_ordinary_step(data, tmp_path):  # noqa: F811
    grid = {1: "1x1x1x1", 2: "2x1x1x1", 3: "1x3x1x1", 4: "2x2x1x1"}[SIZE]
    argv = BASE + ["--epochs", "3", "--no-checkpoint", "--schedule",
                   "hybrid", "--warmup-epochs", "1", "--bucket-mb", "0.0001"]
    ref = _reference(_args(data, _out(tmp_path, "ref"), "--grid", "1x1x1x1", *argv))
    got = train.run(_args(data, _out(tmp_path, "upd"), "--grid", grid, *argv,
                          "--update-in-backward"))
    _same_curve(got, ref, f"--update-in-backward on {grid}")
    lrs = [v["lr"] for v in got.val]
    # 4 steps per epoch, warm-up 4, decay over 8: base at its end, the midpoint rate (base /
    # 2, whatever the cosine weight) after 8 steps, eta_min = 0 after 12
    assert_all_ranks(MPI.COMM_WORLD, np.allclose(lrs, [3e-3, 1.5e-3, 0.0], rtol=1e-12,
                                                 atol=1e-15), f"hybrid decay: lr {lrs}")


def test_memory_budget_plan_equals_the_plain_run(data, tmp_path):  # noqa: F811
    grid = {1: "1x1x1x1", 2: "1x2x1x1", 3: "1x1x3x1", 4: "2x2x1x1"}[SIZE]
    argv = BASE + ["--epochs", "1", "--no-checkpoint"]
    ref = _reference(_args(data, _out(tmp_path, "ref"), "--grid", "1x1x1x1", *argv))
    got = train.run(_args(data, _out(tmp_path, "mem"), "--grid", grid, *argv,
                          "--memory-budget", "0.9"))
    _same_curve(got, ref, f"--memory-budget 0.9 on {grid}")


@pytest.mark.skipif(SIZE < 2, reason="pipelines need 2 or more ranks")
def test_pipelined_resume_is_exact(data, tmp_path):  # noqa: F811
    comm = MPI.COMM_WORLD
    grid = "1x1x1x1" if SIZE in (2, 3) else "2x1x1x1"
    stages = SIZE if SIZE in (2, 3) else 2
    base = _args(data, "", "--grid", grid, "--stages", str(stages), *BASE, "--epochs", "2",
                 "--micro-batches", "2")
    whole = train.run(base[:base.index("--out") + 1] + [_out(tmp_path, "whole")]
                      + base[base.index("--out") + 2:])
    out = _out(tmp_path, "parts")
    argv = base[:base.index("--out") + 1] + [out] + base[base.index("--out") + 2:]
    first = train.run(argv + ["--max-steps", "3"])
    assert_all_ranks(comm, first.steps == 3, f"stopped at {first.steps}")
    rest = train.run(argv + ["--resume"])
    assert_all_ranks(comm, rest.losses == whole.losses,
                     f"resumed pipelined curve {rest.losses} != uninterrupted {whole.losses}")


@pytest.mark.parametrize("extra,match", [
    (["--stages", str(SIZE + 1)], "does not divide"),
    (["--stages", "1", "--memory-budget", "1.5"], "fraction in"),
    (["--update-in-backward", "--clip-grad", "1.0"], "--update-in-backward"),
])
def test_bad_combinations_are_refused(data, tmp_path, extra, match):  # noqa: F811
    assert_raises_all(MPI.COMM_WORLD, ValueError, match,
                      lambda: train.run(_args(data, _out(tmp_path, "x"), "--batch-size", "4",
                                              *extra)))


@pytest.mark.skipif(SIZE % 2, reason="2 stages need an even rank count")
@pytest.mark.parametrize("extra,match", [
    (["--clip-grad", "1.0"], "not supported with --stages"),
    (["--micro-batches", "3"], "micro-batches"),
    (["--partition", "0:2"], "partition"),
])
def test_bad_pipeline_options_are_refused(data, tmp_path, extra, match):  # noqa: F811
    assert_raises_all(MPI.COMM_WORLD, ValueError, match,
                      lambda: train.run(_args(data, _out(tmp_path, "x"), "--batch-size", "4",
                                              "--stages", "2", "--grid",
                                              f"1x1x1x1" if SIZE == 2 else
                                              f"{SIZE // 2}x1x1x1" if SIZE == 4 else "1x1x1x1",
                                              *extra)))
