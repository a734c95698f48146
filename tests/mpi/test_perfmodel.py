"""plan_grid under MPI: collective, the same ranking on every rank, bad input raising on every
rank, the memory limit excluding grids, and the chosen grid running a training step."""
from __future__ import annotations

import math

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor import nn
from disttensor.core.agreement import ArgumentMismatchError
from disttensor.autograd import Tensor
from disttensor.nn import functional as F
from disttensor.nn.perfmodel import LayerTimer, measure_links, plan_grid

from checks import COMM, SIZE
from conftest import assert_all_ranks, assert_raises_all

SHAPE = (2, 8, 8, 8)
BATCH = 4


def model():
    return nn.models.cosmoflow(input_size=8, in_channels=2, widths=(3, 4), dense=(5,),
                               outputs=2, rng=np.random.default_rng(0))


def same_everywhere(value) -> bool:
    return all(v == value for v in COMM.allgather(value))


def summary(plan):
    return ([(p.grid, p.step_s, p.memory["total"]) for p in plan.ranked],
            [g for g, _ in plan.excluded])


def test_plan_is_identical_on_every_rank_and_valid():
    plan = plan_grid(model(), SHAPE, BATCH, comm=COMM, quick=True)
    assert_all_ranks(COMM, same_everywhere(summary(plan)), "plans differ between ranks")
    grids = [p.grid for p in plan.ranked]
    ok = all(math.prod(g) == SIZE and BATCH % g[0] == 0 for g in grids)
    assert_all_ranks(COMM, ok and len(set(grids)) == len(grids), f"bad grids {grids}")
    steps = [p.step_s for p in plan.ranked]
    assert_all_ranks(COMM, steps == sorted(steps) and all(s > 0 for s in steps),
                     f"not ranked by predicted step {steps}")
    # the breakdown adds up to the step
    best = plan.best
    parts = sum(lp.forward_s + lp.backward_s for lp in best.layers)
    assert_all_ranks(COMM, abs(parts + best.allreduce_s + best.optimizer_s - best.step_s)
                     < 1e-9 * max(best.step_s, 1), "breakdown does not add up")
    if SIZE > 1:  # the links were measured: positive latency, finite bandwidth
        assert_all_ranks(COMM, plan.links.p2p.alpha > 0 and plan.links.allreduce.alpha > 0
                         and plan.links.nranks == SIZE, str(plan.links))


def test_chosen_grid_runs_a_step():
    plan = plan_grid(model(), SHAPE, BATCH, comm=COMM, quick=True)
    grid = dt.ProcessGrid(plan.best.grid)
    m = model()
    net = nn.DistributedDataParallel(m, grid)
    g = dt.random.default_rng(3)
    x = g.normal(shape=(BATCH,) + SHAPE, dtype="float32", grid=grid, split=(0, None, 1, 2, 3))
    y = g.uniform(-1, 1, shape=(BATCH, 2), dtype="float32", grid=grid, split=(0, None))
    loss = F.mse_loss(net(Tensor(x)), Tensor(y))
    loss.backward()
    net.reducer.release()
    grads = [p.grad for p in m.parameters()]
    assert_all_ranks(COMM, all(gr is not None and np.all(np.isfinite(gr)) for gr in grads),
                     "the planned grid did not train")


def test_process_grid_as_communicator():
    import disttensor as dt
    plan = plan_grid(model(), SHAPE, BATCH, comm=dt.ProcessGrid((SIZE,)), quick=True)
    assert_all_ranks(COMM, plan.links.nranks == SIZE and same_everywhere(summary(plan)),
                     str(plan.links))


