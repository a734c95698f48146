"""Planning one layer-pass, a whole network's budget, and running a plan (per rank, no MPI).

* :func:`plan_problem`: the plan for one :class:`.problem.ConvProblem` under a workspace limit
  (times from :mod:`.timing`, division from :mod:`.division`; benchmark mode times only the
  candidates the cost model puts within :func:`~.settings.model_prefilter` of the best,
  :func:`prefilter`); when no algorithm fits, the
  limit is raised to the smallest workspace, with a note and a warning once per problem;
* :func:`pareto_set`: a layer-pass's Pareto-optimal (time, workspace) configurations;
* :func:`run_plan`: run a plan's micro-batches (outputs written into one array, filter
  gradients summed), on NumPy or CuPy arrays; :func:`run_pass` runs one algorithm on a slice
  of the samples (also what the entry points' timing runners do);
* the plan store: :func:`get_plan` returns a plan from memory, from the disk cache
  (:mod:`.plan_cache`, benchmark mode), the plan of a similar tuned problem (:mod:`.sharing`:
  the reuse rule, and one timing per problem family among processes sharing the cache) or
  planned now; :func:`store_plan` stores a plan tuned on the real calls unless a peer sharing
  the cache stored one first (then that one is kept: one plan per family among the ranks);
  :func:`set_limit_override` / :func:`limit_for` hold per-problem workspace limits, which
  :func:`plan_network` installs for a whole network (WD or WR); :func:`last_plan` is this
  thread's latest plan.

The store is process-wide (plans, limits; guarded by a lock) and the latest plan per thread.
"""
from __future__ import annotations

import threading

import numpy as np

from .division import (candidate_sizes, choose_division, divide_workspace, optimal_division,
                       pareto_front)
from .plan_cache import PlanCache
from .problem import Config, ConvProblem, Plan
from .settings import (model_prefilter, policy, relative_workspace_limit, similar_factor,
                       tune_mode, undivided_margin, workspace_limit, workspace_rule)
from .sharing import family_lock, nearest_similar
from .timing import candidates, measure_times, model_times, warn_once

__all__ = ["plan_problem", "fitting_candidates", "settle", "store_plan", "prefilter", "pareto_set", "run_pass", "run_plan", "get_plan",
           "plan_network",
           "set_limit_override", "clear_limit_overrides", "limit_for", "clear_plans",
           "generation",
           "last_plan", "set_last_plan"]


def plan_problem(problem: ConvProblem, algos: dict, limit: int, policy_: str, mode: str,
                 runner=None, sync=None) -> Plan:
    """The plan for ``problem`` under ``limit`` bytes (see the module): times measured with
    ``runner(algorithm, b)`` (which runs the algorithm object on ``b`` of the samples; mode
    ``benchmark``) or modelled (``heuristic``).  With one candidate only nothing is timed."""
    fit, note = fitting_candidates(problem, algos, limit, policy_)
    if mode == "benchmark" and runner is not None and len(fit) > 1:
        times = measure_times(problem, prefilter(problem, algos, fit, model_prefilter()),
                              algos, runner, sync)
    else:
        times = model_times(problem, algos, fit)
        if not times:  # no cost model: equal times, so the fewest micro-batches win
            times = {k: 1.0 for k in fit}
    return settle(problem, fit, times, mode, note)


def fitting_candidates(problem: ConvProblem, algos: dict, limit: int, policy_: str):
    """``({(name, b): workspace}, note)``: the candidates of ``problem`` whose workspace fits
    ``limit``; when none of the smallest micro-batch size fits, the limit is raised to the
    smallest workspace (``note`` says so; a warning once per problem)."""
    sizes = candidate_sizes(problem.batch, policy_)
    cands = candidates(problem, algos, sizes)
    if not cands:
        raise RuntimeError(f"no convolution algorithm supports {problem}")
    smallest = min(sizes)
    note = ""
    fit = {k: ws for k, ws in cands.items() if ws <= limit}
    if not any(b == smallest for _, b in fit):
        need = min(ws for (_, b), ws in cands.items() if b == smallest)
        name = min((ws, n) for (n, b), ws in cands.items() if b == smallest)[1]
        note = (f"no convolution algorithm fits the workspace limit of {limit} B for "
                f"{problem.pass_} {problem.x_shape} x {problem.w_shape}; the limit is raised to "
                f"{need} B, the smallest workspace ({name!r})")
        warn_once(("limit", problem, limit), note)
        limit = need
        fit = {k: ws for k, ws in cands.items() if ws <= limit}
    return fit, note


