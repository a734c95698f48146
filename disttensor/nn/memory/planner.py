"""The memory planner: the cost and memory model of keep / offload / recompute, and the exact
dynamic program that chooses per layer under a budget (:func:`plan_memory`).

Everything here is pure and local except :func:`plan_memory` with ``comm`` (it validates
collectively).  Its input is a :class:`MemoryProfile` (:func:`~.profiling.profile_memory`),
its output a :class:`MemoryPlan` (applied by :func:`~.apply.apply_plan`).

The cost and memory model (stated once here; :func:`evaluate_plan` computes it)
--------------------------------------------------------------------------------
Layer ``i`` has saved bytes ``s_i``, input bytes ``a_i``, forward and backward times ``f_i``,
``b_i``; ``B`` is the host<->device bandwidth; ``f_n = b_n = 0`` past the last layer.

* ``keep``: ``s_i`` stays resident from forward to backward; no added time.
* ``offload``: nothing resident; ``s_i`` is copied out while the next layer's forward runs
  and copied back (prefetched) while the next layer's backward runs, so the added time is
  ``max(0, s_i/B - f_{i+1}) + max(0, s_i/B - b_{i+1})`` (the part of each copy the
  neighbouring compute does not hide).  During the layer's backward ``s_i`` is a *transient*.
* ``recompute``: recompute layers are grouped in *segments* of consecutive layers (a plan says
  where runs of recompute layers are cut; by default each maximal run is one segment); a
  segment ``j..k`` is one checkpoint: only its input (``a_j`` bytes) stays resident; its
  backward first re-runs the forward of the segment (added time ``f_j + ... + f_k``), whose
  saved state ``s_j + ... + s_k``, plus the recomputed output ``o_k`` (alive next to the
  first forward's copy until the recomputation ends), is then a transient.  Short segments
  keep more inputs resident, long ones a larger transient: the planner chooses the cuts.

The modelled peak of saved bytes (at the start of backward, where everything kept is still
alive) is ``sum(s_i, keep) + sum(a_j, recompute runs) + max(transients)``: one transient at a
time (a prefetch is counted with its own layer's backward, not overlapping the previous
transient).  Shared buffers (an activation saved by two consecutive layers) are counted for the
first layer that saves them.  The model is the planner's; :func:`measure_step_memory` reports
what a step really allocates.

Collective use: :func:`profile_memory` is collective over the input's grid and takes the

Validation is collective: :func:`plan_memory` with ``comm`` raises the same ``ValueError``
on every rank for a budget below the minimum (the ranks agree on the budget).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...core.comm import collective

__all__ = ["ASSUMED_BANDWIDTH", "CHOICES", "LayerProfile", "MemoryProfile", "MemoryPlan",
           "evaluate_plan", "min_peak", "plan_memory"]

#: host<->device bandwidth assumed where none can be measured (PCIe 3.0 x16, bytes/s)
ASSUMED_BANDWIDTH = 12e9
CHOICES = ("keep", "offload", "recompute")


# -- what the planner takes: per-layer figures of one step ------------------------------------
@dataclass
class LayerProfile:
    """What one layer costs in a training step (see the module docstring's model)."""
    name: str
    saved_bytes: int      # bytes its backward keeps alive (shared buffers: first layer)
    input_bytes: int      # bytes of its input activation (what a checkpoint keeps)
    output_bytes: int
    forward_time: float   # seconds
    backward_time: float  # seconds


@dataclass
class MemoryProfile:
    """Per-layer figures of one step (:func:`profile_memory`), identical on every rank (each
    figure the maximum over the ranks).  ``bandwidth`` in bytes/s; ``bandwidth_assumed``:
    it was not measured (CPU)."""
    layers: list
    bandwidth: float = ASSUMED_BANDWIDTH
    bandwidth_assumed: bool = True
    device: str = "cpu"
    ranks: int = 1

    @property
    def keep_all_peak(self) -> int:
        """Modelled peak of saved bytes when every layer keeps its state."""
        return int(sum(lp.saved_bytes for lp in self.layers))

    def report(self) -> str:
        bw = f"{self.bandwidth / 1e9:.1f} GB/s" + (" (assumed)" if self.bandwidth_assumed
                                                   else " (measured)")
        lines = [f"memory profile: {len(self.layers)} layers on {self.ranks} rank(s), "
                 f"{self.device}, host<->device {bw}",
                 f"{'#':>3} {'layer':<14} {'saved MB':>9} {'input MB':>9} {'fwd ms':>8} "
                 f"{'bwd ms':>8}"]
        for i, lp in enumerate(self.layers):
            lines.append(f"{i:>3} {lp.name[:14]:<14} {lp.saved_bytes / 1e6:>9.3f} "
                         f"{lp.input_bytes / 1e6:>9.3f} {lp.forward_time * 1e3:>8.2f} "
                         f"{lp.backward_time * 1e3:>8.2f}")
        lines.append(f"keep-all saved peak {self.keep_all_peak / 1e6:.3f} MB")
        return "\n".join(lines)


# -- the model and the planner ------------------------------------------------------------------
def _runs(choices) -> list[tuple[int, int]]:
    """Maximal runs ``[start, stop)`` of ``'recompute'`` in ``choices``."""
    out, i, n = [], 0, len(choices)
    while i < n:
        if choices[i] == "recompute":
            j = i
            while j < n and choices[j] == "recompute":
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


def _offload_cost(prof: MemoryProfile, i: int, bandwidth: float) -> float:
    L = prof.layers
    t = L[i].saved_bytes / bandwidth
    f_next = L[i + 1].forward_time if i + 1 < len(L) else 0.0
    b_next = L[i + 1].backward_time if i + 1 < len(L) else 0.0
    return max(0.0, t - f_next) + max(0.0, t - b_next)


def _check_segments(choices, segments) -> list:
    """``segments`` (``[start, stop)`` pairs) validated against ``choices``: together they
    cover exactly the recompute layers, in order; ``None``: the maximal runs."""
    if segments is None:
        return _runs(choices)
    segments = [(int(j), int(k)) for j, k in segments]
    covered = [i for j, k in segments for i in range(j, k)]
    want = [i for i, c in enumerate(choices) if c == "recompute"]
    if covered != want or any(k <= j for j, k in segments):
        raise ValueError(f"segments {segments} must cut the recompute layers {want} into "
                         "consecutive non-empty [start, stop) ranges, in order")
    return segments


def evaluate_plan(profile: MemoryProfile, choices, bandwidth: float | None = None,
                  segments=None):
    """``(peak_bytes, added_seconds)`` of per-layer ``choices`` (recompute layers cut into
    ``segments``, default: maximal runs) under the model of the module docstring.  Local,
    pure."""
    L = profile.layers
    if len(choices) != len(L):
        raise ValueError(f"{len(choices)} choices for {len(L)} layers")
    segments = _check_segments(tuple(choices), segments)
    bw = profile.bandwidth if bandwidth is None else bandwidth
    resident, transient, added = 0, 0, 0.0
    for i, c in enumerate(choices):
        if c == "keep":
            resident += L[i].saved_bytes
        elif c == "offload":
            transient = max(transient, L[i].saved_bytes)
            added += _offload_cost(profile, i, bw)
        elif c != "recompute":
            raise ValueError(f"unknown choice {c!r} (one of {CHOICES})")
    for j, k in segments:
        resident += L[j].input_bytes
        transient = max(transient, sum(L[i].saved_bytes for i in range(j, k))
                        + L[k - 1].output_bytes)
        added += sum(L[i].forward_time for i in range(j, k))
    return int(resident + transient), float(added)


@dataclass
class MemoryPlan:
    """Per-layer choices (``'keep'``, ``'offload'``, ``'recompute'``), the checkpoint
    ``segments`` (``[start, stop)`` ranges cutting the recompute layers; default: each maximal
    run) and the model's predicted peak of saved bytes and added seconds per step (see the
    module docstring).  ``MemoryPlan(choices)`` or ``MemoryPlan(choices, segments=...)``
    makes a plan by hand."""
    choices: tuple
    names: tuple = ()
    budget: int | None = None
    peak: int | None = None
    added_time: float | None = None
    keep_all_peak: int | None = None
    bandwidth: float | None = None
    bandwidth_assumed: bool = True
    unit: int = 1
    segments: list | None = None

    def __post_init__(self):
        self.choices = tuple(self.choices)
        bad = [c for c in self.choices if c not in CHOICES]
        if bad:
            raise ValueError(f"unknown choices {bad} (each one of {CHOICES})")
        self.segments = _check_segments(self.choices, self.segments)

    def counts(self) -> dict:
        return {c: self.choices.count(c) for c in CHOICES}

    def report(self) -> str:
        names = self.names or tuple(f"layer{i}" for i in range(len(self.choices)))
        lines = []
        if self.budget is not None:
            bw = "" if self.bandwidth is None else \
                f", bandwidth {self.bandwidth / 1e9:.1f} GB/s" + \
                (" (assumed)" if self.bandwidth_assumed else " (measured)")
            lines.append(f"memory plan: budget {self.budget / 1e6:.3f} MB, predicted peak "
                         f"{self.peak / 1e6:.3f} MB (keep-all {self.keep_all_peak / 1e6:.3f} "
                         f"MB), added {self.added_time * 1e3:.2f} ms/step{bw}")
        c = self.counts()
        lines.append(f"  keep {c['keep']}, offload {c['offload']}, recompute {c['recompute']} "
                     f"in {len(self.segments)} checkpoint(s)")
        seg_of = {i: s for s, (j, k) in enumerate(self.segments) for i in range(j, k)}
        for i, (n, ch) in enumerate(zip(names, self.choices)):
            tag = f" (checkpoint {seg_of[i]})" if i in seg_of else ""
            lines.append(f"  {i:>3} {n:<14} {ch}{tag}")
        return "\n".join(lines)


def _min_peak(s, a, o, allow_off: bool, allow_rec: bool, cands) -> int:
    """The smallest modelled peak any plan reaches (exact, over the transient bounds)."""
    n = len(s)
    best = sum(s)
    for T in cands:
        # least resident bytes for layers < i with every transient <= T
        dp = [math.inf] * (n + 1)
        dp[0] = 0
        for i in range(n):
            r = dp[i]
            if r == math.inf:
                continue
            dp[i + 1] = min(dp[i + 1], r + s[i])
            if allow_off and s[i] <= T:
                dp[i + 1] = min(dp[i + 1], r)
            if allow_rec:
                tot = 0
                for k in range(i, n):
                    tot += s[k]
                    if tot > T:
                        break
                    if tot + o[k] <= T:
                        dp[k + 1] = min(dp[k + 1], r + a[i])
        best = min(best, dp[n] + T)
    return int(best)


def min_peak(profile: MemoryProfile, *, allow_offload: bool = True,
             allow_recompute: bool = True) -> int:
    """The smallest modelled peak of saved bytes any plan reaches: the least budget
    :func:`plan_memory` accepts.  With offload it is the largest layer's saved bytes (every
    layer offloaded reaches it; no plan goes below it).  Local, pure."""
    s = [int(lp.saved_bytes) for lp in profile.layers]
    a = [int(lp.input_bytes) for lp in profile.layers]
    o = [int(lp.output_bytes) for lp in profile.layers]
    return _min_peak(s, a, o, allow_offload, allow_recompute, _transient_bounds(
        s, o, allow_offload, allow_recompute))


def _transient_bounds(s, o, allow_off: bool, allow_rec: bool) -> list:
    """Every value the largest transient of a plan can take."""
    every = {0}
    if allow_off:
        every.update(s)
    if allow_rec:
        for i in range(len(s)):
            tot = 0
            for k in range(i, len(s)):
                tot += s[k]
                every.add(tot + o[k])
    return sorted(every)


def plan_memory(profile: MemoryProfile, budget_bytes, bandwidth: float | None = None, *,
                allow_offload: bool = True, allow_recompute: bool = True,
                resolution: int = 1024, unit: int | None = None, comm=None) -> MemoryPlan:
    """The choice per layer that minimises the modelled added time subject to the modelled
    peak of saved bytes ``<= budget_bytes`` (model: module docstring).

    Exact dynamic program: for every candidate bound ``T`` on the largest transient (0, each
    layer's saved bytes, each segment's transient), a knapsack over the layers in order whose state
    is the resident bytes (in units of ``unit`` bytes, each layer's bytes rounded *up*, so
    the plan always fits the budget; default ``unit = ceil(budget / resolution)``); a step
    keeps or offloads one layer or makes a segment of recompute layers.  Time
    ``O(n^4 * budget / unit)`` with ``n`` layers: pseudo-polynomial.  Optimal when every size
    is a multiple of ``unit``; otherwise optimal for the rounded sizes.  Without ``unit``, when
    no plan fits at the coarse unit (rounding), units 16, 256, ... times finer are tried, and
    last the greatest common divisor of the sizes (exact; when ``budget / gcd <= 2**20``).
    A budget at or above the keep-all peak gives every layer ``keep``.

    Raises ``ValueError`` when the budget is below the smallest peak any plan reaches (every
    rank alike when ``comm`` is given: then collective, the ranks agree on the budget).
    ``bandwidth`` overrides the profile's."""
    L = profile.layers
    n = len(L)
    s = [int(lp.saved_bytes) for lp in L]
    a = [int(lp.input_bytes) for lp in L]
    o = [int(lp.output_bytes) for lp in L]
    f = [float(lp.forward_time) for lp in L]
    bw = profile.bandwidth if bandwidth is None else float(bandwidth)
    with collective(comm, "plan_memory", budget_bytes=budget_bytes, bandwidth=bandwidth,
                    allow_offload=allow_offload, allow_recompute=allow_recompute,
                    resolution=resolution, unit=unit):
        if not n:
            raise ValueError("plan_memory: the profile has no layers")
        if not (isinstance(budget_bytes, (int, float, np.integer, np.floating))
                and budget_bytes >= 0):
            raise ValueError(f"plan_memory: budget_bytes must be a number >= 0, got "
                             f"{budget_bytes!r}")
        if not bw > 0:
            raise ValueError(f"plan_memory: bandwidth must be > 0, got {bw}")
        budget = int(budget_bytes)
        every = _transient_bounds(s, o, allow_offload, allow_recompute)
        least = _min_peak(s, a, o, allow_offload, allow_recompute, every)
        cands = sorted(c for c in every if c <= budget)
        if budget < least:
            raise ValueError(f"plan_memory: a budget of {budget} bytes is below the smallest "
                             f"peak of saved bytes any plan reaches, {least} bytes (keep-all "
                             f"needs {sum(s)}; allow_offload={allow_offload}, "
                             f"allow_recompute={allow_recompute})")
    names = tuple(lp.name for lp in L)
    common = dict(names=names, budget=budget, keep_all_peak=sum(s), bandwidth=bw,
                  bandwidth_assumed=profile.bandwidth_assumed)
    if sum(s) <= budget:
        return MemoryPlan(("keep",) * n, peak=sum(s), added_time=0.0, unit=1, **common)
    off = [_offload_cost(profile, i, bw) for i in range(n)]
    exact = math.gcd(*s, *a, *o) or 1  # a unit dividing every size: no rounding
    units = [unit] if unit is not None else []
    if unit is None:  # coarse first; finer (down to the exact unit) if rounding bites
        u = max(1, math.ceil(budget / max(1, resolution)))
        while u > exact:
            units.append(u)
            u //= 16
        if budget // exact <= 1 << 20 or not units:
            units.append(exact)
    best = None
    for unit in units:
        for T in cands:
            cap = (budget - T) // unit
            res = _knapsack(s, a, o, f, off, T, cap, unit, allow_offload, allow_recompute)
            if res is not None and (best is None or res[0] < best[0]):
                best = res
        if best is not None:
            break
    if best is None:  # only the rounding of sizes up to units can get here
        raise ValueError(f"plan_memory: no plan fits {budget} bytes at a resolution of "
                         f"{unit} bytes (the exact minimum is {least}); pass a larger "
                         "resolution or unit=1")
    _, choices, segments = best
    peak, added = evaluate_plan(profile, choices, bw, segments)
    return MemoryPlan(choices, peak=peak, added_time=added, unit=unit, segments=segments,
                      **common)


def _knapsack(s, a, o, f, off, T, cap, unit, allow_off, allow_rec):
    """Least added time with every transient ``<= T`` and resident units ``<= cap``:
    ``(cost, choices, segments)`` or ``None``.  ``dp[i][r]``: least cost for layers ``< i``
    with ``r`` resident units; a step from ``i`` to ``k + 1`` keeps or offloads layer ``i``
    (``k = i``) or makes ``i..k`` one recompute segment."""
    if cap < 0:
        return None
    n = len(s)
    inf = math.inf
    C = cap + 1
    dp = [np.full(C, inf) for _ in range(n + 1)]
    bp = [np.zeros((C, 3), dtype=np.int64) for _ in range(n + 1)]  # from i, units, choice
    dp[0][0] = 0.0
    ws = [-(-x // unit) for x in s]
    wa = [-(-x // unit) for x in a]

    def relax(i, j, w, cost, code):
        if w >= C:
            return
        cand = np.full(C, inf)
        cand[w:] = dp[i][:C - w] + cost
        better = cand < dp[j]
        if better.any():
            dp[j][better] = cand[better]
            bp[j][better] = (i, w, code)

    for i in range(n):
        if not np.isfinite(dp[i]).any():
            continue
        relax(i, i + 1, ws[i], 0.0, 0)
        if allow_off and s[i] <= T:
            relax(i, i + 1, 0, off[i], 1)
        if allow_rec:
            tot, t = 0, 0.0
            for k in range(i, n):
                tot += s[k]
                t += f[k]
                if tot > T:
                    break
                if tot + o[k] <= T:
                    relax(i, k + 1, wa[i], t, 2)
    r = int(np.argmin(dp[n]))
    if not np.isfinite(dp[n][r]):
        return None
    cost = float(dp[n][r])
    choices, segments = [None] * n, []
    j = n
    while j > 0:
        i, w, code = (int(v) for v in bp[j][r])
        for k in range(i, j):
            choices[k] = CHOICES[code]
        if code == 2:
            segments.append((i, j))
        j, r = i, r - w
    return cost, tuple(choices), segments[::-1]