def test_candidates_and_invalid_grids_are_reported():
    # a model with three pooling stages on 8^3: splitting depth over 4 or more ranks is too
    # fine for the last convolution's halo
    deep = nn.models.cosmoflow(input_size=8, in_channels=2, widths=(2, 2, 2), dense=(3,),
                               outputs=2, rng=np.random.default_rng(0))
    cands = [(SIZE, 1, 1, 1), (1, SIZE, 1, 1)]
    plan = plan_grid(deep, SHAPE, 4 * SIZE, comm=COMM, quick=True, candidates=cands)
    got = {p.grid for p in plan.ranked}
    excluded = {g for g, _ in plan.excluded}
    expect_bad = {(1, SIZE, 1, 1)} if SIZE >= 3 else set()
    assert_all_ranks(COMM, excluded == expect_bad and got == set(cands) - expect_bad,
                     f"ranked {got}, excluded {plan.excluded}")


def test_memory_limit_excludes_grids():
    free = plan_grid(model(), SHAPE, BATCH, comm=COMM, quick=True)
    mems = sorted({p.memory["total"] for p in free.ranked})
    if len(mems) > 1:
        limit = (mems[0] + mems[1]) / 2
        plan = plan_grid(model(), SHAPE, BATCH, memory_limit=limit, comm=COMM, quick=True)
        kept = {p.grid for p in plan.ranked}
        want = {p.grid for p in free.ranked if p.memory["total"] <= limit}
        assert_all_ranks(COMM, kept == want and len(plan.excluded) >= len(free.ranked)
                         - len(want) and all("over the limit" in why for _, why in
                                             plan.excluded), f"{kept} vs {want}")
    assert_raises_all(COMM, ValueError, "no valid grid fits",
                      lambda: plan_grid(model(), SHAPE, BATCH, memory_limit=mems[0] / 2,
                                        comm=COMM, quick=True))
    # excluded before any timing: a timer reused afterwards has timed none of their blocks
    if len(mems) > 1:
        timer = LayerTimer(COMM, np.float32, repeats=1)
        plan_grid(model(), SHAPE, BATCH, memory_limit=(mems[0] + mems[1]) / 2, comm=COMM,
                  quick=True, timer=timer, links=free.links)
        kept = plan_grid(model(), SHAPE, BATCH, comm=COMM, quick=True, links=free.links,
                         candidates=[p.grid for p in plan.ranked], timer=timer)
        n_cached = len(timer.cache)
        plan_grid(model(), SHAPE, BATCH, comm=COMM, quick=True, links=free.links,
                  timer=timer)
        assert_all_ranks(COMM, kept.ranked and len(timer.cache) > n_cached,
                         "the excluded grids' blocks were timed")


@pytest.mark.parametrize("kwargs, match", [
    ({"batch": 0}, "batch must be a positive"),
    ({"input_shape": (2, 8, 8)}, "input_shape must be"),
    ({"input_shape": (2, "x", 8, 8)}, "input_shape must be"),
    ({"optimizer": "lbfgs"}, "optimizer must be one of"),
    ({"memory_limit": -1.0}, "memory_limit must be positive"),
    ({"candidates": [(SIZE + 1, 1, 1, 1)]}, "is not a 4-axis grid"),
    ({"dtype": "float42"}, "float42"),
])
def test_bad_input_raises_on_every_rank(kwargs, match):
    args = {"input_shape": SHAPE, "batch": BATCH, **kwargs}
    assert_raises_all(COMM, ValueError, match, lambda: plan_grid(model(), comm=COMM, quick=True,
                                                                  **args))


def test_batch_no_grid_divides():
    # an odd batch on an even rank count still has s = 1 grids; a batch that fits nothing
    # is only possible through candidates
    if SIZE > 1:
        assert_raises_all(COMM, ValueError, "no valid grid fits",
                          lambda: plan_grid(model(), SHAPE, 1, comm=COMM, quick=True,
                                            candidates=[(SIZE, 1, 1, 1)]))


@pytest.mark.skipif(SIZE < 2, reason="needs 2 ranks")
def test_arguments_differing_between_ranks():
    batch = 4 if COMM.rank == 0 else 8
    assert_raises_all(COMM, ArgumentMismatchError, "differ between ranks",
                      lambda: plan_grid(model(), SHAPE, batch, comm=COMM, quick=True))