def settle(problem: ConvProblem, fit: dict, times: dict, mode: str, note: str = "") -> Plan:
    """The plan from ``times`` (``{(name, b): seconds per call}``) of the candidates ``fit``
    (``{(name, b): workspace}``): the best division (:func:`.division.choose_division`, with
    the undivided margin in benchmark mode); smallest-size candidates without a time count
    as 1 s when none has one."""
    smallest = min(b for _, b in fit)
    times = dict(times)
    if not any(b == smallest for _, b in times):  # every small candidate failed: model them
        times.update({k: 1.0 for k in fit if k[1] == smallest and k not in times})
    found = choose_division(problem.batch, times, undivided_margin() if mode == "benchmark"
                            else 0.0)
    if found is None:
        raise RuntimeError(f"no division of {problem.batch} samples for {problem}")
    total, parts = found
    return Plan(tuple(parts), total, max(fit[p] for p in parts), note)


def prefilter(problem: ConvProblem, algos: dict, cands: dict, factor: float) -> dict:
    """The candidates worth timing: those whose modelled time per sample is within ``factor``
    of the best modelled one, plus the best modelled candidate of every micro-batch size (so
    every division stays possible); candidates without a cost model are always kept.
    ``factor <= 0`` keeps everything."""
    if factor <= 0 or len(cands) <= 1:
        return cands
    model = model_times(problem, algos, cands)
    if not model:
        return cands
    per = {k: t / k[1] for k, t in model.items()}
    best = min(per.values())
    keep = {k for k, t in per.items() if t <= factor * best}
    for b in {b for _, b in cands}:
        at_b = [k for k in per if k[1] == b]
        if at_b:
            keep.add(min(at_b, key=lambda k: (per[k], k)))
    return {k: ws for k, ws in cands.items() if k in keep or k not in model}


def pareto_set(problem: ConvProblem, algos: dict, max_bytes: int, policy_: str, mode: str,
               runner=None, sync=None) -> list:
    """The Pareto-optimal :class:`Config` s (time, workspace, plan) of ``problem`` up to
    ``max_bytes``: the optimal division under each distinct candidate workspace as limit, one
    timing table for all."""
    sizes = candidate_sizes(problem.batch, policy_)
    cands = {k: ws for k, ws in candidates(problem, algos, sizes).items() if ws <= max_bytes}
    if not cands:
        return []
    if mode == "benchmark" and runner is not None and len(cands) > 1:
        times = measure_times(problem, cands, algos, runner, sync)
    else:
        times = model_times(problem, algos, cands) or {k: 1.0 for k in cands}
    ws_of = {k: cands[k] for k in times}
    configs = []
    for lim in sorted(set(ws_of.values())):
        found = optimal_division(problem.batch, times, ws_of, lim)
        if found is not None:
            total, parts = found
            ws = max(ws_of[p] for p in parts)
            configs.append(Config(total, ws, Plan(tuple(parts), total, ws)))
    return pareto_front(configs)


# -- running a plan --------------------------------------------------------------------------
def run_pass(alg, pass_: str, a, b, extra, geo, samples=slice(None)):
    """Algorithm ``alg`` on the ``samples`` (a slice) of one pass's operands (``a``, ``b``,
    ``extra``, ``geo`` as in :func:`run_plan`)."""
    if pass_ == "forward":
        return alg.forward(a[samples], b, *geo)
    if pass_ == "backward_data":
        return alg.backward_data(a[samples], b, extra, *geo)
    return alg.backward_filter(a[samples], b[samples], extra, *geo)


def run_plan(plan: Plan, algos: dict, pass_: str, a, b, extra, geo, xp=np):
    """Run ``plan``'s micro-batches.  ``pass_`` forward: ``a = x``, ``b = w``, ``extra``
    unused; backward_data: ``a = dy``, ``b = w``, ``extra = in_spatial``; backward_filter:
    ``a = x``, ``b = dy``, ``extra = kernel``.  ``geo = (stride, dilation, pad_lo, pad_hi,
    groups)``.  Outputs of micro-batches are written into one array (forward, backward data) or
    summed (filter gradient)."""
    def call(name, lo, hi):
        return run_pass(algos[name], pass_, a, b, extra, geo, slice(lo, hi))

    parts = plan.micro_batches
    if len(parts) == 1:
        return call(parts[0][0], 0, a.shape[0])
    out, n0 = None, 0
    for name, size in parts:
        part = call(name, n0, n0 + size)
        if pass_ == "backward_filter":
            if out is None:
                out = part
            else:
                out += part
        else:
            if out is None:
                out = xp.empty((a.shape[0],) + tuple(part.shape[1:]), dtype=part.dtype)
            out[n0:n0 + size] = part
        n0 += size
    return out


