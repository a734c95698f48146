"""The memory planner's dynamic program against brute force (no MPI).

Every plan of a small random instance (each of the 3^n keep/offload/recompute assignments,
with every way of cutting its runs of recompute layers into checkpoint segments) is scored by
an independent transcription of the model in ``disttensor.nn.memory.planner``'s docstring; the DP's
added time must equal the best feasible one, its peak must respect the budget, and its own
figures must agree with the transcription.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from disttensor.nn.memory import (CHOICES, LayerProfile, MemoryPlan, MemoryProfile,
                                  evaluate_plan, plan_memory)


def instance(rng, n, bandwidth=100.0):
    layers = [LayerProfile(f"l{i}", int(rng.integers(0, 40)), int(rng.integers(1, 30)),
                           int(rng.integers(1, 30)), float(rng.uniform(0.01, 1.0)),
                           float(rng.uniform(0.01, 1.0))) for i in range(n)]
    return MemoryProfile(layers, bandwidth=bandwidth, bandwidth_assumed=True)


def model(prof, choices, segments):
    """The docstring's model, written out independently: (peak, added time)."""
    L, B, n = prof.layers, prof.bandwidth, len(prof.layers)
    resident = sum(L[i].saved_bytes for i in range(n) if choices[i] == "keep")
    transients = [0]
    added = 0.0
    for i in range(n):
        if choices[i] == "offload":
            t = L[i].saved_bytes / B
            fn = L[i + 1].forward_time if i + 1 < n else 0.0
            bn = L[i + 1].backward_time if i + 1 < n else 0.0
            added += max(0.0, t - fn) + max(0.0, t - bn)
            transients.append(L[i].saved_bytes)
    for j, k in segments:
        resident += L[j].input_bytes
        transients.append(sum(L[i].saved_bytes for i in range(j, k)) + L[k - 1].output_bytes)
        added += sum(L[i].forward_time for i in range(j, k))
    return resident + max(transients), added


def all_plans(n):
    """Every assignment with every segmentation of its recompute runs."""
    for choices in itertools.product(CHOICES, repeat=n):
        runs, i = [], 0
        while i < n:
            if choices[i] == "recompute":
                j = i
                while j < n and choices[j] == "recompute":
                    j += 1
                runs.append((i, j))
                i = j
            else:
                i += 1
        cuts_per_run = []
        for j, k in runs:  # each subset of the k - j - 1 inner boundaries
            opts = []
            for mask in range(2 ** (k - j - 1)):
                bounds = [j] + [j + 1 + b for b in range(k - j - 1) if mask >> b & 1] + [k]
                opts.append([(a, b) for a, b in zip(bounds, bounds[1:])])
            cuts_per_run.append(opts)
        for combo in itertools.product(*cuts_per_run):
            yield choices, [seg for run in combo for seg in run]


def brute(prof, budget, allow_offload=True, allow_recompute=True):
    best, least = math.inf, math.inf
    for choices, segs in all_plans(len(prof.layers)):
        if not allow_offload and "offload" in choices:
            continue
        if not allow_recompute and "recompute" in choices:
            continue
        peak, added = model(prof, choices, segs)
        least = min(least, peak)
        if peak <= budget:
            best = min(best, added)
    return best, least


