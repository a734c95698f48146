"""The pipeline partitioner's dynamic program (no MPI): against brute force over every
contiguous split on random costs, memory limits, the smallest feasible limit, errors, and the
predicted step time / bubble formulas."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from disttensor.nn.partition import LayerProfile, link_cost, partition_layers


def random_costs(rng, n):
    return [LayerProfile(name=f"l{i}", forward_s=float(rng.uniform(0, 1)),
                         backward_s=float(rng.uniform(0, 2)),
                         param_bytes=int(rng.integers(0, 1000)),
                         activation_bytes=int(rng.integers(0, 500)),
                         output_bytes=int(rng.integers(1, 300)))
            for i in range(n)]


def splits(n, stages):
    """Every split of range(n) into `stages` non-empty contiguous ranges."""
    for cuts in itertools.combinations(range(1, n), stages - 1):
        edges = (0,) + cuts + (n,)
        yield [(edges[k], edges[k + 1]) for k in range(stages)]


def brute(costs, stages, chunks, memory_limit, schedule, per_byte, state_factor):
    """(min over feasible splits of the slowest stage, min over all splits of the largest
    stage memory), straight from the cost model's definition."""
    n = len(costs)
    best, least_mem = math.inf, math.inf
    for ranges in splits(n, stages):
        times, mems = [], []
        for s, (a, b) in enumerate(ranges):
            t = sum(c.forward_s + c.backward_s for c in costs[a:b])
            if b < n:
                t += per_byte * costs[b - 1].output_bytes
            if a > 0:
                t += per_byte * costs[a - 1].output_bytes
            flight = chunks if schedule == "gpipe" else min(chunks, stages - s)
            mem = (state_factor * sum(c.param_bytes for c in costs[a:b])
                   + flight * sum(c.activation_bytes for c in costs[a:b]))
            times.append(t)
            mems.append(mem)
        least_mem = min(least_mem, max(mems))
        if memory_limit is None or max(mems) <= memory_limit:
            best = min(best, max(times))
    return best, least_mem


def check_plan(plan, costs, stages, chunks, memory_limit, schedule, per_byte, state_factor):
    n = len(costs)
    assert len(plan.ranges) == stages
    assert plan.ranges[0][0] == 0 and plan.ranges[-1][1] == n
    assert all(a < b for a, b in plan.ranges)
    assert all(plan.ranges[k][1] == plan.ranges[k + 1][0] for k in range(stages - 1))
    if memory_limit is not None:
        assert max(plan.stage_memory) <= memory_limit
    # the plan's own figures follow from its ranges
    for s, (a, b) in enumerate(plan.ranges):
        t = sum(c.time_s for c in costs[a:b]) + (per_byte * costs[b - 1].output_bytes
                                                 if b < n else 0) \
            + (per_byte * costs[a - 1].output_bytes if a > 0 else 0)
        assert plan.stage_times[s] == pytest.approx(t, rel=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_dp_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 10))
    stages = int(rng.integers(1, min(4, n) + 1))
    chunks = int(rng.integers(1, 6))
    schedule = ("gpipe", "1f1b")[seed % 2]
    per_byte = float(rng.choice([0.0, 1e-3]))
    state_factor = float(rng.choice([2.0, 3.0]))
    costs = random_costs(rng, n)
    _, least = brute(costs, stages, chunks, None, schedule, per_byte, state_factor)
    for limit in (None, least, least * 1.3, least * 3):
        plan = partition_layers(costs, stages, chunks, limit, schedule, boundary_cost=per_byte,
                                state_factor=state_factor)
        want, _ = brute(costs, stages, chunks, limit, schedule, per_byte, state_factor)
        assert max(plan.stage_times) == pytest.approx(want, rel=1e-12), (limit, plan.ranges)
        check_plan(plan, costs, stages, chunks, limit, schedule, per_byte, state_factor)
    if least > 0:
        with pytest.raises(ValueError, match="smallest feasible limit") as e:
            partition_layers(costs, stages, chunks, least * 0.999, schedule,
                             boundary_cost=per_byte, state_factor=state_factor)
        assert f"{least:.6g} bytes" in str(e.value)


