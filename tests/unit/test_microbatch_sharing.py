"""Reusing tuned convolution plans for similar shapes, and one timing per problem family
among processes sharing the plan cache (:mod:`disttensor.ops.local.microbatch.sharing`)."""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from disttensor.ops.local import microbatch as mb
from disttensor.ops.local.microbatch.plan_cache import fingerprint
from disttensor.ops.local.microbatch.sharing import (family_lock, family_of, nearest_similar,
                                                     spatial_distance)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tuning_clock import scripted_clock  # noqa: E402


def _fields(x_shape, pads=(1, 1, 1), **over):
    prob = dict(pass_="forward", x_shape=list(x_shape), w_shape=[8, 4, 3, 3, 3],
                stride=[1, 1, 1], dilation=[1, 1, 1], pad_lo=list(pads), pad_hi=list(pads),
                groups=1, dtype="<f4")
    prob.update(over.pop("problem", {}))
    f = dict(fingerprint={"device": "cpu", "cpu": "X"}, problem=prob, limit=1 << 26,
             policy="powerOfTwo", mode="benchmark", algorithms=["a", "b"], margin=0.1)
    f.update(over)
    return f


def test_spatial_distance_is_the_log_ratio_within_the_factor():
    assert spatial_distance((4, 4, 16, 16, 16), (4, 4, 16, 16, 16), 2) == 0
    assert spatial_distance((4, 4, 8, 16, 16), (4, 4, 16, 16, 16), 2) == pytest.approx(1.0)
    assert spatial_distance((4, 4, 8, 8, 16), (4, 4, 16, 16, 16), 2) == pytest.approx(2.0)
    assert spatial_distance((4, 4, 7, 16, 16), (4, 4, 16, 16, 16), 2) is None   # > 2x
    assert spatial_distance((4, 4, 16, 16), (4, 4, 16, 16, 16), 2) is None       # ranks differ


def test_nearest_similar_takes_the_nearest_of_the_same_family():
    entries = [{"key": _fields((4, 4, 32, 32, 32)), "plan": "p32"},
               {"key": _fields((4, 4, 20, 16, 16), pads=(0, 1, 1)), "plan": "p20"},
               {"key": _fields((4, 8, 16, 16, 16)), "plan": "other-channels"},
               {"key": _fields((2, 4, 16, 16, 16)), "plan": "other-batch"},
               {"key": _fields((4, 4, 16, 16, 16), limit=1), "plan": "other-limit"},
               {"key": _fields((4, 4, 16, 16, 16), fingerprint={"cpu": "Y"}), "plan": "fp"},
               {"broken": True}]
    want = _fields((4, 4, 16, 16, 16), pads=(1, 0, 0))
    assert nearest_similar(want, entries, 2) == "p20"
    assert nearest_similar(want, entries[:1], 2) == "p32"
    assert nearest_similar(want, entries[:1], 1.5) is None
    assert nearest_similar(want, entries, 0) is None          # reuse off
    assert nearest_similar(_fields((4, 4, 64, 64, 64)), entries, 2) == "p32"  # 2x: similar
    assert nearest_similar(_fields((4, 4, 80, 64, 64)), entries, 2) is None   # 2.5x: too far
    # the family ignores extents and pads only
    assert family_of(want) == family_of(_fields((4, 4, 9, 9, 9)))
    assert family_of(want) != family_of(_fields((4, 4, 9, 9, 9), problem={"stride": [2] * 3}))


