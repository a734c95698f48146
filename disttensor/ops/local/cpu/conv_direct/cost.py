"""The direct kernels' cost model and shape heuristic (the micro-batch planner's heuristic
mode; pure functions, no MPI).

:func:`modelled_seconds` is what each variant's ``estimate_seconds`` returns, in the units of
:mod:`..conv_cost`: padded lanes x padded micro-tile rows x reduction (less the depth taps the
micro-tiles skip, :func:`.geometry.pass_tap_limits`) at the register-blocked rate, plus moving
the operands twice (padding and packing).  :func:`pick` is the shape rule
that chooses a variant without timing (and breaks the model's ties).
"""
from __future__ import annotations

import numpy as np

from ..conv_cost import CALL_S, GEMM_FLOPS, MEM_BW
from ..conv_operands import conv_out_shape
from .geometry import (gemm_extents, kept_fraction, pass_tap_limits, round_up, shapes_supported,
                       unpadded_1x1)

__all__ = ["modelled_seconds", "pick"]

# Units are those of :mod:`..conv_cost` (``GEMM_FLOPS`` for a BLAS GEMM, ``MEM_BW`` for
# packing): only ratios between algorithms matter.  Measured on the 2-core Zen 5 machine, the
# register-blocked kernels run at ~2x NumPy's (AVX2-pinned) BLAS GEMM when every lane is used;
# a lane or micro-tile row that holds no data costs the same as one that does.
_DIRECT_OVER_GEMM = 2.0


def modelled_seconds(algo, problem) -> float:
    """Modelled seconds of ``problem`` (a :class:`disttensor.ops.local.microbatch.ConvProblem`)
    by ``algo`` (a :class:`.direct.Direct`)."""
    item = np.dtype(problem.dtype).itemsize
    c = algo.block_width(problem.dtype)
    lanes, rows, red, zero_ins = gemm_extents(
        problem.pass_, problem.x_shape, problem.w_shape, problem.stride, problem.dilation,
        problem.pad_lo, problem.pad_hi, problem.groups, algo.weights_on_rows)
    padded_macs = round_up(max(lanes, 1), c) * round_up(max(rows, 1), algo.rows) * red * zero_ins
    if not algo.weights_on_rows and problem.pass_ != "backward_filter":
        # the depth taps each micro-tile skips (they read only zero padding)
        padded_macs *= kept_fraction(pass_tap_limits(
            problem.pass_, problem.x_shape, problem.w_shape, problem.stride, problem.dilation,
            problem.pad_lo, problem.pad_hi, algo.rows), int(np.prod(problem.w_shape[2:])))
    compute = 2.0 * padded_macs * problem.groups / (_DIRECT_OVER_GEMM * GEMM_FLOPS)
    moved = (int(np.prod(problem.x_shape)) + int(np.prod(problem.w_shape))) * item
    seconds = CALL_S + compute + 2.0 * moved / MEM_BW
    # the model cannot tell the register-blocked variants apart where all lanes are full;
    # :func:`pick`'s measured shape rules break such ties
    if pick(*problem.args()) != algo.name:
        seconds *= 1.03
    return seconds


def pick(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups, dtype) -> str:
    """A shape heuristic for the algorithm of one pass (what the measurements on the 2-core
    Zen 5 machine suggest; a planner that times the candidates knows better): ``gemm1x1``
    for unpadded 1x1x1 forward / backward data; ``wbcast*`` where the weights outnumber the
    column matrix (few positions, many channels); else ``direct8x2`` (its micro-kernel runs at
    ~226 GFLOP/s per core on in-cache data against ~210 for ``direct4x4``; in whole layers the
    two are within noise of each other)."""
    if (pass_ != "backward_filter"
            and shapes_supported(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                                 groups, dtype)
            and unpadded_1x1(w_shape[2:], pad_lo, pad_hi)):
        return "gemm1x1"
    kernel = tuple(int(k) for k in w_shape[2:])
    kk = int(np.prod(kernel))
    n_n, cin = int(x_shape[0]), int(x_shape[1])
    cout = int(w_shape[0])
    cg, cog = cin // groups, cout // groups
    out_sp = conv_out_shape(tuple(int(v) for v in x_shape[2:]), kernel, stride, dilation,
                            pad_lo, pad_hi)
    p_n = n_n * int(np.prod(out_sp if pass_ != "backward_data" else x_shape[2:]))
    red = (cog if pass_ == "backward_data" else cg) * kk
    if cout * cg * kk > red * p_n:
        return "wbcast4x4" if p_n >= 64 else "wbcast8x2"
    return "direct8x2"
