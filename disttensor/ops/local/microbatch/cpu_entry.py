"""The CPU convolutions behind ``kernels_for(numpy_array).conv_*``: :mod:`..cpu.conv_im2col`'s
contracts, through the micro-batch planner (per rank, no MPI).

Each entry point checks its operands with :mod:`..cpu.conv_operands` (so malformed input
raises the contract's errors whatever the mode), leaves empty operands and
``DISTTENSOR_CONV_TUNE=off`` to the tiled im2col kernel, and otherwise gets the plan of its
:class:`.problem.ConvProblem` (timed on the call's own data in benchmark mode, the samples
rotating between timing runs) and runs it.  The choice is rank-local: ranks may run
different algorithms, whose results agree to float rounding.
"""
from __future__ import annotations

import os

import numba

from ..cpu import conv_im2col
from ..cpu.conv_operands import data_operands, filter_operands, forward_operands
from .cpu_algorithms import cpu_algorithms
from .plan_cache import fingerprint
from .planner import generation, get_plan, limit_for, run_pass, run_plan, set_last_plan
from .problem import ConvProblem
from .settings import tune_mode
from .timing import rotating_slices

__all__ = ["conv_forward", "conv_backward_data", "conv_backward_filter"]


_SETTINGS = ("DISTTENSOR_CONV_TUNE", "DISTTENSOR_CONV_WORKSPACE_MB", "DISTTENSOR_CONV_POLICY",
             "DISTTENSOR_CONV_TUNE_MARGIN")
_memo: dict = {}   # (call, settings) -> (plan, algorithms): get_plan's answers, per call shape
_MEMO_MAX = 512


def _planned(pass_, a, b, extra, geo, x_shape, w_shape, dtype):
    """Plan the pass (:func:`.planner.run_plan`'s ``a``, ``b``, ``extra``, ``geo``; benchmark
    mode times the candidates on these operands, the samples rotating) and run the plan.

    A training step repeats the same few calls: their plans are memoised per call shape and
    settings (the environment variables the planner reads, Numba's thread count and the
    planner's :func:`~.planner.generation`), which skips building the problem, its limit, the
    algorithm set and the fingerprint (some 25 microseconds a call)."""
    env = os.environ
    key = (pass_, x_shape, w_shape, geo, dtype, tuple(env.get(v) for v in _SETTINGS),
           numba.get_num_threads(), generation())
    hit = _memo.get(key)
    if hit is None:
        problem = ConvProblem.make(pass_, x_shape, w_shape, *geo, dtype)
        take = rotating_slices(a.shape[0])
        limit = limit_for(problem)
        algos = cpu_algorithms(limit)
        plan = get_plan(problem, algos, fingerprint("cpu"),
                        lambda alg, n: run_pass(alg, pass_, a, b, extra, geo, take(n)),
                        limit=limit)
        if len(_memo) >= _MEMO_MAX:
            _memo.clear()
        hit = _memo[key] = (plan, algos)
    plan, algos = hit
    set_last_plan(plan)
    return run_plan(plan, algos, pass_, a, b, extra, geo)


def conv_forward(x, w, stride, dilation, pad_lo, pad_hi, groups=1):
    """:func:`..cpu.conv_im2col.conv_forward`'s contract, through the micro-batch planner."""
    if tune_mode() == "off":
        return conv_im2col.conv_forward(x, w, stride, dilation, pad_lo, pad_hi, groups)
    x, w, dtype, geo, _ = forward_operands(x, w, stride, dilation, pad_lo, pad_hi, groups)
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
                                                   pad_hi, groups)
    geo = geo + (groups,)
    if x.size == 0 or dy.size == 0:
        return conv_im2col.conv_backward_filter(x, dy, kernel, *geo)
    w_shape = (dy.shape[1], x.shape[1] // groups) + kernel
    return _planned("backward_filter", x, dy, kernel, geo, x.shape, w_shape, dtype)
