"""The units of the CPU convolutions' cost models (the micro-batch planner's heuristic mode).

Each CPU algorithm's ``estimate_seconds`` models its time from these: a BLAS GEMM's rate
(:func:`gemm_seconds`, which falls off for thin matrices), the memory bandwidth of packing
and the fixed cost of a call.  Only ratios between algorithms matter (the planner compares
estimates, it never reports them as times), so the constants are round numbers of the right
proportions for the 2-core development machine.  Pure functions, no MPI.
"""
from __future__ import annotations

__all__ = ["GEMM_FLOPS", "MEM_BW", "CALL_S", "gemm_seconds"]

GEMM_FLOPS = 2.0e10   # a large BLAS GEMM, flop/s
MEM_BW = 5.0e9        # packing and padding, bytes/s
CALL_S = 5.0e-6       # the fixed cost of one kernel call, s


def gemm_seconds(m, k, ncols) -> float:
    """Modelled seconds of an (m x k) @ (k x ncols) GEMM: rate falls off for thin matrices."""
    eff = (ncols / (ncols + 96.0)) * (m / (m + 8.0))
    return CALL_S + 2.0 * m * k * ncols / (GEMM_FLOPS * eff)
