"""The planner's settings, read from the environment at each call (no MPI, no state).

* ``DISTTENSOR_CONV_TUNE`` (:func:`tune_mode`): ``benchmark`` (default), ``heuristic`` or
  ``off``;
* ``DISTTENSOR_CONV_WORKSPACE_MB`` (:func:`workspace_limit`): the per-layer workspace limit,
  default 64 MiB; on the CPU, while it is unset, a layer-pass may use more:
  ``DISTTENSOR_CONV_WORKSPACE_RATIO`` (:func:`workspace_ratio`, default 0.5) times the bytes
  of its own operands (:func:`relative_workspace_limit`);
* ``DISTTENSOR_CONV_POLICY`` (:func:`policy`): ``powerOfTwo`` (default), ``all`` or
  ``undivided``;
* ``DISTTENSOR_CONV_TUNE_BUDGET_S`` (:func:`budget_s`, default 2 s per layer-pass),
  ``DISTTENSOR_CONV_TUNE_REPS`` (:func:`reps`, default 2) and
  ``DISTTENSOR_CONV_TUNE_MARGIN`` (:func:`undivided_margin`, default 0.03): how candidates
  are timed and how much a measured division must win by;
* ``DISTTENSOR_CONV_TUNE_SIMILAR`` (:func:`similar_factor`, default 2): a problem whose
  spatial extents are each within this factor of a tuned one's (all else equal) reuses its
  plan instead of being timed (:mod:`.sharing`); ``off`` or ``1`` turns reuse off;
* ``DISTTENSOR_CONV_TUNE_PREFILTER`` (:func:`model_prefilter`, default 2): benchmark mode
  times only the candidates whose modelled time per sample is within this factor of the best
  modelled one (and the best of each micro-batch size); ``off`` times them all;
* ``DISTTENSOR_CONV_TUNE_ONLINE`` (:func:`online_tuning`, default on): on the CPU, a problem
  of at least 2e8 floating-point operations is tuned on its real calls (:mod:`.online`) instead of
  being timed apart on its half-extent proxy;
* ``DISTTENSOR_CONV_TUNE_CLOCK`` (:func:`tune_clock`, default ``auto``): what the CPU tuner
  times candidates by: ``cpu`` (the process's CPU time: what another job taking the core
  cannot inflate), ``wall``, or ``auto`` (CPU time where the kernels run on one thread:
  Numba's thread count is 1 and ``OPENBLAS_NUM_THREADS`` or ``OMP_NUM_THREADS`` is 1;
  otherwise wall time).

Invalid names raise ``ValueError``.
"""
from __future__ import annotations

from ....core.environ import getenv

__all__ = ["PASSES", "POLICIES", "MODES", "UNDIVIDED_MARGIN", "DEFAULT_WORKSPACE_MB",
           "DEFAULT_WORKSPACE_RATIO", "tune_mode", "workspace_limit", "workspace_ratio",
           "relative_workspace_limit", "workspace_rule",
           "policy", "budget_s", "reps", "undivided_margin", "similar_factor",
           "model_prefilter", "online_tuning", "tune_clock", "CLOCKS"]

PASSES = ("forward", "backward_data", "backward_filter")
POLICIES = ("powerOfTwo", "all", "undivided")
MODES = ("benchmark", "heuristic", "off")
CLOCKS = ("auto", "cpu", "wall")
UNDIVIDED_MARGIN = 0.03
DEFAULT_WORKSPACE_MB = 64
DEFAULT_WORKSPACE_RATIO = 0.5


def tune_mode() -> str:
    """``DISTTENSOR_CONV_TUNE`` (default ``benchmark``)."""
    m = getenv("DISTTENSOR_CONV_TUNE", "benchmark").strip().lower() or "benchmark"
    if m not in MODES:
        raise ValueError(f"DISTTENSOR_CONV_TUNE must be one of {MODES}, got {m!r}")
    return m


def workspace_limit() -> int:
    """``DISTTENSOR_CONV_WORKSPACE_MB`` (default 64) in bytes."""
    return int(float(getenv("DISTTENSOR_CONV_WORKSPACE_MB",
                                    str(DEFAULT_WORKSPACE_MB))) * 2**20)


def workspace_ratio() -> float:
    """``DISTTENSOR_CONV_WORKSPACE_RATIO`` (default 0.5; ``off`` or 0: none): the workspace a
    CPU layer-pass may use relative to the bytes of its operands."""
    v = getenv("DISTTENSOR_CONV_WORKSPACE_RATIO", str(DEFAULT_WORKSPACE_RATIO))
    v = v.strip().lower()
    if v in ("off", "no", "false", ""):
        return 0.0
    f = float(v)
    if not f >= 0:
        raise ValueError(f"DISTTENSOR_CONV_WORKSPACE_RATIO must be >= 0 or off, got {v!r}")
    return f