def test_links_and_timer_agree_across_ranks():
    links = measure_links(COMM, quick=True)
    assert_all_ranks(COMM, same_everywhere(links), "link models differ")
    assert_all_ranks(COMM, links.p2p.alpha >= 0 and links.p2p.beta >= 0
                     and links.allreduce.alpha >= 0 and links.allreduce.beta >= 0, str(links))
    m = model()
    layers = nn.sequential_layers(m)
    before = [np.array(p.data, copy=True) for p in m.parameters()]
    timer = LayerTimer(COMM, np.float32, repeats=3)
    t = timer.time_all([(layers[0], (2, 2, 32, 32, 32), True),
                        (layers[0], (2, 2, 4, 32, 32), True),
                        (layers[1], (2, 3, 8, 8, 8), True), (layers[0], (), True)])
    assert_all_ranks(COMM, same_everywhere(t), "timings differ between ranks")
    assert_all_ranks(COMM, all(f > 0 and b > 0 for f, b in t[:3]) and t[3] == (0.0, 0.0),
                     str(t))
    # a conv on a block with 8x the work takes longer (beyond this machine's noise)
    assert_all_ranks(COMM, sum(t[0]) > sum(t[1]), str(t))
    # cached: the same job again is not re-timed
    assert_all_ranks(COMM, timer.time_all([(layers[0], (2, 2, 4, 32, 32), True)]) == [t[1]],
                     "not cached")
    after = [np.asarray(p.data) for p in m.parameters()]
    assert_all_ranks(COMM, all(np.array_equal(a, b) for a, b in zip(before, after))
                     and all(p.grad is None for p in m.parameters()), "timing changed the model")
    # a block the layer cannot run (wrong channel count) is inf on every rank
    bad = timer.time_all([(layers[0], (1, 5, 4, 4, 4), True)])
    assert_all_ranks(COMM, same_everywhere(bad) and math.isinf(bad[0][0]), str(bad))


def test_whole_model_layer_is_timed_on_local_blocks():
    # the U-Net is one layer (skip connections): timed whole on each grid's local block,
    # its own sample-shape check relaxed for the copy that is timed
    import os
    unet = nn.models.unet3d(in_channels=1, classes=2, encoder=((2, 2),), bottom=(2, 2),
                            input_size=8, rng=np.random.default_rng(0))
    before = os.environ.get("DISTTENSOR_CONV_TUNE")
    plan = plan_grid(unet, (1, 8, 8, 8), 2 * SIZE, comm=COMM, quick=True)
    grids = {p.grid for p in plan.ranked}
    want = {(1, SIZE, 1, 1), (SIZE, 1, 1, 1)}
    assert_all_ranks(COMM, want <= grids and not plan.excluded and same_everywhere(
        summary(plan)) and unet.input_size == (8, 8, 8), f"{plan.report()}")
    # quick planning chose the kernels' algorithms by their cost models, then restored
    assert_all_ranks(COMM, os.environ.get("DISTTENSOR_CONV_TUNE") == before, "env changed")


# -- the training command without --grid ---------------------------------------------------
@pytest.fixture(scope="module")
def cli_data(tmp_path_factory):
    from disttensor.io.synthetic import generate_synthetic
    root = COMM.bcast(str(tmp_path_factory.mktemp("plan")) if COMM.rank == 0 else None)
    generate_synthetic(root + "/train", 8, size=8, channels=2, seed=0, comm=COMM)
    generate_synthetic(root + "/val", 2, size=8, channels=2, seed=1, comm=COMM)
    return root


def _cli(root, *extra):
    return ["cosmoflow", "--data", root + "/train", "--val", root + "/val", "--widths", "2,3",
            "--dense", "4", "--epochs", "1", "--max-steps", "2", "--no-checkpoint",
            "--no-prefetch", "--out", root + "/out", *extra]


