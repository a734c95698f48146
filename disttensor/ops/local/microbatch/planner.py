"""Micro-batched convolution under a workspace limit (mu-cuDNN, Oyama et al., 2018).

A layer's mini-batch of N samples is split into micro-batches ``b_1 + ... + b_k = N``, each run
by its own algorithm, so that algorithms whose workspace grows with the batch (one big GEMM
over packed columns, cuDNN's faster engines) still fit a workspace limit.  For one layer, pass
and limit the planner

1. lists the candidate micro-batch sizes of the *policy*: ``"powerOfTwo"`` (1, 2, 4, ... and
   N), ``"all"`` (1..N) or ``"undivided"`` (N only);
2. gets a time ``t(a, b)`` for every algorithm ``a`` that supports size ``b`` with
   ``workspace(a, b) <= limit``: measured on the call's own data (mode ``"benchmark"``,
   :func:`measure_times`: a warm-up and ``DISTTENSOR_CONV_TUNE_REPS`` timed runs round-robin
   over the candidates, the minimum, each run a whole mini-batch of work; the smallest size
   and the whole batch always, the rest while the layer's ``DISTTENSOR_CONV_TUNE_BUDGET_S``
   lasts) or from each algorithm's ``estimate_seconds`` cost model (mode ``"heuristic"``:
   deterministic, no timing; algorithms without one are left out);
3. divides N by dynamic programming: ``T(0) = 0``, ``T(n) = min over (a, b), b <= n, of
   T(n - b) + t(a, b)`` (time adds, the workspace is the largest of the parts; ties go to fewer
   micro-batches), see :func:`optimal_division`; a measured division must beat the
   undivided plan by ``DISTTENSOR_CONV_TUNE_MARGIN`` (default 10 %) to be taken
   (:func:`choose_division`: timing noise must not buy extra calls).

Filter gradients of the micro-batches are summed (the first writes the output, the others add
into it: cuDNN's beta = 1).  When no algorithm fits the limit the limit is raised to the
smallest workspace any algorithm needs for the smallest micro-batch; the plan's ``note`` says
so and a :class:`RuntimeWarning` is issued once per problem (the computation always runs).

Whole-network workspace division (mu-cuDNN's WD): :func:`pareto_set` gives each layer-pass's
Pareto-optimal (time, workspace) configurations, :func:`divide_workspace` chooses one per
layer-pass minimising the total time with the sum of workspaces within a total budget
(an exact multiple-choice knapsack over Pareto frontiers of partial sums), and
:func:`plan_network` applies WD or the per-layer limit policy WR (every layer-pass gets the
whole budget, workspace reused between layers) by installing per-problem limits
(:func:`set_limit_override`).

The CPU entry points :func:`conv_forward`, :func:`conv_backward_data` and
:func:`conv_backward_filter` (what ``kernels_for(numpy_array)`` returns) have exactly
:mod:`.cpu_conv`'s contracts and go through the planner; :mod:`.gpu`'s do the same for CuPy
arrays with cuDNN execution plans and im2col.  Configuration (read at each call):

* ``DISTTENSOR_CONV_TUNE``: ``benchmark`` (default: time the candidates on the first use of a
  shape, cache the choice on disk, :mod:`.conv_plan_cache`), ``heuristic`` (cost models, no
  timing, nothing written) or ``off`` (today's single kernel, :mod:`.cpu_conv`'s tiles);
* ``DISTTENSOR_CONV_WORKSPACE_MB``: the per-layer workspace limit (default 64 MiB);
* ``DISTTENSOR_CONV_POLICY``: ``powerOfTwo`` (default), ``all`` or ``undivided``;
* ``DISTTENSOR_CONV_TUNE_BUDGET_S`` (default 2 s per layer-pass), ``DISTTENSOR_CONV_TUNE_REPS``
  (default 2), ``DISTTENSOR_CONV_TUNE_MARGIN`` (default 0.10).

The choice is rank-local (no MPI in local kernels): ranks may run different algorithms, whose
results agree to float rounding.
"""
from __future__ import annotations

import math
import os
import threading
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..cpu import conv_im2col as cpu_conv
from .plan_cache import PlanCache, fingerprint

