"""The CPU convolutions' workspace limit relative to a layer-pass's operands
(:func:`disttensor.ops.local.microbatch.settings.relative_workspace_limit`,
:func:`~disttensor.ops.local.microbatch.planner.limit_for`) and its place in the plan key."""
from __future__ import annotations

import numpy as np
import pytest

from disttensor.ops.local import microbatch as mb
from disttensor.ops.local.microbatch.problem import ConvProblem
from disttensor.ops.local.microbatch.settings import (relative_workspace_limit, workspace_ratio,
                                                      workspace_rule)
from disttensor.ops.local.microbatch.sharing import family_of, nearest_similar

MiB = 2 ** 20


def _problem(pass_="forward", x=(4, 4, 16, 16, 16), w=(16, 4, 3, 3, 3), pad=1, dtype="f4"):
    p = (pad,) * 3
    return ConvProblem.make(pass_, x, w, (1, 1, 1), (1, 1, 1), p, p, 1, dtype)


@pytest.mark.parametrize("pass_", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize("pad,dtype", [(1, "f4"), (0, "f8")])
def test_operand_bytes_counts_input_and_output_over_the_batch(pass_, pad, dtype):
    prob = _problem(pass_, x=(3, 4, 10, 9, 8), w=(6, 4, 3, 3, 3), pad=pad, dtype=dtype)
    out = tuple(n + 2 * pad - 2 for n in (10, 9, 8))
    x = np.zeros((3, 4, 10, 9, 8), dtype)
    y = np.zeros((3, 6) + out, dtype)
    assert prob.operand_bytes() == x.nbytes + y.nbytes


def test_relative_limit_is_the_larger_of_the_floor_and_the_ratio():
    assert relative_workspace_limit(10 * MiB, None, 0.5) == 64 * MiB          # floor
    assert relative_workspace_limit(640 * MiB, None, 0.5) == 320 * MiB
    assert relative_workspace_limit(640 * MiB, None, 0.0) == 64 * MiB         # ratio off
    assert relative_workspace_limit(640 * MiB, "8", 0.5) == 8 * MiB           # explicit cap
    assert relative_workspace_limit(640 * MiB, "1000", 0.0) == 1000 * MiB


def test_rule_from_the_environment(monkeypatch):
    monkeypatch.delenv("DISTTENSOR_CONV_WORKSPACE_MB", raising=False)
    monkeypatch.delenv("DISTTENSOR_CONV_WORKSPACE_RATIO", raising=False)
    assert workspace_rule() == (None, 0.5)
    monkeypatch.setenv("DISTTENSOR_CONV_WORKSPACE_RATIO", "off")
    assert workspace_ratio() == 0.0 and workspace_rule() == (None, 0.0)
    monkeypatch.setenv("DISTTENSOR_CONV_WORKSPACE_RATIO", "-1")
    with pytest.raises(ValueError, match="RATIO"):
        workspace_ratio()
    monkeypatch.setenv("DISTTENSOR_CONV_WORKSPACE_MB", "32")   # an explicit limit: no ratio
    assert workspace_rule() == ("32", 0.0)


def test_limit_for_relative_only_where_asked_and_overrides_win(monkeypatch):
    monkeypatch.delenv("DISTTENSOR_CONV_WORKSPACE_MB", raising=False)
    monkeypatch.setenv("DISTTENSOR_CONV_WORKSPACE_RATIO", "0.5")
    big = _problem(x=(4, 4, 128, 128, 128))   # 640 MiB of operands in float32
    assert big.operand_bytes() == 640 * MiB
    assert mb.limit_for(big) == 64 * MiB
    assert mb.limit_for(big, relative=True) == 320 * MiB
    assert mb.limit_for(_problem(), relative=True) == 64 * MiB
    monkeypatch.setenv("DISTTENSOR_CONV_WORKSPACE_MB", "16")
    assert mb.limit_for(big, relative=True) == 16 * MiB
    try:
        mb.set_limit_override(big, 5 * MiB)
        assert mb.limit_for(big, relative=True) == 5 * MiB
    finally:
        mb.set_limit_override(big, None)


def _fields(x, limit, rule):
    f = dict(fingerprint={"device": "cpu"}, problem=_problem(x=x).fields(), limit=limit,
             policy="powerOfTwo", mode="benchmark", algorithms=["a"], margin=0.1)
    if rule is not None:
        f["limit_rule"] = rule
    return f


def test_similar_shapes_under_the_same_rule_share_a_family_whatever_their_limits():
    a = _fields((4, 4, 64, 64, 64), 320 * MiB, [None, 0.5])
    b = _fields((4, 4, 34, 64, 64), 170 * MiB, [None, 0.5])
    assert family_of(a) == family_of(b)
    assert nearest_similar(b, [{"key": a, "plan": "p"}], 2) == "p"
    assert family_of(a) != family_of(_fields((4, 4, 64, 64, 64), 320 * MiB, [None, 0.25]))
    # without a rule the limit's value stays part of the family
    assert family_of(_fields((4, 4, 64, 64, 64), 1, None)) != \
        family_of(_fields((4, 4, 34, 64, 64), 2, None))


# -- online tuning -----------------------------------------------------------------------------
from disttensor.ops.local.microbatch.online import (OnlineTuner, fresh_runs,  # noqa: E402
                                                    online_order, uniform_plan)
from disttensor.ops.local.microbatch.planner import settle  # noqa: E402


def test_uniform_plan_covers_the_batch():
    assert uniform_plan(4, ("a", 2), 7).micro_batches == (("a", 2), ("a", 2))
    assert uniform_plan(5, ("a", 2), 7).micro_batches == (("a", 2), ("a", 2), ("a", 1))
    assert uniform_plan(3, ("a", 8), 7).micro_batches == (("a", 3),)


class _Model:
    def __init__(self, t):
        self.t = t

    def estimate_seconds(self, problem):
        return self.t * problem.batch


def test_online_order_puts_the_model_pick_first():
    prob = _problem()
    algos = {"fast": _Model(1.0), "ok": _Model(1.5), "slow": _Model(10.0)}
    fit = {(n, b): 0 for n in algos for b in (1, 2, 4)}
    order = online_order(prob, algos, fit, 2.0)
    assert order[0][0] == "fast" and len(order) == len(set(order))
    assert set(order) == {(n, b) for n in ("fast", "ok") for b in (1, 2, 4)}
    assert online_order(prob, {"fast": _Model(1.0)}, {("fast", 4): 0}, 2.0) == [("fast", 4)]


def test_online_tuner_records_per_call_times_and_drops_failures():
    t = OnlineTuner(4, [("a", 4), ("b", 1), ("c", 2)])
    t.record(("a", 4), 2.0)
    assert t.next() == ("b", 1) and t.times == {("a", 4): 2.0}
    t.record(("b", 1), 1.0)                       # 1 s for the batch: 0.25 s per call of 1
    assert t.times[("b", 1)] == 0.25
    t.fail(("c", 2))
    # second round, reversed, of the candidates within AGAIN (3x) of the best: both
    assert t.next() == ("b", 1) and not t.done
    t.record(("b", 1), 1.2)                       # the faster run is kept
    assert t.next() == ("a", 4)
    t.record(("a", 4), 1.5)
    assert t.done and t.times == {("a", 4): 1.5, ("b", 1): 0.25}


def test_online_tuner_second_round_only_for_contenders():
    t = OnlineTuner(4, [("a", 4), ("a", 2), ("a", 1), ("b", 4)], again=3.0)
    for key, s in ((("a", 4), 1.0), (("a", 2), 2.9), (("a", 1), 3.5), (("b", 4), 0.5)):
        assert t.next() == key
        t.record(key, s)
    # whole-batch seconds a4 1.0, a2 2.9, a1 3.5, b4 0.5: within 3x of b4 are b4 and a4 only
    assert t.order[4:] == [("b", 4), ("a", 4)]
    t.record(("b", 4), 0.7)
    t.record(("a", 4), 0.8)
    assert t.done and t.times[("b", 4)] == 0.5 and t.times[("a", 4)] == 0.8
    single = OnlineTuner(4, [("a", 4)])
    single.record(("a", 4), 1.0)
    assert single.done


def test_fresh_runs_are_first_runs_of_an_algorithm_or_a_larger_micro_batch():
    order = [("d", 4), ("d", 2), ("w", 1), ("d", 1), ("w", 4), ("w", 2), ("x", 2)]
    assert fresh_runs(order) == {("d", 4), ("w", 1), ("w", 4), ("x", 2)}
    assert fresh_runs([]) == set()


def test_online_tuner_times_a_first_run_slowed_by_one_off_costs_again():
    # the problem's first call pays one-off costs far above AGAIN x the best (measured: 18 ms
    # against 2.5 ms steady): that candidate still runs again, and its steady time wins
    order = [("d", 4), ("d", 2), ("d", 1), ("w", 4), ("w", 1)]
    t = OnlineTuner(4, order, again=3.0)
    for key, s in zip(order, (18.0, 2.9, 2.9, 9.0, 9.0)):
        t.record(key, s)
    # again: within 3x of the best (d2, d1) and the fresh runs (d4, w4); not w1 (9.0 > 8.7)
    assert t.order[5:] == [("w", 4), ("d", 1), ("d", 2), ("d", 4)]
    for key, s in zip(t.order[5:], (9.0, 2.95, 2.9, 2.5)):
        t.record(key, s)
    assert t.done
    fit = {k: 0 for k in order}
    plan = settle(_problem(), fit, t.times, "benchmark")
    assert plan.micro_batches == (("d", 4),)
    # without the fix the first run's 18 s stood and four runs of one sample were taken
    stale = {**t.times, ("d", 4): 18.0}
    assert settle(_problem(), fit, stale, "benchmark").micro_batches != (("d", 4),)


def test_online_tuner_third_round_only_when_two_are_close():
    t = OnlineTuner(4, [("a", 4), ("a", 2), ("b", 4)], again=2.0, close=0.1)
    for key, s in ((("a", 4), 1.0), (("a", 2), 1.05), (("b", 4), 3.0)):
        t.record(key, s)
    assert t.order[3:] == [("b", 4), ("a", 2), ("a", 4)]   # b4 only as a fresh run
    for key, s in ((("b", 4), 3.0), (("a", 2), 1.04), (("a", 4), 1.0)):
        t.record(key, s)
    assert t.order[6:] == [("a", 4), ("a", 2)] and not t.done   # within 10 %: once more
    t.record(("a", 4), 1.2)
    t.record(("a", 2), 0.9)
    assert t.done and t.times == {("a", 4): 1.0, ("a", 2): 0.45, ("b", 4): 3.0}
    lone = OnlineTuner(4, [("a", 4), ("a", 2)], again=2.0, close=0.1)
    for s in (1.0, 1.5, 1.5, 1.0):                    # a2 never within 10 %
        lone.record(lone.next(), s)
    assert lone.done and len(lone.order) == 4


def test_online_tuning_computes_every_call_and_settles(monkeypatch, tmp_path):
    from disttensor.ops.local.cpu import conv_im2col
    from disttensor.ops.local.microbatch import cpu_entry
    monkeypatch.setenv("DISTTENSOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE", "benchmark")
    monkeypatch.delenv("DISTTENSOR_CONV_TUNE_ONLINE", raising=False)
    mb.clear_plans()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 32, 32, 32)).astype(np.float32)
    w = rng.standard_normal((16, 4, 3, 3, 3)).astype(np.float32)
    geo = ((1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    ref = conv_im2col.conv_forward(x.astype(np.float64), w.astype(np.float64), *geo)
    calls = 0
    while True:
        y = cpu_entry.conv_forward(x, w, *geo)
        calls += 1
        np.testing.assert_allclose(y, ref, rtol=1e-3, atol=1e-3)
        if "online" not in mb.last_plan().note:
            break
        assert calls < 40
    assert calls >= 2 and not cpu_entry._tuners
    settled = mb.last_plan()
    assert sum(b for _, b in settled.micro_batches) == 2
    mb.clear_plans()                              # the settled plan was stored on disk
    cpu_entry.conv_forward(x, w, *geo)
    assert mb.last_plan().micro_batches == settled.micro_batches
    assert "online" not in mb.last_plan().note
    mb.clear_plans()