def test_cli_plans_the_grid_and_prints_it(cli_data, capsys):
    from disttensor import train
    res = train.run(_cli(cli_data, "--batch-size", "4"))
    out = capsys.readouterr().out
    g = res.grid
    assert_all_ranks(COMM, same_everywhere(g) and math.prod(g) == SIZE and 4 % g[0] == 0
                     and res.steps == 2 and all(np.isfinite(res.losses)), f"{res}")
    if COMM.rank == 0:
        assert "grid plan" in out and f"chosen grid (sample, d, h, w) = {g}" in out, out
    # --grid still overrides
    res = train.run(_cli(cli_data, "--batch-size", "4", "--quiet", "--grid",
                         f"1x{SIZE}x1x1"))
    assert_all_ranks(COMM, res.grid == (1, SIZE, 1, 1), f"{res.grid}")


def test_cli_odd_batch_plans_a_spatial_grid(cli_data):
    from disttensor import train
    res = train.run(_cli(cli_data, "--batch-size", "5", "--quiet"))  # no s > 1 divides 5
    assert_all_ranks(COMM, res.grid[0] == 1 and math.prod(res.grid) == SIZE, f"{res.grid}")


def test_cli_bad_input_raises_everywhere_while_planning(tmp_path):
    from disttensor import train
    from disttensor.io.synthetic import generate_synthetic
    root = COMM.bcast(str(tmp_path) if COMM.rank == 0 else None)
    generate_synthetic(root + "/tiny", 4, size=4, channels=2, seed=2, comm=COMM)
    argv = ["cosmoflow", "--data", root + "/tiny", "--val", root + "/tiny", "--widths",
            "2,3,4", "--quiet", "--out", root + "/x", "--batch-size", "2"]
    assert_raises_all(COMM, ValueError, "too small for 3 pooling stages",
                      lambda: train.run(argv))


@pytest.mark.skipif(SIZE % 2, reason="two pipeline stages need an even rank count")
def test_cli_plans_the_stage_grid_of_a_pipeline(cli_data):
    from disttensor import train
    res = train.run(_cli(cli_data, "--batch-size", "4", "--quiet", "--stages", "2"))
    g = res.grid
    # a micro-batch of 2 samples: the sample axis of a stage divides it
    assert_all_ranks(COMM, math.prod(g) == SIZE // 2 and 2 % g[0] == 0 and res.steps == 2
                     and all(np.isfinite(res.losses)), f"{res}")


def test_measured_machine_is_identical_and_simulates_every_grid():
    """measure_machine (collective) gives the same Machine on every rank, with positive rates
    and the measured links; the simulator ranks every grid of the job with it."""
    from disttensor.nn.perfmodel.machine import measure_machine
    from disttensor.nn.perfmodel.simulate import simulate
    from disttensor.nn.perfmodel.layerspec import cosmoflow_layers
    layers = cosmoflow_layers(8, 2, (3, 4), (5,), 2)   # model(), described: built to time
    m = measure_machine(COMM, layers, SHAPE, BATCH, repeats=1)
    assert same_everywhere(repr(m))
    assert m.devices_per_node == SIZE and m.peak_flops > 0 and m.bandwidth > 0
    assert 0 < m.conv_efficiency[0] <= 1 and 0 < m.conv_efficiency[1] <= 1
    assert m.host_op_s >= 0 and (SIZE > 1) == (m.measured_allreduce is not None)
    plan = simulate(layers, SHAPE, BATCH, SIZE, m)
    assert plan.ranked and same_everywhere(summary(plan))
    assert all(math.prod(p.grid) == SIZE and p.step_s > 0 for p in plan.ranked)


def test_plan_grid_on_a_machine_description_is_the_simulator():
    from disttensor.nn.perfmodel.machine import V100_EDR
    from disttensor.nn.perfmodel.simulate import simulate
    plan = plan_grid(model(), SHAPE, BATCH, comm=COMM, machine=V100_EDR, nranks=8)
    ref = simulate(nn.sequential_layers(model()), SHAPE, BATCH, 8, V100_EDR)
    assert summary(plan) == summary(ref) and same_everywhere(summary(plan))
    assert plan.machine is V100_EDR and all(math.prod(p.grid) == 8 for p in plan.ranked)