__all__ = [
    "PASSES", "POLICIES", "MODES", "ConvProblem", "Plan", "Config",
    "candidate_sizes", "optimal_division", "choose_division", "pareto_front", "divide_workspace",
    "cpu_algorithms", "candidates", "measure_times", "model_times", "plan_problem", "pareto_set", "plan_network", "run_plan",
    "set_limit_override", "clear_limit_overrides", "rotating_slices", "tune_mode", "workspace_limit", "policy",
    "conv_forward", "conv_backward_data", "conv_backward_filter", "last_plan", "clear_plans",
]

PASSES = ("forward", "backward_data", "backward_filter")
POLICIES = ("powerOfTwo", "all", "undivided")
MODES = ("benchmark", "heuristic", "off")


# -- configuration ---------------------------------------------------------------------------
def tune_mode() -> str:
    """``DISTTENSOR_CONV_TUNE`` (default ``benchmark``)."""
    m = os.environ.get("DISTTENSOR_CONV_TUNE", "benchmark").strip().lower() or "benchmark"
    if m not in MODES:
        raise ValueError(f"DISTTENSOR_CONV_TUNE must be one of {MODES}, got {m!r}")
    return m


def workspace_limit() -> int:
    """``DISTTENSOR_CONV_WORKSPACE_MB`` (default 64) in bytes."""
    return int(float(os.environ.get("DISTTENSOR_CONV_WORKSPACE_MB", "64")) * 2**20)


def policy() -> str:
    """``DISTTENSOR_CONV_POLICY`` (default ``powerOfTwo``)."""
    p = os.environ.get("DISTTENSOR_CONV_POLICY", "powerOfTwo").strip() or "powerOfTwo"
    if p not in POLICIES:
        raise ValueError(f"DISTTENSOR_CONV_POLICY must be one of {POLICIES}, got {p!r}")
    return p


def _budget_s() -> float:
    return float(os.environ.get("DISTTENSOR_CONV_TUNE_BUDGET_S", "2"))


def _reps() -> int:
    return max(1, int(os.environ.get("DISTTENSOR_CONV_TUNE_REPS", "2")))


# -- problems and plans ----------------------------------------------------------------------
@dataclass(frozen=True)
class ConvProblem:
    """One convolution pass on one shape.  ``x_shape`` is the convolution's input
    ``(N, Cin, D, H, W)`` (the shape of ``dx`` for ``backward_data``), ``w_shape`` the
    weight's ``(Cout, Cin // groups, kD, kH, kW)``; ``dtype`` a NumPy dtype string."""

    pass_: str
    x_shape: tuple
    w_shape: tuple
    stride: tuple
    dilation: tuple
    pad_lo: tuple
    pad_hi: tuple
    groups: int
    dtype: str

    @staticmethod
    def make(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups, dtype):
        if pass_ not in PASSES:
            raise ValueError(f"pass must be one of {PASSES}, got {pass_!r}")
        t = lambda v: tuple(int(a) for a in v)  # noqa: E731
        return ConvProblem(pass_, t(x_shape), t(w_shape), t(stride), t(dilation), t(pad_lo),
                           t(pad_hi), int(groups), np.dtype(dtype).str)

    @property
    def batch(self) -> int:
        return self.x_shape[0]

    def with_batch(self, b: int) -> "ConvProblem":
        return ConvProblem(self.pass_, (int(b),) + self.x_shape[1:], self.w_shape, self.stride,
                           self.dilation, self.pad_lo, self.pad_hi, self.groups, self.dtype)

    def args(self) -> tuple:
        """``(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups, dtype)``: the
        arguments of an algorithm's ``supports`` and ``workspace_bytes``."""
        return (self.pass_, self.x_shape, self.w_shape, self.stride, self.dilation,
                self.pad_lo, self.pad_hi, self.groups, np.dtype(self.dtype))

    def flops(self) -> float:
        """Multiply-adds times two of the pass (the same for all three passes)."""
        out = cpu_conv.conv_out_shape(self.x_shape[2:], self.w_shape[2:], self.stride,
                                      self.dilation, self.pad_lo, self.pad_hi)
        return 2.0 * self.x_shape[0] * self.w_shape[0] * math.prod(out) * math.prod(
            self.w_shape[1:])

    def fields(self) -> dict:
        return {k: getattr(self, k) for k in ("pass_", "x_shape", "w_shape", "stride",
                                              "dilation", "pad_lo", "pad_hi", "groups",
                                              "dtype")}