# -- the plan store --------------------------------------------------------------------------
_state = threading.local()


_plans: dict = {}


_plans_lock = threading.Lock()


_limit_overrides: dict = {}


_disk = PlanCache()


_generation = [0]  # bumped whenever a plan or a limit override may change


def generation() -> int:
    """A counter that changes whenever the plans held in memory or the per-problem limits
    change (:func:`clear_plans`, :func:`set_limit_override`, :func:`clear_limit_overrides`):
    what a caller's memo of :func:`get_plan`'s answers is valid for."""
    return _generation[0]


def set_limit_override(problem: ConvProblem, limit_bytes: int | None) -> None:
    """Use ``limit_bytes`` instead of the global limit for ``problem`` (None removes it)."""
    if limit_bytes is None:
        _limit_overrides.pop(problem, None)
    else:
        _limit_overrides[problem] = int(limit_bytes)
    _generation[0] += 1


def clear_limit_overrides() -> None:
    _limit_overrides.clear()
    _generation[0] += 1


def limit_for(problem: ConvProblem, relative: bool = False) -> int:
    """The workspace limit of ``problem``: its override, else the configured limit; with
    ``relative`` (the CPU entry points) the configured rule
    (:func:`~.settings.relative_workspace_limit`: an explicit ``DISTTENSOR_CONV_WORKSPACE_MB``,
    else the larger of 64 MiB and ``DISTTENSOR_CONV_WORKSPACE_RATIO`` times the problem's
    operand bytes)."""
    over = _limit_overrides.get(problem)
    if over is not None:
        return over
    if not relative:
        return workspace_limit()
    return relative_workspace_limit(problem.operand_bytes(), *workspace_rule())


def clear_plans() -> None:
    """Forget the plans held in memory (the disk cache is re-read on the next use)."""
    with _plans_lock:
        _plans.clear()
    _disk.clear_memory()
    _generation[0] += 1


def last_plan():
    """The :class:`Plan` of this thread's latest planned convolution (None before any)."""
    return getattr(_state, "plan", None)


def set_last_plan(plan: Plan) -> None:
    """Record ``plan`` as this thread's latest planned convolution (:func:`last_plan`)."""
    _state.plan = plan


def _keys(problem: ConvProblem, algos: dict, device_fp: dict, limit: int, relative: bool):
    """``(memory key, disk-cache fields)`` of a plan."""
    pol, mode = policy(), tune_mode()
    names = tuple(sorted(algos))
    mkey = (problem, limit, pol, mode, names, device_fp.get("device"), undivided_margin())
    fields = dict(fingerprint=device_fp, problem=problem.fields(), limit=limit, policy=pol,
                  mode=mode, algorithms=list(names), margin=undivided_margin())
    if relative and problem not in _limit_overrides:
        fields["limit_rule"] = list(workspace_rule())
    return mkey, fields


def get_plan(problem: ConvProblem, algos: dict, device_fp: dict, runner=None, sync=None,
             limit: int | None = None, relative: bool = False, defer: bool = False):
    """The plan for ``problem`` under the configured (or overridden) limit, policy and mode:
    from memory, from the disk cache (benchmark mode), or planned now (and stored).
    ``relative``: the limit follows the relative rule (:func:`limit_for`); the rule, not its
    value, then decides which tuned problems are similar (:mod:`.sharing`).  ``defer``
    (benchmark mode): return None instead of timing, for a caller that tunes on the real calls
    and stores the plan with :func:`store_plan`."""
    mode = tune_mode()
    if limit is None:
        limit = limit_for(problem, relative)
    mkey, fields = _keys(problem, algos, device_fp, limit, relative)
    plan = _plans.get(mkey)
    if plan is not None:
        return plan
    if mode == "benchmark":
        plan = _stored_plan(problem, fields, algos, limit)
        if plan is None:
            if defer:
                return None
            # one timing per problem family among the processes sharing the cache
            with family_lock(_disk.path.parent, fields):
                # a peer may have timed this family since this process read the cache (or
                # while it waited for the lock): its plan serves, and the ranks agree
                plan = _stored_plan(problem, fields, algos, limit, reread=True)
                if plan is None:
                    plan = plan_problem(problem, algos, limit, policy(), mode, runner, sync)
                    _disk.put(fields, plan.to_json())
    else:
        plan = plan_problem(problem, algos, limit, policy(), mode, runner, sync)
    with _plans_lock:
        _plans[mkey] = plan
    return plan