def test_memory_limit_moves_the_cut():
    # one heavy-compute layer then parameter-heavy ones: unconstrained, the time balance
    # puts the cut after layer 0; a limit below the second stage's memory moves it
    costs = [LayerProfile("a", 2, 1), LayerProfile("b", 0.5, 0.5, param_bytes=100),
             LayerProfile("c", 0.5, 0.5, param_bytes=100),
             LayerProfile("d", 0.5, 0.5, param_bytes=100)]
    plan = partition_layers(costs, 2, 4)
    assert plan.ranges == ((0, 1), (1, 4))
    assert plan.stage_memory == (0.0, 900.0)     # state_factor 3 x 300 parameter bytes
    plan = partition_layers(costs, 2, 4, memory_limit=600)
    assert plan.ranges == ((0, 2), (2, 4))
    assert plan.stage_memory == (300.0, 600.0)
    with pytest.raises(ValueError, match=r"smallest feasible limit is 600 bytes"):
        partition_layers(costs, 2, 4, memory_limit=599)
    plan = partition_layers(costs, 2, 4, memory_limit=400, state_factor=2.0)
    assert plan.ranges == ((0, 2), (2, 4))
    # state_factor and in-flight activations: 1F1B holds fewer micro-batches on later stages
    costs = [LayerProfile("a", 1, 0, activation_bytes=10) for _ in range(4)]
    g = partition_layers(costs, 2, 8, schedule="gpipe")
    f = partition_layers(costs, 2, 8, schedule="1f1b")
    assert g.stage_memory == (160.0, 160.0)     # 2 layers x 10 bytes x 8 micro-batches
    assert f.stage_memory == (40.0, 20.0)       # min(8, 2 - s) micro-batches in flight


def test_step_time_and_bubble():
    costs = [LayerProfile(f"l{i}", 0.1 * (i + 1), 0.2 * (i + 1), param_bytes=1000 * (i + 1))
             for i in range(6)]
    for stages, chunks in [(1, 1), (2, 4), (3, 8), (4, 1)]:
        plan = partition_layers(costs, stages, chunks, allreduce_cost=1e-6)
        bubble = (stages - 1) / (chunks + stages - 1)
        assert plan.bubble_fraction == pytest.approx(bubble)
        reduce_s = max(1e-6 * sum(c.param_bytes for c in costs[a:b]) for a, b in plan.ranges)
        assert plan.allreduce_s == pytest.approx(reduce_s)
        assert plan.predicted_step_s == pytest.approx(
            (chunks + stages - 1) * max(plan.stage_times) + reduce_s)
        assert plan.balance == pytest.approx(max(plan.stage_times) / min(plan.stage_times))
        assert f"{stages} stages" in plan.report()
    one = partition_layers(costs, 1, 3)
    assert one.ranges == ((0, 6),) and one.bubble_fraction == 0.0
    assert one.stage_times[0] == pytest.approx(sum(c.time_s for c in costs))


def test_boundary_cost_callable_and_ties():
    # equal layers: the split is even; boundary transfers charged on both sides of a cut
    costs = [LayerProfile(f"l{i}", 1.0, 1.0, output_bytes=100) for i in range(8)]
    plan = partition_layers(costs, 4, 2, boundary_cost=link_cost(latency_s=0.5, bandwidth=100))
    assert plan.ranges == ((0, 2), (2, 4), (4, 6), (6, 8))
    assert plan.stage_times == pytest.approx((5.5, 7.0, 7.0, 5.5))
    # one dominant layer fixes the slowest stage whatever the rest does: among the optimal
    # splits the evener one is chosen
    costs = [LayerProfile("big", 10.0, 0.0)] + [LayerProfile(f"l{i}", 1.0, 0.0)
                                                 for i in range(6)]
    plan = partition_layers(costs, 3, 1)
    assert plan.ranges == ((0, 1), (1, 4), (4, 7))
    # zero-cost layers: a valid split, balance reported as infinite
    zero = [LayerProfile(f"z{i}", 0.0, 0.0) for i in range(5)]
    plan = partition_layers(zero, 5, 1)
    assert plan.ranges == tuple((i, i + 1) for i in range(5))
    assert plan.balance == math.inf


@pytest.mark.parametrize("args,match", [
    (dict(stages=0, chunks=1), "stages must be an integer >= 1"),
    (dict(stages=4, chunks=1), "4 stages for 3 layers"),
    (dict(stages=2, chunks=0), "chunks must be an integer >= 1"),
    (dict(stages=2, chunks=1, schedule="pipedream"), "schedule must be one of"),
])
def test_bad_arguments(args, match):
    costs = [LayerProfile(f"l{i}", 1, 1) for i in range(3)]
    with pytest.raises(ValueError, match=match):
        partition_layers(costs, **args)
