"""The CPU convolutions behind ``kernels_for(numpy_array).conv_*``: :mod:`..cpu.conv_im2col`'s
contracts, through the micro-batch planner (per rank, no MPI).

Each entry point checks its operands with :mod:`..cpu.conv_operands` (so malformed input
raises the contract's errors whatever the mode), leaves empty operands and
``DISTTENSOR_CONV_TUNE=off`` to the tiled im2col kernel, and otherwise gets the plan of its
:class:`.problem.ConvProblem` under the relative workspace limit
(:func:`.planner.limit_for`: unless ``DISTTENSOR_CONV_WORKSPACE_MB`` is set, up to
``DISTTENSOR_CONV_WORKSPACE_RATIO`` = 0.5 of the pass's operand bytes, at least 64 MiB, so the
direct kernels run at 128^3) (timed on the call's own data in benchmark mode, the samples
rotating between timing runs; a problem of at least ``32^3`` cells per sample is timed on its
half-extent proxy, 1/8 of the work: :func:`_proxy`) and runs it.
The choice is made per process: ranks sharing the plan-cache directory settle on the plan
the first of them stored (:func:`.planner.store_plan`); ranks with separate caches may run
different algorithms, whose results agree to float rounding.
"""
from __future__ import annotations

import math

import numba
import numpy as np

from ....core.environ import snapshot
from ..cpu import conv_im2col
from ..cpu.conv_operands import conv_out_shape, data_operands, filter_operands, forward_operands
from .cpu_algorithms import cpu_algorithms
from .plan_cache import fingerprint
from .online import OnlineTuner, online_order, uniform_plan
from .planner import (fitting_candidates, generation, get_plan, limit_for, run_pass, run_plan,
                      set_last_plan, settle, store_plan)
from .problem import ConvProblem
from .settings import model_prefilter, online_tuning, policy, similar_factor, tune_mode
from .timing import rotating_slices, tuning_clock, warn_once

__all__ = ["conv_forward", "conv_backward_data", "conv_backward_filter"]


#: spatial volume per sample from which benchmark mode times on the half-extent proxy
PROXY_MIN_VOLUME = 32 ** 3
#: work (floating-point operations of the whole batch) from which benchmark mode tunes a
#: problem on its real calls (:mod:`.online`): single calls of 20 ms or more time reliably
ONLINE_MIN_FLOPS = 2e8