@pytest.mark.parametrize("seed", range(24))
def test_dp_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 7)) if seed % 4 else 7 - seed % 3
    prof = instance(rng, n, bandwidth=float(rng.choice([5.0, 40.0, 1000.0])))
    allow_offload = seed % 5 != 1
    allow_recompute = seed % 5 != 2
    keep_all = sum(lp.saved_bytes for lp in prof.layers)
    _, least = brute(prof, 0, allow_offload, allow_recompute)
    for budget in sorted({least, (least + keep_all) // 2, keep_all - 1, keep_all + 5}):
        if budget < least:
            continue
        want, _ = brute(prof, budget, allow_offload, allow_recompute)
        plan = plan_memory(prof, budget, unit=1, allow_offload=allow_offload,
                           allow_recompute=allow_recompute)
        peak, added = model(prof, plan.choices, plan.segments)
        assert peak <= budget, (plan.choices, plan.segments, peak, budget)
        assert added == pytest.approx(want, rel=1e-12, abs=1e-12), (budget, plan.report())
        assert plan.peak == peak and plan.added_time == pytest.approx(added, abs=1e-12)
        assert evaluate_plan(prof, plan.choices, segments=plan.segments) == \
            (plan.peak, pytest.approx(plan.added_time))
        if not allow_offload:
            assert "offload" not in plan.choices
        if not allow_recompute:
            assert "recompute" not in plan.choices


@pytest.mark.parametrize("seed", range(6))
def test_budget_below_minimum_raises(seed):
    rng = np.random.default_rng(100 + seed)
    prof = instance(rng, 5)
    allow_offload = seed % 2 == 0
    _, least = brute(prof, 0, allow_offload, True)
    with pytest.raises(ValueError, match="below the smallest peak"):
        plan_memory(prof, least - 1, unit=1, allow_offload=allow_offload)
    plan = plan_memory(prof, least, unit=1, allow_offload=allow_offload)
    assert plan.peak <= least
    if allow_offload:  # then the least peak is the largest layer (all offloaded reaches it)
        assert least == max(lp.saved_bytes for lp in prof.layers)
    with pytest.raises(ValueError, match="budget_bytes must be a number"):
        plan_memory(prof, -1)


@pytest.mark.parametrize("extra", [0, 1, 10 ** 6])
def test_budget_of_keep_all_keeps_everything(extra):
    prof = instance(np.random.default_rng(7), 6)
    keep_all = prof.keep_all_peak
    plan = plan_memory(prof, keep_all + extra)
    assert plan.choices == ("keep",) * 6 and plan.segments == []
    assert plan.added_time == 0.0 and plan.peak == keep_all
    assert "keep 6, offload 0, recompute 0" in plan.report()


def test_rounded_units_still_fit_the_budget():
    """With sizes that are not multiples of the unit, sizes are rounded up: the plan fits
    (exact bytes), and it is never better than the exact optimum."""
    for seed in range(8):
        rng = np.random.default_rng(200 + seed)
        prof = MemoryProfile([LayerProfile(f"l{i}", int(rng.integers(1000, 90000)),
                                           int(rng.integers(1000, 30000)), 1,
                                           float(rng.uniform(0.01, 1)),
                                           float(rng.uniform(0.01, 1)))
                              for i in range(6)], bandwidth=1e5)
        budget = int(0.5 * prof.keep_all_peak)
        best, least = brute(prof, budget)
        if budget < least:
            continue
        plan = plan_memory(prof, budget, resolution=64)
        assert plan.unit > 1
        peak, added = model(prof, plan.choices, plan.segments)
        assert peak <= budget
        assert added >= best - 1e-12


def test_plan_by_hand_and_segments_checked():
    plan = MemoryPlan(("keep", "recompute", "recompute", "offload", "recompute"))
    assert plan.segments == [(1, 3), (4, 5)]
    plan = MemoryPlan(("recompute",) * 4, segments=[(0, 1), (1, 4)])
    assert plan.segments == [(0, 1), (1, 4)]
    with pytest.raises(ValueError, match="must cut the recompute layers"):
        MemoryPlan(("recompute", "keep"), segments=[(0, 2)])
    with pytest.raises(ValueError, match="unknown choices"):
        MemoryPlan(("keep", "drop"))


def test_segment_cuts_trade_resident_inputs_for_transients():
    """Two big layers behind small inputs: one checkpoint each beats one long checkpoint
    when the budget is tight (the planner chooses the cut)."""
    L = [LayerProfile("a", 100, 1, 1, 0.1, 0.1), LayerProfile("b", 100, 1, 1, 0.1, 0.1)]
    prof = MemoryProfile(L, bandwidth=1.0)  # offload far too slow
    plan = plan_memory(prof, 103, unit=1)  # inputs 1 + 1, transient 100 + output 1
    assert plan.choices == ("recompute", "recompute") and plan.segments == [(0, 1), (1, 2)]
    assert plan.peak == 103 and plan.added_time == pytest.approx(0.2)
    assert evaluate_plan(prof, plan.choices) == (1 + 201, pytest.approx(0.2))  # one segment