@dataclass(frozen=True)
class Plan:
    """A division of the mini-batch: ``micro_batches`` is ``((algorithm, size), ...)`` in
    sample order (sizes sum to N); ``seconds`` the predicted (measured or modelled) total,
    ``workspace`` the largest micro-batch's workspace in bytes, ``note`` why a limit was
    exceeded (empty otherwise)."""

    micro_batches: tuple
    seconds: float
    workspace: int
    note: str = ""

    def to_json(self) -> dict:
        return {"micro_batches": [list(m) for m in self.micro_batches],
                "seconds": self.seconds, "workspace": self.workspace, "note": self.note}

    @staticmethod
    def from_json(d) -> "Plan":
        return Plan(tuple((str(a), int(b)) for a, b in d["micro_batches"]),
                    float(d["seconds"]), int(d["workspace"]), str(d.get("note", "")))

    @property
    def algorithms(self) -> tuple:
        return tuple(sorted({a for a, _ in self.micro_batches}))


@dataclass(frozen=True)
class Config:
    """One configuration of a layer-pass for workspace division: its time, its workspace and
    (optionally) the plan that achieves them."""

    seconds: float
    workspace: int
    plan: Plan | None = field(default=None, compare=False)


# -- pure planning ---------------------------------------------------------------------------
def candidate_sizes(n: int, policy_: str) -> list:
    """The micro-batch sizes a policy tries for a mini-batch of ``n``: ``undivided`` [n],
    ``powerOfTwo`` the powers of two below ``n`` and ``n``, ``all`` 1..n."""
    n = int(n)
    if n < 1:
        raise ValueError(f"the mini-batch must hold at least one sample, got {n}")
    if policy_ == "undivided":
        return [n]
    if policy_ == "all":
        return list(range(1, n + 1))
    if policy_ == "powerOfTwo":
        return sorted({1 << k for k in range(n.bit_length()) if 1 << k <= n} | {n})
    raise ValueError(f"policy must be one of {POLICIES}, got {policy_!r}")


def optimal_division(n: int, times: dict, workspace: dict | None = None,
                     limit: int | None = None):
    """The fastest division of ``n`` samples: ``(total_seconds, [(algorithm, size), ...])``,
    or None if no division exists.

    ``times`` maps ``(algorithm, size)`` to seconds; with ``workspace`` (same keys, bytes) and
    ``limit``, entries whose workspace exceeds ``limit`` are left out.  Dynamic program
    ``T(m) = min_{(a, b), b <= m} T(m - b) + t(a, b)``, O(n * len(times)); among equally fast
    divisions the one with fewer micro-batches wins, then the order of ``sorted(times)``."""
    items = sorted((k, float(t)) for k, t in times.items()
                   if limit is None or workspace is None or workspace[k] <= limit)
    inf = (math.inf, math.inf)
    best = [(0.0, 0)] + [inf] * n
    choice = [None] * (n + 1)
    for m in range(1, n + 1):
        for (a, b), t in items:
            if b > m or best[m - b][0] == math.inf:
                continue
            cand = (best[m - b][0] + t, best[m - b][1] + 1)
            if cand < best[m]:
                best[m], choice[m] = cand, (a, b)
    if best[n][0] == math.inf:
        return None
    parts, m = [], n
    while m:
        parts.append(choice[m])
        m -= choice[m][1]
    parts.sort(key=lambda p: -p[1])  # big micro-batches first (any order has the same time)
    return best[n][0], parts


UNDIVIDED_MARGIN = 0.10


def undivided_margin() -> float:
    """``DISTTENSOR_CONV_TUNE_MARGIN`` (default 0.10): how much faster a measured division
    must be than the undivided plan to be taken."""
    return float(os.environ.get("DISTTENSOR_CONV_TUNE_MARGIN", str(UNDIVIDED_MARGIN)))


