"""The planner's pure parts: dividing a mini-batch and dividing a workspace budget.

* :func:`candidate_sizes`: the micro-batch sizes a policy tries;
* :func:`optimal_division`: the dynamic program ``T(0) = 0``, ``T(n) = min over (a, b), b <=
  n, of T(n - b) + t(a, b)`` (time adds, the workspace is the largest part's; ties go to
  fewer micro-batches);
* :func:`choose_division`: the same with a hysteresis in favour of the undivided plan
  (measured times: noise must not buy extra calls);
* :func:`pareto_front` and :func:`divide_workspace`: the whole-network workspace division
  (mu-cuDNN's WD), an exact multiple-choice knapsack over Pareto frontiers of partial sums.

Pure functions of their arguments: no timing, no state, no MPI.
"""
from __future__ import annotations

import math

from .settings import POLICIES, UNDIVIDED_MARGIN

__all__ = ["candidate_sizes", "optimal_division", "choose_division", "pareto_front",
           "divide_workspace"]


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