def relative_workspace_limit(operand_bytes: int, absolute_mb=None, ratio: float = 0.0) -> int:
    """The workspace limit in bytes of a layer-pass whose operands (input and output, or
    output gradient and input gradient, or input and output gradient, over the whole batch)
    take ``operand_bytes``: ``absolute_mb`` MiB when given (an explicit
    ``DISTTENSOR_CONV_WORKSPACE_MB`` is a cap), else the larger of the default 64 MiB and
    ``ratio * operand_bytes`` (pure)."""
    if absolute_mb is not None:
        return int(float(absolute_mb) * 2**20)
    return max(DEFAULT_WORKSPACE_MB * 2**20, int(ratio * max(0, int(operand_bytes))))


def workspace_rule():
    """What :func:`relative_workspace_limit` is computed from: ``(absolute_mb or None,
    ratio)`` from the environment."""
    mb = getenv("DISTTENSOR_CONV_WORKSPACE_MB")
    if mb is not None and mb.strip() == "":
        mb = None
    return mb, (0.0 if mb is not None else workspace_ratio())


def policy() -> str:
    """``DISTTENSOR_CONV_POLICY`` (default ``powerOfTwo``)."""
    p = getenv("DISTTENSOR_CONV_POLICY", "powerOfTwo").strip() or "powerOfTwo"
    if p not in POLICIES:
        raise ValueError(f"DISTTENSOR_CONV_POLICY must be one of {POLICIES}, got {p!r}")
    return p


def budget_s() -> float:
    """``DISTTENSOR_CONV_TUNE_BUDGET_S`` (default 2): seconds of timing per layer-pass."""
    return float(getenv("DISTTENSOR_CONV_TUNE_BUDGET_S", "2"))


def reps() -> int:
    """``DISTTENSOR_CONV_TUNE_REPS`` (default 2, at least 1): timed runs per candidate."""
    return max(1, int(getenv("DISTTENSOR_CONV_TUNE_REPS", "2")))


def undivided_margin() -> float:
    """``DISTTENSOR_CONV_TUNE_MARGIN`` (default 0.03): how much faster a measured division
    must be than the undivided plan to be taken.  A division's own costs (more kernel calls,
    copying the micro-batches' outputs together) are inside its measured time; the margin only
    keeps timing noise (best of two CPU-time runs) from taking a division that is not faster.
    At 0.10 it kept the undivided plan where one sample at a time was 6-8 % faster."""
    return float(getenv("DISTTENSOR_CONV_TUNE_MARGIN", str(UNDIVIDED_MARGIN)))


def _factor_setting(name: str, default: str) -> float:
    """The factor in the environment variable ``name`` (``default`` when unset); ``off``,
    ``no``, ``false`` or empty: 0.  Negative values raise ``ValueError``."""
    v = getenv(name, default).strip().lower()
    if v in ("off", "no", "false", ""):
        return 0.0
    f = float(v)
    if f < 0:
        raise ValueError(f"{name} must be >= 1 or off, got {v!r}")
    return f


def similar_factor() -> float:
    """``DISTTENSOR_CONV_TUNE_SIMILAR`` (default 2): the largest per-axis extent ratio at which
    a tuned plan is reused; 0 (``off``) disables reuse, 1 reuses only equal extents (other
    pads)."""
    return _factor_setting("DISTTENSOR_CONV_TUNE_SIMILAR", "2")


def model_prefilter() -> float:
    """``DISTTENSOR_CONV_TUNE_PREFILTER`` (default 2): the cost-model factor within which
    candidates are timed; 0 (``off``) times every candidate."""
    return _factor_setting("DISTTENSOR_CONV_TUNE_PREFILTER", "2")


def online_tuning() -> bool:
    """``DISTTENSOR_CONV_TUNE_ONLINE`` (default on; ``off``, ``0``, ``no``, ``false``: off)."""
    v = getenv("DISTTENSOR_CONV_TUNE_ONLINE", "on").strip().lower()
    return v not in ("off", "0", "no", "false")


def tune_clock() -> str:
    """``DISTTENSOR_CONV_TUNE_CLOCK`` (default ``auto``): ``auto``, ``cpu`` or ``wall``."""
    v = getenv("DISTTENSOR_CONV_TUNE_CLOCK", "auto").strip().lower()
    if v not in CLOCKS:
        raise ValueError(f"DISTTENSOR_CONV_TUNE_CLOCK must be one of {CLOCKS}, got {v!r}")
    return v