def choose_division(n: int, times: dict, margin: float = UNDIVIDED_MARGIN):
    """:func:`optimal_division` with a hysteresis for measured times: the fastest undivided
    entry ``(a, n)`` is kept unless the division is faster by more than ``margin`` (a
    fraction), since a division that wins by timing noise only costs extra calls.  Same
    return value; None if no division exists."""
    found = optimal_division(n, times)
    whole = [(t, k) for k, t in times.items() if k[1] == n]
    if found is None or not whole:
        return found
    t_whole, k_whole = min(whole)
    if found[0] * (1.0 + margin) >= t_whole:
        return t_whole, [k_whole]
    return found


def pareto_front(configs) -> list:
    """The configurations no other beats in both time and workspace, by increasing
    workspace (and so decreasing time); of equal ones the first is kept."""
    out = []
    for c in sorted(configs, key=lambda c: (c.workspace, c.seconds)):
        if not out or c.seconds < out[-1].seconds:
            out.append(c)
    return out


def divide_workspace(sets: dict, total_bytes: int) -> dict:
    """Whole-network workspace division (mu-cuDNN's WD): choose one :class:`Config` from each
    ``sets[key]`` minimising the sum of times with the sum of workspaces ``<= total_bytes``.

    Exact: the layer-passes are added one at a time, keeping the Pareto frontier of
    (total workspace, total time) of the partial choices (a multiple-choice knapsack; the
    frontier never holds more entries than distinct workspace sums within the budget).
    Raises ValueError when even the smallest workspaces exceed the budget."""
    front = [(0, 0.0, ())]  # (workspace, seconds, choices)
    keys = list(sets)
    for key in keys:
        options = pareto_front(sets[key])
        if not options:
            raise ValueError(f"layer-pass {key!r} has no configuration")
        merged = sorted(((ws + c.workspace, t + c.seconds, ch + (c,))
                         for ws, t, ch in front for c in options
                         if ws + c.workspace <= total_bytes), key=lambda e: (e[0], e[1]))
        front = []
        for e in merged:
            if not front or e[1] < front[-1][1]:
                front.append(e)
        if not front:
            need = sum(min(c.workspace for c in sets[k]) for k in keys)
            raise ValueError(f"the workspace budget {total_bytes} B is smaller than the sum of "
                             f"the smallest workspaces of the layer-passes ({need} B)")
    ws, t, choices = min(front, key=lambda e: (e[1], e[0]))
    return dict(zip(keys, choices))


# -- CPU algorithms --------------------------------------------------------------------------
_GEMM_FLOPS = 2.0e10   # cost-model constants: only their ratios matter (heuristic mode)
_MEM_BW = 5.0e9
_CALL_S = 5.0e-6


def _gemm_seconds(m, k, ncols) -> float:
    """Modelled seconds of an (m x k) @ (k x ncols) GEMM: rate falls off for thin matrices."""
    eff = (ncols / (ncols + 96.0)) * (m / (m + 8.0))
    return _CALL_S + 2.0 * m * k * ncols / (_GEMM_FLOPS * eff)


def _sizes(problem: ConvProblem):
    k_rows, cog, out_sp = cpu_conv._geometry_sizes(problem.x_shape, problem.w_shape,
                                                   problem.stride, problem.dilation,
                                                   problem.pad_lo, problem.pad_hi,
                                                   problem.groups)
    return k_rows, cog, out_sp, np.dtype(problem.dtype).itemsize