def store_plan(problem: ConvProblem, algos: dict, device_fp: dict, plan: Plan, limit: int,
               relative: bool = False) -> Plan:
    """Keep ``plan`` (timed by the caller) in memory and in the disk cache, under the keys
    :func:`get_plan` looks up, unless a process sharing the plan cache stored a plan for
    ``problem`` or a similar one (:mod:`.sharing`) while this one was tuning: that plan is
    then kept instead (and ``plan`` not written), so the ranks of one job that tune the same
    layer settle on one plan, the first stored (benchmark mode; the check re-reads the disk
    cache under the problem family's lock).  Returns the plan kept."""
    mkey, fields = _keys(problem, algos, device_fp, limit, relative)
    if tune_mode() == "benchmark":
        with family_lock(_disk.path.parent, fields):
            peer = _stored_plan(problem, fields, algos, limit, reread=True)
            if peer is None:
                _disk.put(fields, plan.to_json())
            else:
                plan = peer
    with _plans_lock:
        _plans[mkey] = plan
    return plan


def _valid(stored, problem: ConvProblem, algos: dict, limit: int | None = None) -> Plan | None:
    """``stored`` (a plan's JSON) as a :class:`Plan` for ``problem`` if its micro-batches sum
    to the batch and name known algorithms; with ``limit``: only if every micro-batch is a
    candidate of ``problem`` whose workspace fits (the workspace is then recomputed)."""
    try:
        plan = Plan.from_json(stored)
    except (KeyError, TypeError, ValueError):
        return None
    if (sum(b for _, b in plan.micro_batches) != problem.batch
            or any(a not in algos for a, _ in plan.micro_batches)):
        return None
    if limit is None:
        return plan
    sizes = sorted({b for _, b in plan.micro_batches})
    cands = candidates(problem, algos, sizes)
    if any(cands.get(p, limit + 1) > limit for p in plan.micro_batches):
        return None
    return Plan(plan.micro_batches, plan.seconds, max(cands[p] for p in plan.micro_batches),
                "reused from a similar tuned shape")


def _stored_plan(problem: ConvProblem, fields: dict, algos: dict, limit: int,
                 reread: bool = False) -> Plan | None:
    """The disk cache's plan for ``fields``, else the valid plan of the nearest similar tuned
    problem (:func:`.sharing.nearest_similar`), else None."""
    if reread:
        _disk.clear_memory()
    stored = _disk.get(fields)
    plan = None if stored is None else _valid(stored, problem, algos)
    if plan is None:
        near = nearest_similar(fields, _disk.entries(), similar_factor())
        if near is not None:
            plan = _valid(near, problem, algos, limit)
    return plan


def plan_network(layers, total_bytes: int, strategy: str = "WD", policy_: str | None = None,
                 mode: str | None = None, device: str = "cpu") -> dict:
    """Plan a network's layer-passes under one workspace budget and install the per-problem
    limits the ops will use.  ``layers``: ``[(ConvProblem, algos, runner_or_None), ...]``
    (``algos`` as :func:`cpu_algorithms`).  ``strategy``: ``"WR"`` (each layer-pass may use the
    whole budget; the workspace is reused between layers) or ``"WD"`` (the sum of the
    layer-passes' workspaces stays within the budget: :func:`divide_workspace` over
    :func:`pareto_set`).  Returns ``{problem: Plan}``."""
    pol = policy_ or policy()
    mode = mode or tune_mode()
    if mode == "off":
        mode = "heuristic"
    out = {}
    if strategy == "WR":
        for prob, algos, runner in layers:
            out[prob] = plan_problem(prob, algos, total_bytes, pol, mode, runner)
            set_limit_override(prob, total_bytes)
        return out
    if strategy != "WD":
        raise ValueError(f"strategy must be 'WR' or 'WD', got {strategy!r}")
    sets = {prob: pareto_set(prob, algos, total_bytes, pol, mode, runner)
            for prob, algos, runner in layers}
    chosen = divide_workspace(sets, total_bytes)
    for prob, cfg in chosen.items():
        set_limit_override(prob, cfg.workspace)
        out[prob] = cfg.plan
    return out