def _proxy(pass_, a, b, extra, geo, x_shape, w_shape):
    """The operands ``(a, b, extra)`` of a large problem's half-extent proxy: every spatial
    input extent ``ceil(n / 2)``, cropped from the call's own data (contiguous copies); None
    when the problem is small, reuse is off, or a halved extent is too short for the kernel.
    """
    spatial = tuple(x_shape[2:])
    if math.prod(spatial) < PROXY_MIN_VOLUME or similar_factor() < 2:
        return None
    half = tuple(-(-n // 2) for n in spatial)
    try:
        out = conv_out_shape(half, w_shape[2:], *geo[:4])
    except ValueError:
        return None
    if min(out) < 1:
        return None
    box = lambda ext: (slice(None), slice(None)) + tuple(slice(0, e) for e in ext)  # noqa: E731
    if pass_ == "forward":
        return np.ascontiguousarray(a[box(half)]), b, None
    if pass_ == "backward_data":
        return np.ascontiguousarray(a[box(out)]), b, half
    return np.ascontiguousarray(a[box(half)]), np.ascontiguousarray(b[box(out)]), extra


_SETTINGS = ("DISTTENSOR_CONV_TUNE", "DISTTENSOR_CONV_WORKSPACE_MB",
             "DISTTENSOR_CONV_WORKSPACE_RATIO", "DISTTENSOR_CONV_POLICY",
             "DISTTENSOR_CONV_TUNE_MARGIN", "DISTTENSOR_CONV_TUNE_SIMILAR",
             "DISTTENSOR_CONV_TUNE_PREFILTER", "DISTTENSOR_CONV_TUNE_BUDGET_S",
             "DISTTENSOR_CONV_TUNE_REPS", "DISTTENSOR_CONV_TUNE_ONLINE",
             "DISTTENSOR_CONV_TUNE_CLOCK")
_memo: dict = {}   # (call, settings) -> (plan, algorithms): get_plan's answers, per call shape
_MEMO_MAX = 512


def _planned(pass_, a, b, extra, geo, x_shape, w_shape, dtype):
    """Plan the pass (:func:`.planner.run_plan`'s ``a``, ``b``, ``extra``, ``geo``) and run
    the plan.  Benchmark mode times the candidates (those whose workspace fits at the full
    size) on these operands, the samples rotating; a problem of at least
    :data:`ONLINE_MIN_FLOPS` operations is tuned on its real calls (:mod:`.online`,
    :func:`_online_call`; with ``DISTTENSOR_CONV_TUNE_ONLINE=off`` timed on its half-extent
    proxy instead, :func:`_proxy`: 1/8 of the work); the plan is stored under the full
    problem's key either way.

    A training step repeats the same few calls: their plans are memoised per call shape and
    settings (the environment variables the planner reads, Numba's thread count and the
    planner's :func:`~.planner.generation`), which skips building the problem, its limit, the
    algorithm set and the fingerprint (some 25 microseconds a call)."""
    key = (pass_, x_shape, w_shape, geo, dtype, snapshot(_SETTINGS), numba.get_num_threads(),
           generation())
    hit = _memo.get(key)
    if hit is None:
        problem = ConvProblem.make(pass_, x_shape, w_shape, *geo, dtype)
        limit = limit_for(problem, relative=True)
        algos = cpu_algorithms(limit)
        if (problem.flops() >= ONLINE_MIN_FLOPS and tune_mode() == "benchmark"
                and online_tuning()):
            plan = get_plan(problem, algos, fingerprint("cpu"), limit=limit, relative=True,
                            defer=True)
            if plan is None:
                return _online_call(key, problem, algos, limit, pass_, a, b, extra, geo)
            _tuners.pop(key, None)   # a plan a peer stored (or a similar one) ended tuning
            if len(_memo) >= _MEMO_MAX:
                _memo.clear()
            _memo[key] = (plan, algos)
            set_last_plan(plan)
            return run_plan(plan, algos, pass_, a, b, extra, geo)
        state: dict = {}

        def runner(alg, n):  # only called when timing: the proxy is cut then, once
            if not state:
                state["ops"] = _proxy(pass_, a, b, extra, geo, x_shape, w_shape) or \
                    (a, b, extra)
                state["take"] = rotating_slices(a.shape[0])
            ta, tb, te = state["ops"]
            return run_pass(alg, pass_, ta, tb, te, geo, state["take"](n))
        plan = get_plan(problem, algos, fingerprint("cpu"), runner, limit=limit, relative=True)
        if len(_memo) >= _MEMO_MAX:
            _memo.clear()
        hit = _memo[key] = (plan, algos)
    plan, algos = hit
    set_last_plan(plan)
    return run_plan(plan, algos, pass_, a, b, extra, geo)


_tuners: dict = {}   # memo key -> OnlineTuner of a problem being tuned on its calls


def _online_call(key, problem, algos, limit, pass_, a, b, extra, geo):
    """Run this call with the problem's next online candidate (:mod:`.online`), timed; once
    every candidate ran, settle and store the plan (memoised under ``key``)."""
    tuner = _tuners.get(key)
    if tuner is None:
        fit, note = fitting_candidates(problem, algos, limit, policy())
        tuner = OnlineTuner(problem.batch, online_order(problem, algos, fit, model_prefilter()))
        tuner.fit, tuner.note = fit, note
        if len(_tuners) >= _MEMO_MAX:
            _tuners.clear()
        _tuners[key] = tuner
    out = None
    while True:
        with tuner.lock:
            cand = tuner.next()
        if cand is None:
            raise RuntimeError(f"every convolution algorithm failed for {problem}")
        plan = uniform_plan(problem.batch, cand, tuner.fit[cand])
        set_last_plan(plan)
        clock = tuning_clock()
        t0 = clock()
        try:
            out = run_plan(plan, algos, pass_, a, b, extra, geo)
        except Exception as err:  # noqa: BLE001 - a failing candidate is not a candidate
            warn_once(("run", cand[0], type(err).__name__),
                      f"conv algorithm {cand[0]!r} failed while being tuned "
                      f"({type(err).__name__}: {err}); it is skipped")
            with tuner.lock:
                tuner.fail(cand)
                if tuner.next() is None and not tuner.times:
                    raise
            if tuner.next() is None:
                break
            continue
        with tuner.lock:
            tuner.record(cand, clock() - t0)
        break
    if tuner.done and tuner.times:
        final = settle(problem, tuner.fit, tuner.times, "benchmark", tuner.note)
        # a peer sharing the plan cache that settled first wins: the ranks run one plan
        final = store_plan(problem, algos, fingerprint("cpu"), final, limit, relative=True)
        _tuners.pop(key, None)
        if len(_memo) >= _MEMO_MAX:
            _memo.clear()
        _memo[key] = (final, algos)
        if out is None:  # the last candidate failed: run the settled plan
            set_last_plan(final)
            out = run_plan(final, algos, pass_, a, b, extra, geo)
    return out


def conv_forward(x, w, stride, dilation, pad_lo, pad_hi, groups=1):
    """:func:`..cpu.conv_im2col.conv_forward`'s contract, through the micro-batch planner."""
    if tune_mode() == "off":
        return conv_im2col.conv_forward(x, w, stride, dilation, pad_lo, pad_hi, groups)
    x, w, dtype, geo, _ = forward_operands(x, w, stride, dilation, pad_lo, pad_hi, groups,
                                           strided_x=True)   # (each algorithm's own operands)
    geo = geo + (groups,)
    if x.size == 0 or w.size == 0:
        return conv_im2col.conv_forward(x, w, *geo)
    return _planned("forward", x, w, None, geo, x.shape, w.shape, dtype)


def conv_backward_data(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups=1):
    """:func:`..cpu.conv_im2col.conv_backward_data`'s contract, through the micro-batch
    planner."""
    if tune_mode() == "off":
        return conv_im2col.conv_backward_data(dy, w, in_spatial, stride, dilation, pad_lo,
                                              pad_hi, groups)
    dy, w, dtype, in_spatial, geo = data_operands(dy, w, in_spatial, stride, dilation, pad_lo,
                                                  pad_hi, groups)
    geo = geo + (groups,)
    if dy.size == 0 or w.size == 0 or min(in_spatial) < 1:
        return conv_im2col.conv_backward_data(dy, w, in_spatial, *geo)
    x_shape = (dy.shape[0], w.shape[1] * groups) + in_spatial
    return _planned("backward_data", dy, w, in_spatial, geo, x_shape, w.shape, dtype)


def conv_backward_filter(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups=1):
    """:func:`..cpu.conv_im2col.conv_backward_filter`'s contract, through the micro-batch
    planner (the micro-batches' filter gradients are summed)."""
    if tune_mode() == "off":
        return conv_im2col.conv_backward_filter(x, dy, kernel, stride, dilation, pad_lo,
                                                pad_hi, groups)
    x, dy, dtype, kernel, geo, _ = filter_operands(x, dy, kernel, stride, dilation, pad_lo,
                                                   pad_hi, groups, strided_x=True)
    geo = geo + (groups,)
    if x.size == 0 or dy.size == 0:
        return conv_im2col.conv_backward_filter(x, dy, kernel, *geo)
    w_shape = (dy.shape[1], x.shape[1] // groups) + kernel
    return _planned("backward_filter", x, dy, kernel, geo, x.shape, w_shape, dtype)