def _conv(shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((8, shape[1], 3, 3, 3)).astype(np.float32)
    geo = ((1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1)
    return x, w, geo


@pytest.mark.parametrize("similar", ["2", "off"])
def test_a_similar_shape_reuses_the_tuned_plan(monkeypatch, tmp_path, similar):
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE", "benchmark")
    monkeypatch.setenv("DISTTENSOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE_BUDGET_S", "0.05")
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE_SIMILAR", similar)
    mb.clear_plans()
    rng = np.random.default_rng(0)
    algos = mb.cpu_algorithms(mb.workspace_limit())
    calls = []
    plans = []
    try:
        for shape in ((4, 4, 8, 8, 8), (4, 4, 4, 8, 6)):   # the second: a block of the first
            x, w, geo = _conv(shape, rng)
            prob = mb.ConvProblem.make("forward", x.shape, w.shape, *geo, x.dtype)

            def runner(alg, b, x=x, w=w, geo=geo):
                calls.append(x.shape)
                return alg.forward(x[:b], w, *geo)
            plans.append(mb.get_plan(prob, algos, fingerprint("cpu"), runner))
            out = mb.run_plan(plans[-1], algos, "forward", x, w, None, geo)
            ref = mb.run_pass(algos["im2col-plane"], "forward", x, w, None, geo)
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
        timed_second = any(s == (4, 4, 4, 8, 6) for s in calls)
        if similar == "off":
            assert timed_second
        else:
            assert not timed_second
            assert plans[1].micro_batches == plans[0].micro_batches
            assert plans[1].note == "reused from a similar tuned shape"
            # reused plans are not written to disk: a new process reuses again, never chains
            mb.clear_plans()
            disk = mb.planner._disk.entries(reread=True)
            assert [e["key"]["problem"]["x_shape"] for e in disk] == [[4, 4, 8, 8, 8]]
    finally:
        mb.clear_plans()


def test_family_lock_makes_a_second_holder_wait(tmp_path):
    f = _fields((4, 4, 8, 8, 8))
    events = []

    def second():
        with family_lock(tmp_path, _fields((4, 4, 4, 8, 8), pads=(0, 1, 1))) as waited:
            events.append(("second", waited, time.perf_counter()))
    with family_lock(tmp_path, f) as waited:
        assert waited is False
        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.2)
        released = time.perf_counter()
        assert not events                       # blocked on the same family
    t.join(10)
    assert events and events[0][1] is True and events[0][2] >= released
    with family_lock(tmp_path, _fields((4, 8, 8, 8, 8))) as waited:  # another family
        assert waited is False


def test_family_lock_without_a_writable_directory_does_not_lock(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with family_lock(blocker, _fields((4, 4, 8, 8, 8))) as waited:   # 'locks' cannot be made
        assert waited is False


def test_prefilter_keeps_the_models_best_and_every_size():
    algos = mb.cpu_algorithms(mb.workspace_limit())
    prob = mb.ConvProblem.make("forward", (4, 16, 18, 18, 18), (32, 16, 3, 3, 3), (1, 1, 1),
                               (1, 1, 1), (0, 0, 0), (0, 0, 0), 1, "float32")
    from disttensor.ops.local.microbatch.timing import candidates, model_times
    cands = candidates(prob, algos, [1, 2, 4])
    model = model_times(prob, algos, cands)
    kept = mb.planner.prefilter(prob, algos, cands, 2.0)
    per = {k: t / k[1] for k, t in model.items()}
    best = min(per.values())
    assert set(kept) <= set(cands) and len(kept) < len(cands)
    assert {b for _, b in kept} == {1, 2, 4}
    for k in cands:
        if per[k] <= 2 * best:
            assert k in kept
    for b in (1, 2, 4):
        assert min((k for k in per if k[1] == b), key=per.get) in kept
    assert mb.planner.prefilter(prob, algos, cands, 0) == cands


# -- online tuning settles on the plan a peer stored first ----------------------------------
@pytest.mark.parametrize("peer", [False, True])
def test_online_tuning_settles_on_the_plan_a_peer_stored_first(monkeypatch, tmp_path, peer):
    """Two processes sharing the plan cache (the ranks of a job on one node) tune the same
    layer: the one settling second keeps the plan the first stored, whatever its own times,
    so the ranks run one plan; without a peer the scripted times decide."""
    from disttensor.ops.local.cpu import conv_im2col
    from disttensor.ops.local.microbatch import cpu_entry, planner
    from disttensor.ops.local.microbatch.online import online_order, uniform_plan
    from disttensor.ops.local.microbatch.plan_cache import PlanCache
    monkeypatch.setenv("DISTTENSOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE", "benchmark")
    monkeypatch.delenv("DISTTENSOR_CONV_TUNE_ONLINE", raising=False)
    monkeypatch.setattr(cpu_entry, "ONLINE_MIN_FLOPS", 0)       # tune this small layer online
    mb.clear_plans()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 6, 5, 4)).astype(np.float32)
    w = rng.standard_normal((8, 4, 3, 3, 3)).astype(np.float32)
    geo = ((1, 1, 1), (1, 1, 1), (1, 0, 1), (1, 1, 0))
    ref = conv_im2col.conv_forward(x.astype(np.float64), w.astype(np.float64), *geo)
    prob = mb.ConvProblem.make("forward", x.shape, w.shape, *geo, 1, x.dtype)
    limit = mb.limit_for(prob, relative=True)
    algos = mb.cpu_algorithms(limit)
    fit, _ = planner.fitting_candidates(prob, algos, limit, mb.policy())
    order = online_order(prob, algos, fit, mb.settings.model_prefilter())
    mine = next(k for k in order if k[1] == 2)                  # this process: undivided
    theirs = next(k for k in order if k[1] == 1)                # the peer: one at a time
    monkeypatch.setattr(cpu_entry, "tuning_clock",
                        scripted_clock(lambda k: 1.0 if k == mine else 2.0 + order.index(k)))
    fields = planner._keys(prob, algos, fingerprint("cpu"), limit, True)[1]
    peer_plan = mb.Plan(uniform_plan(2, theirs, fit[theirs]).micro_batches, 1.0, fit[theirs])
    try:
        calls = 0
        while True:
            y = cpu_entry.conv_forward(x, w, *geo)
            calls += 1
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
            if calls == 1 and peer:   # the peer settles while this process is tuning
                PlanCache(tmp_path).put(fields, peer_plan.to_json())
            if not cpu_entry._tuners:
                break
            assert calls < 40
        np.testing.assert_allclose(cpu_entry.conv_forward(x, w, *geo), ref, rtol=1e-4,
                                   atol=1e-4)
        settled = mb.last_plan().micro_batches
        stored = PlanCache(tmp_path).get(fields)
        if peer:
            assert settled == peer_plan.micro_batches != ((mine[0], 2),)
            assert stored == peer_plan.to_json()                # this process's not written
        else:
            assert settled == ((mine[0], 2),)
            assert mb.Plan.from_json(stored).micro_batches == settled
        mb.clear_plans()                                        # the next run reads the disk
        np.testing.assert_allclose(cpu_entry.conv_forward(x, w, *geo), ref, rtol=1e-4,
                                   atol=1e-4)
        assert mb.last_plan().micro_batches == settled
    finally:
        mb.clear_plans()