class Im2colTiled:
    """:mod:`.cpu_conv`'s kernels with column tiles bounded by ``tile_bytes`` (0: one output
    depth plane; None: ``DISTTENSOR_CONV_WORKSPACE_MB``).  Workspace independent of N."""

    def __init__(self, tile_bytes=None):
        self.tile_bytes = tile_bytes

    def supports(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups, dtype):
        return np.dtype(dtype) in (np.float32, np.float64)

    def workspace_bytes(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                        dtype):
        return cpu_conv.tiled_workspace_bytes(pass_, x_shape, w_shape, stride, dilation, pad_lo,
                                              pad_hi, groups, dtype, self.tile_bytes)

    def estimate_seconds(self, problem: ConvProblem) -> float:
        k_rows, cog, out_sp, item = _sizes(problem)
        plane = out_sp[1] * out_sp[2]
        planes = cpu_conv._tile_planes(out_sp, k_rows, np.dtype(problem.dtype), self.tile_bytes)
        tiles = -(-out_sp[0] // planes)
        per_tile = _gemm_seconds(cog, k_rows, planes * plane)
        pack = k_rows * out_sp[0] * plane * item / _MEM_BW
        return problem.batch * problem.groups * (tiles * per_tile + pack)

    def forward(self, x, w, stride, dilation, pad_lo, pad_hi, groups):
        return cpu_conv.conv_forward(x, w, stride, dilation, pad_lo, pad_hi, groups,
                                     workspace_bytes=self.tile_bytes)

    def backward_data(self, dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups):
        return cpu_conv.conv_backward_data(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi,
                                           groups, workspace_bytes=self.tile_bytes)

    def backward_filter(self, x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups):
        return cpu_conv.conv_backward_filter(x, dy, kernel, stride, dilation, pad_lo, pad_hi,
                                             groups, workspace_bytes=self.tile_bytes)


class Im2colBatched:
    """:mod:`.cpu_conv`'s ``*_batched`` kernels: the columns of the whole micro-batch in one
    GEMM per group; workspace ``b * (K + Cout/groups) * P * itemsize``."""

    def supports(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups, dtype):
        return np.dtype(dtype) in (np.float32, np.float64)

    def workspace_bytes(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                        dtype):
        return cpu_conv.batched_workspace_bytes(pass_, x_shape, w_shape, stride, dilation,
                                                pad_lo, pad_hi, groups, dtype)

    def estimate_seconds(self, problem: ConvProblem) -> float:
        k_rows, cog, out_sp, item = _sizes(problem)
        cols = problem.batch * math.prod(out_sp)
        pack = (k_rows + 2 * cog) * cols * item / _MEM_BW
        return problem.groups * (_gemm_seconds(cog, k_rows, cols) + pack)

    def forward(self, x, w, stride, dilation, pad_lo, pad_hi, groups):
        return cpu_conv.conv_forward_batched(x, w, stride, dilation, pad_lo, pad_hi, groups)

    def backward_data(self, dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups):
        return cpu_conv.conv_backward_data_batched(dy, w, in_spatial, stride, dilation, pad_lo,
                                                   pad_hi, groups)

    def backward_filter(self, x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups):
        return cpu_conv.conv_backward_filter_batched(x, dy, kernel, stride, dilation, pad_lo,
                                                     pad_hi, groups)


_direct_cache: dict = {}


def _direct_algorithms() -> dict:
    """``cpu_conv_direct.ALGORITHMS`` where that module imports ({} before it exists; a module
    that fails otherwise is left out with a warning)."""
    if "algos" not in _direct_cache:
        algos = {}
        try:
            from ..cpu import conv_direct as cpu_conv_direct
            algos = dict(getattr(cpu_conv_direct, "ALGORITHMS", {}))
        except ImportError:
            pass
        except Exception as err:  # noqa: BLE001 - a broken optional module must not break conv
            warnings.warn(f"cpu_conv_direct failed to import ({type(err).__name__}: {err}); its "
                          "algorithms are not used", RuntimeWarning, stacklevel=2)
        _direct_cache["algos"] = algos
    return _direct_cache["algos"]


_cpu_algos: dict = {}


def cpu_algorithms(limit: int) -> dict:
    """The CPU algorithms for a workspace limit: ``im2col-tiled`` (tiles of up to ``limit``),
    ``im2col-plane`` (tiles of one output depth plane: the smallest workspace),
    ``im2col-batched``, and those of ``cpu_conv_direct`` (which may not reuse these names).
    The same (stateless) objects for the same limit; do not modify the returned dict."""
    limit = int(limit)
    algos = _cpu_algos.get(limit)
    if algos is None:
        algos = {"im2col-tiled": Im2colTiled(limit), "im2col-plane": Im2colTiled(0),
                 "im2col-batched": Im2colBatched()}
        for name, a in _direct_algorithms().items():
            if name not in algos:
                algos[name] = a
        if len(_cpu_algos) > 64:
            _cpu_algos.clear()
        _cpu_algos[limit] = algos
    return algos


# -- measuring -------------------------------------------------------------------------------
def candidates(problem: ConvProblem, algos: dict, sizes) -> dict:
    """``{(name, b): workspace}`` for the algorithms supporting micro-batch ``b``; of
    algorithms of the same class with the same workspace only the first is kept (e.g. the
    tiled kernel whose tile bound already gives one plane)."""
    out, seen = {}, set()
    for b in sizes:
        pb = problem.with_batch(b)
        for name, a in algos.items():
            try:
                if not a.supports(*pb.args()):
                    continue
                ws = int(a.workspace_bytes(*pb.args()))
            except Exception as err:  # noqa: BLE001 - an algorithm that cannot say: skip it
                _warn_once(("candidate", name, type(err).__name__),
                           f"conv algorithm {name!r} failed to describe itself "
                           f"({type(err).__name__}: {err}); it is skipped")
                continue
            dup = (type(a), ws, b)
            if isinstance(a, Im2colTiled) and dup in seen:
                continue
            seen.add(dup)
            out[(name, b)] = ws
    return out


def model_times(problem: ConvProblem, algos: dict, cands: dict) -> dict:
    """Heuristic mode: each candidate's ``estimate_seconds`` (algorithms without a cost model
    are left out)."""
    out = {}
    for (name, b) in cands:
        est = getattr(algos[name], "estimate_seconds", None)
        if est is not None:
            out[(name, b)] = float(est(problem.with_batch(b)))
    return out


def measure_times(problem: ConvProblem, cands: dict, algos: dict, runner, sync=None,
                  budget_s: float | None = None, reps: int | None = None,
                  always=None) -> dict:
    """Benchmark mode: time the candidates ``{(name, b): workspace}`` with
    ``runner(algorithm, b)``, which runs an algorithm on ``b`` samples; returns
    ``{(name, b): seconds per call}``.

    Each candidate gets a warm-up and ``reps`` timed runs (default
    ``DISTTENSOR_CONV_TUNE_REPS``), the minimum kept.  A timed run of size ``b`` is ``N // b``
    calls (over different samples, the runner's business) divided by their number, so every
    candidate is timed over a whole mini-batch of work: timing one short call would favour
    small micro-batches on a loaded machine (the minimum of short runs finds quiet moments
    more easily).  The repetitions go round the candidates (smallest sizes first), so a drift
    of the machine's load hits all of them alike.  The first round over the smallest size and
    over ``always`` (default: the whole-batch candidates, the undivided baseline) is always
    completed; everything else only while ``budget_s`` lasts (default
    ``DISTTENSOR_CONV_TUNE_BUDGET_S``).  ``sync`` (e.g. a stream synchronize) runs before a
    clock is read.  A candidate that raises is dropped with a warning."""
    budget = _budget_s() if budget_s is None else float(budget_s)
    reps = _reps() if reps is None else max(1, int(reps))
    t_start = time.perf_counter()
    order = sorted(cands, key=lambda k: (k[1], k[0]))
    smallest = min((b for _, b in order), default=0)
    if always is None:
        always = {k for k in order if k[1] == problem.batch}
    always = set(always)
    out: dict = {}
    failed: set = set()

    def over():
        return time.perf_counter() - t_start > budget

    for rep in range(reps):
        for key in order:
            name, b = key
            if key in failed or (rep > 0 and key not in out):
                continue
            if over() and (rep > 0 or (b != smallest and key not in always)):
                if rep > 0:
                    break
                continue
            try:
                if rep == 0:
                    runner(algos[name], b)
                    if sync:
                        sync()
                calls = max(1, problem.batch // b)
                t0 = time.perf_counter()
                for _ in range(calls):
                    runner(algos[name], b)
                if sync:
                    sync()
                dt = (time.perf_counter() - t0) / calls
            except Exception as err:  # noqa: BLE001 - a failing candidate is not a candidate
                _warn_once(("run", name, type(err).__name__),
                           f"conv algorithm {name!r} failed while being timed "
                           f"({type(err).__name__}: {err}); it is skipped")
                failed.add(key)
                out.pop(key, None)
                continue
            out[key] = min(out.get(key, math.inf), dt)
    return out


_warned: set = set()


def _warn_once(key, msg):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, RuntimeWarning, stacklevel=4)


def plan_problem(problem: ConvProblem, algos: dict, limit: int, policy_: str, mode: str,
                 runner=None, sync=None) -> Plan:
    """The plan for ``problem`` under ``limit`` bytes (see the module): times measured with
    ``runner(algorithm, b)`` (which runs the algorithm object on ``b`` of the samples; mode
    ``benchmark``) or modelled (``heuristic``).  With one candidate only nothing is timed."""
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
        _warn_once(("limit", problem, limit), note)
        limit = need
        fit = {k: ws for k, ws in cands.items() if ws <= limit}
    if mode == "benchmark" and runner is not None and len(fit) > 1:
        times = measure_times(problem, fit, algos, runner, sync)
    else:
        times = model_times(problem, algos, fit)
        if not times:  # no cost model: equal times, so the fewest micro-batches win
            times = {k: 1.0 for k in fit}
    if not any(b == smallest for _, b in times):  # every small candidate failed: model them
        times.update({k: 1.0 for k in fit if k[1] == smallest and k not in times})
    found = choose_division(problem.batch, times, undivided_margin() if mode == "benchmark"
                            else 0.0)
    if found is None:
        raise RuntimeError(f"no division of {problem.batch} samples for {problem}")
    total, parts = found
    return Plan(tuple(parts), total, max(fit[p] for p in parts), note)


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
def run_plan(plan: Plan, algos: dict, pass_: str, a, b, extra, geo, xp=np):
    """Run ``plan``'s micro-batches.  ``pass_`` forward: ``a = x``, ``b = w``, ``extra``
    unused; backward_data: ``a = dy``, ``b = w``, ``extra = in_spatial``; backward_filter:
    ``a = x``, ``b = dy``, ``extra = kernel``.  ``geo = (stride, dilation, pad_lo, pad_hi,
    groups)``.  Outputs of micro-batches are written into one array (forward, backward data) or
    summed (filter gradient)."""
    def call(name, lo, hi):
        alg = algos[name]
        if pass_ == "forward":
            return alg.forward(a[lo:hi], b, *geo)
        if pass_ == "backward_data":
            return alg.backward_data(a[lo:hi], b, extra, *geo)
        return alg.backward_filter(a[lo:hi], b[lo:hi], extra, *geo)

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


def set_limit_override(problem: ConvProblem, limit_bytes: int | None) -> None:
    """Use ``limit_bytes`` instead of the global limit for ``problem`` (None removes it)."""
    if limit_bytes is None:
        _limit_overrides.pop(problem, None)
    else:
        _limit_overrides[problem] = int(limit_bytes)


def clear_limit_overrides() -> None:
    _limit_overrides.clear()


def clear_plans() -> None:
    """Forget the plans held in memory (the disk cache is re-read on the next use)."""
    with _plans_lock:
        _plans.clear()
    _disk.clear_memory()


def last_plan():
    """The :class:`Plan` of this thread's latest planned convolution (None before any)."""
    return getattr(_state, "plan", None)


def get_plan(problem: ConvProblem, algos: dict, device_fp: dict, runner=None, sync=None,
             limit: int | None = None) -> Plan:
    """The plan for ``problem`` under the configured (or overridden) limit, policy and mode:
    from memory, from the disk cache (benchmark mode), or planned now (and stored)."""
    mode = tune_mode()
    pol = policy()
    if limit is None:
        limit = _limit_overrides.get(problem, workspace_limit())
    names = tuple(sorted(algos))
    mkey = (problem, limit, pol, mode, names, device_fp.get("device"), undivided_margin())
    plan = _plans.get(mkey)
    if plan is not None:
        return plan
    fields = None
    if mode == "benchmark":
        fields = dict(fingerprint=device_fp, problem=problem.fields(), limit=limit, policy=pol,
                      mode=mode, algorithms=list(names), margin=undivided_margin())
        stored = _disk.get(fields)
        if stored is not None:
            try:
                plan = Plan.from_json(stored)
                if (sum(b for _, b in plan.micro_batches) != problem.batch
                        or any(a not in algos for a, _ in plan.micro_batches)):
                    plan = None
            except (KeyError, TypeError, ValueError):
                plan = None
    if plan is None:
        plan = plan_problem(problem, algos, limit, pol, mode, runner, sync)
        if fields is not None:
            _disk.put(fields, plan.to_json())
    with _plans_lock:
        _plans[mkey] = plan
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


def rotating_slices(n: int):
    """``take(b)``: successive slices ``[o, o + b)`` cycling through ``range(n)``, so repeated
    timing runs of a micro-batch read different samples (timing the first ``b`` samples over
    and over would measure them from cache and favour small micro-batches)."""
    state = [0]

    def take(b):
        o = state[0] if state[0] + b <= n else 0
        state[0] = o + b
        return slice(o, o + b)
    return take


# -- CPU entry points (kernels_for(numpy array)) ---------------------------------------------
# Each checks its operands with the same cpu_conv helpers every CPU kernel uses (so malformed
# input raises the contract's errors) and leaves empty operands to the plain kernel.
def _cpu_plan(problem: ConvProblem, runner):
    limit = _limit_overrides.get(problem, workspace_limit())
    algos = cpu_algorithms(limit)
    plan = get_plan(problem, algos, fingerprint("cpu"), runner, limit=limit)
    _state.plan = plan
    return plan, algos


def conv_forward(x, w, stride, dilation, pad_lo, pad_hi, groups=1):
    """:func:`.cpu_conv.conv_forward`'s contract, through the micro-batch planner."""
    if tune_mode() == "off":
        return cpu_conv.conv_forward(x, w, stride, dilation, pad_lo, pad_hi, groups)
    x, w, dtype, geo, _ = cpu_conv.forward_operands(x, w, stride, dilation, pad_lo, pad_hi,
                                                    groups)
    geo = geo + (groups,)
    if x.size == 0 or w.size == 0:
        return cpu_conv.conv_forward(x, w, *geo)
    problem = ConvProblem.make("forward", x.shape, w.shape, *geo, dtype)
    take = rotating_slices(x.shape[0])
    plan, algos = _cpu_plan(problem, lambda alg, b: alg.forward(x[take(b)], w, *geo))
    return run_plan(plan, algos, "forward", x, w, None, geo)


def conv_backward_data(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups=1):
    """:func:`.cpu_conv.conv_backward_data`'s contract, through the micro-batch planner."""
    if tune_mode() == "off":
        return cpu_conv.conv_backward_data(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi,
                                           groups)
    dy, w, dtype, in_spatial, geo = cpu_conv.data_operands(dy, w, in_spatial, stride, dilation,
                                                           pad_lo, pad_hi, groups)
    geo = geo + (groups,)
    if dy.size == 0 or w.size == 0 or min(in_spatial) < 1:
        return cpu_conv.conv_backward_data(dy, w, in_spatial, *geo)
    x_shape = (dy.shape[0], w.shape[1] * groups) + in_spatial
    problem = ConvProblem.make("backward_data", x_shape, w.shape, *geo, dtype)
    take = rotating_slices(dy.shape[0])
    plan, algos = _cpu_plan(problem, lambda alg, b: alg.backward_data(
        dy[take(b)], w, in_spatial, *geo))
    return run_plan(plan, algos, "backward_data", dy, w, in_spatial, geo)


def conv_backward_filter(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups=1):
    """:func:`.cpu_conv.conv_backward_filter`'s contract, through the micro-batch planner (the
    micro-batches' filter gradients are summed)."""
    if tune_mode() == "off":
        return cpu_conv.conv_backward_filter(x, dy, kernel, stride, dilation, pad_lo, pad_hi,
                                             groups)
    x, dy, dtype, kernel, geo, _ = cpu_conv.filter_operands(x, dy, kernel, stride, dilation,
                                                            pad_lo, pad_hi, groups)
    geo = geo + (groups,)
    if x.size == 0 or dy.size == 0:
        return cpu_conv.conv_backward_filter(x, dy, kernel, *geo)
    w_shape = (dy.shape[1], x.shape[1] // groups) + kernel
    problem = ConvProblem.make("backward_filter", x.shape, w_shape, *geo, dtype)
    take = rotating_slices(x.shape[0])

    def runner(alg, b):
        sl = take(b)
        return alg.backward_filter(x[sl], dy[sl], kernel, *geo)
    plan, algos = _cpu_plan(problem, runner)
    return run_plan(plan, algos, "backward_filter", x, dy, kernel, geo)
