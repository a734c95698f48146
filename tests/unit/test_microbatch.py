"""Micro-batched convolution (disttensor.ops.local.microbatch, mu-cuDNN): every CPU algorithm
and every micro-batch division against the serial float64 reference (tests/reference.py);
the dynamic program and the whole-network workspace division against brute force; the
workspace limit; the plan cache on disk; the benchmark mode end to end on tiny shapes."""
from __future__ import annotations

import itertools
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from disttensor.ops.local import kernels_for
from disttensor.ops.local import microbatch as mb
from disttensor.ops.local.cpu import conv_im2col as cpu_conv
from disttensor.ops.local.microbatch.plan_cache import PlanCache, fingerprint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reference as ref  # noqa: E402

# (N, Cin, spatial, Cout, kernel, stride, dilation, pad_lo, pad_hi, groups)
CASES = [
    (3, 2, (5, 4, 6), 3, (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1),
    (5, 4, (6, 5, 7), 6, (3, 2, 3), (2, 1, 1), (1, 2, 1), (1, 0, 2), (0, 1, 1), 2),
    (4, 3, (7, 6, 5), 3, (2, 3, 2), (1, 2, 2), (2, 1, 1), (0, 2, 1), (2, 0, 0), 3),
    (7, 2, (4, 4, 4), 4, (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0), 1),
]
IDS = [f"case{i}" for i in range(len(CASES))]


def _data(case, dtype=np.float64, seed=0):
    n, cin, sp, cout, k, s, d, lo, hi, g = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, cin) + sp).astype(dtype)
    w = rng.standard_normal((cout, cin // g) + k).astype(dtype)
    out = cpu_conv.conv_out_shape(sp, k, s, d, lo, hi)
    dy = rng.standard_normal((n, cout) + out).astype(dtype)
    return x, w, dy, (s, d, lo, hi, g)


def _reference(x, w, dy, geo):
    s, d, lo, hi, g = geo
    pads = tuple(zip(lo, hi))
    y = ref.conv(x, w, None, s, pads, d, g)
    dx, dw, _ = ref.conv_backward(x, w, dy, s, pads, d, g)
    return y, dx, dw


def _tol(dtype):
    return dict(rtol=1e-10, atol=1e-10) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-4)


def _all_algorithms():
    return mb.cpu_algorithms(64 * 2**20)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("name", sorted(_all_algorithms()))
def test_every_algorithm_matches_reference(case, name):
    """Each algorithm of the registry (the direct kernels included when they import), on every
    pass, over strides, dilations, asymmetric padding, groups and odd batches."""
    x, w, dy, geo = _data(case)
    y_ref, dx_ref, dw_ref = _reference(x, w, dy, geo)
    alg = _all_algorithms()[name]
    prob = mb.ConvProblem.make("forward", x.shape, w.shape, *geo, x.dtype)
    for pass_, want in (("forward", y_ref), ("backward_data", dx_ref),
                        ("backward_filter", dw_ref)):
        args = mb.ConvProblem.make(pass_, x.shape, w.shape, *geo, x.dtype).args()
        if not alg.supports(*args):
            continue
        assert alg.workspace_bytes(*args) >= 0
        if pass_ == "forward":
            got = alg.forward(x, w, *geo)
        elif pass_ == "backward_data":
            got = alg.backward_data(dy, w, x.shape[2:], *geo)
        else:
            got = alg.backward_filter(x, dy, w.shape[2:], *geo)
        np.testing.assert_allclose(got, want, **_tol(x.dtype), err_msg=f"{name} {pass_}")
    assert prob.batch == x.shape[0]


def _divisions(n, names):
    """A few divisions of n samples mixing the algorithms (deterministic)."""
    out = [[(names[0], n)]]
    sizes = [[1] * n, [2] * (n // 2) + [1] * (n % 2), [n - 1, 1] if n > 1 else [1],
             [3, n - 3] if n > 3 else [n]]
    for k, sz in enumerate(sizes):
        out.append([(names[(i + k) % len(names)], b) for i, b in enumerate(sz)])
    return out


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_division_matches_reference(case, dtype):
    """run_plan over divisions of the batch into micro-batches (uneven, mixed algorithms):
    outputs and data gradients are written per micro-batch, filter gradients accumulated."""
    x, w, dy, geo = _data(case, dtype)
    y_ref, dx_ref, dw_ref = _reference(x, w, dy, geo)
    algos = _all_algorithms()
    names = sorted(a for a in algos if algos[a].supports(
        *mb.ConvProblem.make("forward", x.shape, w.shape, *geo, dtype).args()))
    for parts in _divisions(x.shape[0], names):
        plan = mb.Plan(tuple(parts), 0.0, 0)
        msg = f"division {parts}"
        np.testing.assert_allclose(mb.run_plan(plan, algos, "forward", x, w, None, geo), y_ref,
                                   **_tol(dtype), err_msg=msg)
        np.testing.assert_allclose(mb.run_plan(plan, algos, "backward_data", dy, w,
                                               x.shape[2:], geo), dx_ref, **_tol(dtype),
                                   err_msg=msg)
        dw = mb.run_plan(plan, algos, "backward_filter", x, dy, w.shape[2:], geo)
        np.testing.assert_allclose(dw, dw_ref, **_tol(dtype), err_msg=msg)
        assert dw.dtype == dtype


def test_workspace_keyword_of_cpu_conv():
    """cpu_conv's tile size is a choice: one plane per tile or everything, same results, and
    the tiled workspace follows the bound."""
    x, w, dy, geo = _data(CASES[1])
    y_ref, dx_ref, dw_ref = _reference(x, w, dy, geo)
    for ws in (0, 1, 10**9, None):
        np.testing.assert_allclose(cpu_conv.conv_forward(x, w, *geo, workspace_bytes=ws),
                                   y_ref, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(cpu_conv.conv_backward_data(dy, w, x.shape[2:], *geo,
                                                               workspace_bytes=ws),
                                   dx_ref, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(cpu_conv.conv_backward_filter(x, dy, w.shape[2:], *geo,
                                                                 workspace_bytes=ws),
                                   dw_ref, rtol=1e-10, atol=1e-10)
    args = ("forward", x.shape, w.shape, *geo, np.float64)
    one = cpu_conv.tiled_workspace_bytes(*args, 0)
    big = cpu_conv.tiled_workspace_bytes(*args, 10**9)
    assert 0 < one < big
    assert cpu_conv.batched_workspace_bytes(*args) > cpu_conv.batched_workspace_bytes(
        "forward", (1,) + x.shape[1:], *args[2:])


@pytest.mark.parametrize("mode", ["heuristic", "benchmark", "off"])
@pytest.mark.parametrize("case", CASES[:2], ids=IDS[:2])
def test_kernels_for_goes_through_the_planner(case, mode, monkeypatch, tmp_path):
    """kernels_for(numpy).conv_* equal the reference in every mode; benchmark mode writes the
    cache file."""
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE", mode)
    monkeypatch.setenv("DISTTENSOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE_BUDGET_S", "0.5")
    mb.clear_plans()
    x, w, dy, geo = _data(case, np.float32)
    y_ref, dx_ref, dw_ref = _reference(x, w, dy, geo)
    k = kernels_for(x)
    assert k.conv_forward is mb.conv_forward
    np.testing.assert_allclose(k.conv_forward(x, w, *geo), y_ref, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(k.conv_backward_data(dy, w, x.shape[2:], *geo), dx_ref,
                               rtol=2e-4, atol=2e-4)
    dw = k.conv_backward_filter(x, dy, w.shape[2:], *geo)
    np.testing.assert_allclose(dw, dw_ref, rtol=2e-4, atol=2e-4)
    assert dw.dtype == np.float32
    written = (tmp_path / "conv_plans.json").exists()
    assert written == (mode == "benchmark")
    if written:
        entries = json.loads((tmp_path / "conv_plans.json").read_text())["entries"]
        assert {e["key"]["problem"]["pass_"] for e in entries.values()} == set(mb.PASSES)
    mb.clear_plans()


def test_malformed_input_raises_the_kernel_errors():
    x = np.zeros((2, 3, 4, 4, 4))
    with pytest.raises(ValueError, match="groups"):
        mb.conv_forward(x, np.zeros((4, 3, 1, 1, 1)), (1,) * 3, (1,) * 3, (0,) * 3, (0,) * 3, 2)
    with pytest.raises(TypeError, match="float32 or float64"):
        mb.conv_forward(x.astype(np.int32), np.zeros((4, 3, 1, 1, 1), np.int32), (1,) * 3,
                        (1,) * 3, (0,) * 3, (0,) * 3, 1)
    with pytest.raises(ValueError, match="dy has"):
        mb.conv_backward_data(np.zeros((2, 4, 3, 3, 3)), np.zeros((4, 3, 1, 1, 1)), (4, 4, 4),
                              (1,) * 3, (1,) * 3, (0,) * 3, (0,) * 3, 1)
    y = mb.conv_forward(np.zeros((0, 3, 4, 4, 4)), np.zeros((4, 3, 1, 1, 1)), (1,) * 3,
                        (1,) * 3, (0,) * 3, (0,) * 3, 1)
    assert y.shape == (0, 4, 4, 4, 4)


def test_bad_configuration_raises(monkeypatch):
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE", "fastest")
    with pytest.raises(ValueError, match="DISTTENSOR_CONV_TUNE"):
        mb.tune_mode()
    monkeypatch.setenv("DISTTENSOR_CONV_POLICY", "some")
    with pytest.raises(ValueError, match="DISTTENSOR_CONV_POLICY"):
        mb.policy()


# -- pure planning ---------------------------------------------------------------------------
def test_candidate_sizes():
    assert mb.candidate_sizes(1, "powerOfTwo") == [1]
    assert mb.candidate_sizes(12, "powerOfTwo") == [1, 2, 4, 8, 12]
    assert mb.candidate_sizes(8, "powerOfTwo") == [1, 2, 4, 8]
    assert mb.candidate_sizes(5, "all") == [1, 2, 3, 4, 5]
    assert mb.candidate_sizes(5, "undivided") == [5]
    with pytest.raises(ValueError):
        mb.candidate_sizes(0, "all")
    with pytest.raises(ValueError):
        mb.candidate_sizes(3, "half")


def _brute_division(n, times):
    """Min total time over every ordered sequence of entries whose sizes sum to n."""
    best = math.inf

    def rec(m, acc):
        nonlocal best
        if m == 0:
            best = min(best, acc)
            return
        for (_, b), t in times.items():
            if b <= m:
                rec(m - b, acc + t)
    rec(n, 0.0)
    return best


@pytest.mark.parametrize("seed", range(25))
def test_dynamic_program_is_optimal(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    sizes = sorted(set(rng.choice(np.arange(1, n + 1), size=min(n, 3), replace=False).tolist())
                   | ({1} if seed % 3 else set()))
    times, ws = {}, {}
    for a in ("A", "B", "C"):
        for b in sizes:
            if rng.random() < 0.8:
                times[(a, b)] = float(rng.uniform(0.1, 1.0) * b ** rng.uniform(0.5, 1.2))
                ws[(a, b)] = int(rng.integers(0, 100) * b)
    limit = int(rng.integers(0, 300))
    fit = {k: t for k, t in times.items() if ws[k] <= limit}
    got = mb.optimal_division(n, times, ws, limit)
    want = _brute_division(n, fit)
    if want == math.inf:
        assert got is None
        return
    total, parts = got
    assert total == pytest.approx(want, rel=1e-12)
    assert sum(b for _, b in parts) == n
    assert all(ws[p] <= limit for p in parts)
    assert sum(times[p] for p in parts) == pytest.approx(total, rel=1e-12)


def test_dynamic_program_prefers_fewer_micro_batches_on_ties():
    total, parts = mb.optimal_division(4, {("a", 1): 1.0, ("a", 2): 2.0, ("a", 4): 4.0})
    assert total == 4.0 and parts == [("a", 4)]


def _brute_wd(sets, budget):
    best = (math.inf, None)
    keys = list(sets)
    for combo in itertools.product(*(sets[k] for k in keys)):
        if sum(c.workspace for c in combo) <= budget:
            t = sum(c.seconds for c in combo)
            if t < best[0]:
                best = (t, combo)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_workspace_division_is_optimal(seed):
    rng = np.random.default_rng(100 + seed)
    sets = {f"layer{i}": [mb.Config(float(rng.uniform(0.1, 5)), int(rng.integers(0, 50)))
                          for _ in range(int(rng.integers(1, 5)))]
            for i in range(int(rng.integers(1, 6)))}
    budget = int(rng.integers(0, 150))
    want, combo = _brute_wd(sets, budget)
    if combo is None:
        with pytest.raises(ValueError, match="budget"):
            mb.divide_workspace(sets, budget)
        return
    got = mb.divide_workspace(sets, budget)
    assert set(got) == set(sets)
    assert sum(c.workspace for c in got.values()) <= budget
    assert all(c in sets[k] for k, c in got.items())
    assert sum(c.seconds for c in got.values()) == pytest.approx(want, rel=1e-12)


def test_pareto_front():
    cs = [mb.Config(5, 0), mb.Config(3, 10), mb.Config(4, 12), mb.Config(1, 20), mb.Config(1, 30)]
    assert mb.pareto_front(cs) == [cs[0], cs[1], cs[3]]


# -- the workspace limit ---------------------------------------------------------------------
class _Fake:
    """A synthetic algorithm (runs the tiled kernel) with a given workspace and modelled time."""

    def __init__(self, ws_per_sample, seconds_per_sample):
        self.ws, self.t = ws_per_sample, seconds_per_sample
        self.inner = mb.Im2colTiled(None)

    def supports(self, *args):
        return True

    def workspace_bytes(self, pass_, x_shape, *rest):
        return self.ws * x_shape[0]

    def estimate_seconds(self, problem):
        return self.t * problem.batch

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_over_limit_algorithm_is_never_chosen():
    prob = mb.ConvProblem.make("forward", (8, 2, 4, 4, 4), (2, 2, 3, 3, 3), (1,) * 3,
                               (1,) * 3, (1,) * 3, (1,) * 3, 1, np.float64)
    algos = {"fast-but-big": _Fake(1000, 1e-6), "slow-small": _Fake(10, 1.0)}
    for limit in (3999, 4000, 8000, 10**6):
        for pol in mb.POLICIES:
            plan = mb.plan_problem(prob, algos, limit, pol, "heuristic")
            assert plan.workspace <= limit
            for a, b in plan.micro_batches:
                assert algos[a].workspace_bytes("forward", (b,)) <= limit
            assert sum(b for _, b in plan.micro_batches) == 8
    plan = mb.plan_problem(prob, algos, 4000, "powerOfTwo", "heuristic")
    assert plan.micro_batches == (("fast-but-big", 4), ("fast-but-big", 4))
    plan = mb.plan_problem(prob, algos, 10**6, "powerOfTwo", "heuristic")
    assert plan.micro_batches == (("fast-but-big", 8),)
    plan = mb.plan_problem(prob, algos, 999, "powerOfTwo", "heuristic")
    assert {a for a, _ in plan.micro_batches} == {"slow-small"}


def test_limit_nothing_fits_falls_back_to_smallest_workspace():
    """Documented choice: the limit is raised to the smallest workspace (at the smallest
    micro-batch), with a RuntimeWarning and a note in the plan; the result stays exact."""
    x, w, dy, geo = _data(CASES[1])
    prob = mb.ConvProblem.make("forward", x.shape, w.shape, *geo, x.dtype)
    algos = mb.cpu_algorithms(1)
    mb.timing._warned.clear()  # warnings are once per process
    with pytest.warns(RuntimeWarning, match="no convolution algorithm fits"):
        plan = mb.plan_problem(prob, algos, 1, "powerOfTwo", "heuristic")
    assert "raised" in plan.note
    smallest = min(a.workspace_bytes(*prob.with_batch(1).args()) for a in algos.values())
    assert plan.workspace == smallest
    y_ref, _, _ = _reference(x, w, dy, geo)
    np.testing.assert_allclose(mb.run_plan(plan, algos, "forward", x, w, None, geo), y_ref,
                               rtol=1e-10, atol=1e-10)


def test_pareto_set_and_plan_network(monkeypatch):
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE", "heuristic")
    probs = [mb.ConvProblem.make(p, (4, 8, 6, 6, 6), (8, 8, 3, 3, 3), (1,) * 3, (1,) * 3,
                                 (1,) * 3, (1,) * 3, 1, np.float32) for p in mb.PASSES]
    budget = 2 * 2**20
    layers = [(p, mb.cpu_algorithms(budget), None) for p in probs]
    for p, algos, _ in layers:
        front = mb.pareto_set(p, algos, budget, "powerOfTwo", "heuristic")
        assert front and all(c.workspace <= budget for c in front)
        assert [c.workspace for c in front] == sorted(c.workspace for c in front)
        assert all(a.seconds > b.seconds for a, b in zip(front, front[1:]))
    try:
        wd = mb.plan_network(layers, budget, "WD", mode="heuristic")
        assert sum(p.workspace for p in wd.values()) <= budget
        wr = mb.plan_network(layers, budget, "WR", mode="heuristic")
        assert all(p.workspace <= budget for p in wr.values())
        # WR may use the whole budget per layer: never slower than WD
        assert sum(p.seconds for p in wr.values()) <= sum(p.seconds for p in wd.values()) + 1e-12
        assert mb.planner._limit_overrides[probs[0]] == budget
    finally:
        mb.clear_limit_overrides()


# -- benchmark mode and the cache ------------------------------------------------------------
def test_benchmark_mode_times_once_then_reads_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE", "benchmark")
    monkeypatch.setenv("DISTTENSOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE_BUDGET_S", "0.5")
    mb.clear_plans()
    x, w, dy, geo = _data(CASES[0], np.float32)
    prob = mb.ConvProblem.make("forward", x.shape, w.shape, *geo, x.dtype)
    algos = mb.cpu_algorithms(mb.workspace_limit())
    calls = []

    def runner(alg, b):
        calls.append(b)
        return alg.forward(x[:b], w, *geo)
    plan = mb.get_plan(prob, algos, fingerprint("cpu"), runner)
    assert calls and sum(b for _, b in plan.micro_batches) == x.shape[0]
    n_calls = len(calls)
    mb.clear_plans()  # a new process: the plan comes from disk, nothing is timed
    again = mb.get_plan(prob, algos, fingerprint("cpu"), runner)
    assert again == plan and len(calls) == n_calls
    # a key change (another limit) plans anew
    monkeypatch.setenv("DISTTENSOR_CONV_WORKSPACE_MB", "1")
    mb.get_plan(prob, mb.cpu_algorithms(mb.workspace_limit()), fingerprint("cpu"), runner)
    assert len(calls) > n_calls
    mb.clear_plans()


def _fields(**over):
    f = dict(fingerprint={"device": "cpu", "cpu": "X", "numpy": "2"}, problem={"pass_": "forward"},
             limit=64, policy="powerOfTwo", mode="benchmark", algorithms=["a", "b"])
    f.update(over)
    return f


def test_cache_round_trip_and_key_changes(tmp_path):
    c = PlanCache(tmp_path)
    plan = mb.Plan((("a", 2), ("b", 1)), 0.5, 100, "")
    c.put(_fields(), plan.to_json())
    assert mb.Plan.from_json(PlanCache(tmp_path).get(_fields())) == plan
    for change in (dict(limit=65), dict(policy="all"), dict(algorithms=["a"]),
                   dict(fingerprint={"device": "cpu", "cpu": "Y", "numpy": "2"}),
                   dict(fingerprint={"device": "cpu", "cpu": "X", "numpy": "3"})):
        assert PlanCache(tmp_path).get(_fields(**change)) is None
    # merging: a second writer's entry and the first survive together
    other = PlanCache(tmp_path)
    other.put(_fields(limit=7), {"x": 1})
    fresh = PlanCache(tmp_path)
    assert fresh.get(_fields(limit=7)) == {"x": 1} and fresh.get(_fields()) is not None
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("content", ["{not json", json.dumps([1, 2]),
                                     json.dumps({"format": 99, "entries": {}})])
def test_corrupt_cache_is_ignored_with_a_warning(tmp_path, content):
    (tmp_path / "conv_plans.json").write_text(content)
    c = PlanCache(tmp_path)
    with pytest.warns(RuntimeWarning, match="plan cache"):
        assert c.get(_fields()) is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c.put(_fields(), {"ok": True})
    assert PlanCache(tmp_path).get(_fields()) == {"ok": True}


def test_unwritable_cache_warns_once_and_keeps_plans_in_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    c = PlanCache(blocker / "sub")  # a directory below a file cannot be made
    with pytest.warns(RuntimeWarning, match="cannot write"):
        c.put(_fields(), {"v": 1})
    assert c.get(_fields()) == {"v": 1}


def test_choose_division_keeps_undivided_within_the_margin():
    times = {("a", 4): 1.0, ("a", 2): 0.49, ("b", 1): 0.3}
    assert mb.choose_division(4, times, 0.05) == (1.0, [("a", 4)])
    total, parts = mb.choose_division(4, {**times, ("a", 2): 0.45}, 0.05)
    assert total == pytest.approx(0.9) and parts == [("a", 2), ("a", 2)]
    assert mb.choose_division(4, {("b", 1): 0.3}, 0.05) == (pytest.approx(1.2), [("b", 1)] * 4)


def test_rotating_slices_cover_the_batch():
    take = mb.rotating_slices(5)
    assert [take(2) for _ in range(3)] == [slice(0, 2), slice(2, 4), slice(0, 2)]
    take = mb.rotating_slices(4)
    assert [take(1) for _ in range(5)] == [slice(i % 4, i % 4 + 1) for i in range(5)]
    assert take(4) == slice(0, 4)


def test_measure_times_budget_and_failures():
    """The smallest size is always timed, larger ones only within the budget; a raising
    candidate is dropped with a warning; each timed run covers the whole batch."""
    prob = mb.ConvProblem.make("forward", (4, 1, 3, 3, 3), (1, 1, 1, 1, 1), (1,) * 3,
                               (1,) * 3, (0,) * 3, (0,) * 3, 1, np.float64)
    calls = []

    def runner(alg, b):
        calls.append((alg, b))
        if alg == "bad":
            raise RuntimeError("boom")
    algos = {"a": "a", "b": "b", "bad": "bad"}
    mb.timing._warned.clear()  # warnings are once per process
    cands = {("a", 1): 0, ("b", 1): 0, ("a", 4): 0, ("bad", 1): 0}
    with pytest.warns(RuntimeWarning, match="failed while being timed"):
        got = mb.measure_times(prob, cands, algos, runner, budget_s=0.0, reps=3, always=())
    assert set(got) == {("a", 1), ("b", 1)}
    assert calls.count(("a", 1)) == 1 + 4  # warm-up + one round of N // b calls
    # the whole-batch (undivided) candidates are timed whatever the budget, by default
    got = mb.measure_times(prob, cands, algos, runner, budget_s=0.0, reps=3)
    assert set(got) == {("a", 1), ("b", 1), ("a", 4)}
    calls.clear()
    got = mb.measure_times(prob, cands, algos, runner, budget_s=1e9, reps=2)
    assert set(got) == {("a", 1), ("b", 1), ("a", 4)}
    assert calls.count(("a", 4)) == 1 + 2 and calls.count(("a", 1)) == 1 + 2 * 4


def test_gpu_algorithm_metadata_without_a_gpu():
    """The GPU registry's pure parts (no CuPy needed): without the cuDNN frontend only
    im2col is offered, and its workspace follows the limit (chunks of whole samples while they
    fit, else output-depth planes)."""
    from disttensor.ops.local import gpu
    if gpu.cudnn_available():
        pytest.skip("the cuDNN frontend is installed here")
    args = ("forward", (8, 16, 12, 12, 12), (32, 16, 3, 3, 3), (1,) * 3, (1,) * 3, (1,) * 3,
            (1,) * 3, 1, np.float32)
    small = gpu.conv_algorithms(1)
    assert set(small) == {"im2col"}
    per_sample = 16 * 27 * 12 ** 3 + 32 * 12 ** 3  # column + output elements of one sample
    big = gpu.conv_algorithms(10**12)["im2col"].workspace_bytes(*args)
    assert big == 8 * per_sample * 4
    one = gpu.conv_algorithms(16 * 27 * 12 ** 3 * 4)["im2col"].workspace_bytes(*args)
    assert one == per_sample * 4
    plane = small["im2col"].workspace_bytes(*args)
    assert plane == (16 * 27 + 32) * 12 * 12 * 4
    for b in (1, 3, 8):
        chunks = gpu.im2col_conv._chunks(b, 12, 16 * 27 * 144, 4, 2 * 16 * 27 * 1728 * 4)
        assert [c[1] for c in chunks] == [min(2, b - n0) for n0 in range(0, b, 2)]


# -- GPU (skipped without CuPy and a CUDA device) --------------------------------------------
def _cupy_or_skip():
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError
    except Exception:  # noqa: BLE001
        pytest.skip("needs a CUDA GPU")
    return cp


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gpu_algorithms_and_divisions_match_reference(case):
    """Every GPU algorithm (each cuDNN plan rank that builds, im2col) on every pass, and mixed
    divisions, against the float64 reference (float64 operands)."""
    cp = _cupy_or_skip()
    from disttensor.ops.local import gpu
    x, w, dy, geo = _data(case)
    y_ref, dx_ref, dw_ref = _reference(x, w, dy, geo)
    xg, wg, dyg = cp.asarray(x), cp.asarray(w), cp.asarray(dy)
    algos = gpu.conv_algorithms(64 * 2**20)
    usable = []
    for name, alg in algos.items():
        ok = True
        for pass_ in mb.PASSES:
            args = mb.ConvProblem.make(pass_, x.shape, w.shape, *geo, x.dtype).args()
            ok = ok and alg.supports(*args)
        if ok:
            usable.append(name)
    assert "im2col" in usable
    for parts in [[(n, x.shape[0])] for n in usable] + _divisions(x.shape[0], usable)[1:]:
        plan = mb.Plan(tuple(parts), 0.0, 0)
        np.testing.assert_allclose(cp.asnumpy(mb.run_plan(plan, algos, "forward", xg, wg, None,
                                                          geo, xp=cp)), y_ref, rtol=1e-9,
                                   atol=1e-9, err_msg=str(parts))
        np.testing.assert_allclose(cp.asnumpy(mb.run_plan(plan, algos, "backward_data", dyg, wg,
                                                          x.shape[2:], geo, xp=cp)), dx_ref,
                                   rtol=1e-9, atol=1e-9, err_msg=str(parts))
        np.testing.assert_allclose(cp.asnumpy(mb.run_plan(plan, algos, "backward_filter", xg,
                                                          dyg, w.shape[2:], geo, xp=cp)), dw_ref,
                                   rtol=1e-9, atol=1e-9, err_msg=str(parts))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["heuristic", "benchmark"])
def test_gpu_planned_entry_points(mode, monkeypatch, tmp_path):
    """gpu.conv_* with backend=None go through the planner (a plan is recorded) and equal the
    reference; a tight limit is respected (or raised with a note when nothing fits)."""
    cp = _cupy_or_skip()
    from disttensor.ops.local import gpu
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE", mode)
    monkeypatch.setenv("DISTTENSOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE_BUDGET_S", "0.5")
    monkeypatch.delenv("DISTTENSOR_CONV_BACKEND", raising=False)
    x, w, dy, geo = _data(CASES[1], np.float32)
    y_ref, dx_ref, dw_ref = _reference(x, w, dy, geo)
    for limit_mb in ("64", "0.01"):
        monkeypatch.setenv("DISTTENSOR_CONV_WORKSPACE_MB", limit_mb)
        mb.clear_plans()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            y = gpu.conv_forward(cp.asarray(x), cp.asarray(w), *geo)
            plan = mb.last_plan()
            dx = gpu.conv_backward_data(cp.asarray(dy), cp.asarray(w), x.shape[2:], *geo)
            dw = gpu.conv_backward_filter(cp.asarray(x), cp.asarray(dy), w.shape[2:], *geo)
        assert plan is not None and sum(b for _, b in plan.micro_batches) == x.shape[0]
        assert plan.workspace <= mb.workspace_limit() or "raised" in plan.note
        assert gpu.last_conv_backend() in ("cudnn", "im2col")
        for got, ref_ in ((y, y_ref), (dx, dx_ref), (dw, dw_ref)):
            assert got.dtype == np.float32
            scale = max(1.0, float(np.abs(ref_).max()))  # TF32 engines: 1e-2 of the scale
            assert float(np.abs(cp.asnumpy(got) - ref_).max()) <= 1e-2 * scale
    mb.clear_plans()


def test_heuristic_mode_models_the_direct_kernels():
    """The cost model (heuristic mode, no timing) sees the register-blocked kernels: they win
    the wide 3x3x3 layers, im2col keeps the backward data of a one-channel input layer (its
    lanes would hold one channel of 16), and 1x1x1 heads go to the BLAS product."""
    pytest.importorskip("disttensor.ops.local.cpu.conv_direct")
    algos = mb.cpu_algorithms(64 << 20)

    def best(pass_, xs, ws, pad):
        pr = mb.ConvProblem.make(pass_, xs, ws, (1, 1, 1), (1, 1, 1), (pad,) * 3, (pad,) * 3,
                                 1, np.float32)
        t = mb.model_times(pr, algos, mb.candidates(pr, algos, [xs[0]]))
        return min(t, key=t.get)[0]

    for pass_ in mb.PASSES:
        assert best(pass_, (2, 32, 32, 32, 32), (64, 32, 3, 3, 3), 1).startswith(
            ("direct", "wbcast"))
    assert best("backward_data", (2, 1, 32, 32, 32), (32, 1, 3, 3, 3), 1).startswith("im2col")
    assert best("forward", (2, 64, 16, 16, 16), (3, 64, 1, 1, 1), 0) == "gemm1x1"
