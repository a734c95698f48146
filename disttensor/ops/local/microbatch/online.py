"""Tuning a convolution on its real calls (online tuning; per rank, no MPI).

Timing a large layer-pass apart from the work (even on a proxy) makes the first training
step pay for every candidate.  Online tuning instead runs each call of a not-yet-tuned
problem with one candidate ``(algorithm, micro_batch)`` of its short list and times it: the
first call runs the cost model's pick, each following call of the same problem (normally the
next steps) the next candidate, and once the list is exhausted the fastest division is
settled (:func:`.planner.settle`) and stored like a timed plan, unless a process sharing the
plan cache stored a plan for the problem (or a similar one) first: that one is kept
(:func:`.planner.store_plan`), so the ranks of a layer run one plan.  Every call computes its full,
correct result; the only extra work is running the slower candidates once each.

:func:`online_order` (pure) is the short list: the candidates the cost model puts within
:func:`~.settings.model_prefilter` of its best (:func:`.planner.prefilter`), best modelled
time per sample first.  Once every candidate ran, those whose time is within
:data:`AGAIN` of the best run a second time, in reverse order, and the faster run of each is
kept: a candidate's first run pays one-off costs (loading its compiled kernels into the
process, growing the scratch buffers to its micro-batch: measured 25 ms against 6.5 ms
steady for a 32^3 layer), which ranked the best algorithm last when each ran once.  The
candidates that may have paid them (:func:`fresh_runs`: the first run of an algorithm, and
any run of a larger micro-batch than that algorithm ran before) run again whatever their
first time: the problem's first call also pays its own one-offs (first-touch of new shapes,
compiling), 18 ms against 2.5 ms steady for a 16^3 CosmoFlow layer, more than :data:`AGAIN`
times the best, so the undivided plan that ran first was never timed in steady state.  If
two or more candidates are then within :data:`CLOSE` of the best, those run a third time:
between them a single run's noise decides.  :func:`uniform_plan` (pure) is
the plan one call runs for a candidate.  :class:`OnlineTuner` holds one problem's progress.
"""
from __future__ import annotations

import math
import threading

from .planner import prefilter
from .problem import Plan
from .timing import model_times

__all__ = ["online_order", "uniform_plan", "fresh_runs", "OnlineTuner", "AGAIN", "CLOSE"]

#: candidates whose first time is within this factor of the best first time run again
AGAIN = 1.5
#: after the second round, candidates within ``1 + CLOSE`` of the best run a third time
CLOSE = 0.10


def online_order(problem, algos: dict, fit: dict, factor: float) -> list:
    """The candidates ``(name, b)`` of ``fit`` to run, in order (see the module)."""
    kept = prefilter(problem, algos, fit, factor)
    model = model_times(problem, algos, kept)
    order = sorted(kept, key=lambda k: (model.get(k, math.inf) / k[1], -k[1], k[0]))
    return order


def fresh_runs(order) -> set:
    """The candidates of ``order`` whose first run may pay one-off costs (pure): each
    ``(name, b)`` that no earlier candidate of the same algorithm with a micro-batch of at
    least ``b`` precedes (the algorithm's first run loads its kernels; a larger micro-batch
    than before grows its scratch)."""
    most: dict = {}
    fresh = set()
    for name, b in order:
        if b > most.get(name, 0):
            fresh.add((name, b))
            most[name] = b
    return fresh


def uniform_plan(batch: int, key, workspace: int) -> Plan:
    """The plan running candidate ``key = (name, b)`` over ``batch`` samples: ``batch // b``
    micro-batches of ``b`` and the remainder, if any, with the same algorithm."""
    name, b = key
    b = max(1, min(int(b), batch))
    parts = [(name, b)] * (batch // b)
    if batch % b:
        parts.append((name, batch % b))
    return Plan(tuple(parts), 0.0, int(workspace), "online tuning")


class OnlineTuner:
    """One problem's online tuning: :meth:`next` is the candidate the coming call runs (None
    when done), :meth:`record` its measured seconds for the whole batch; :attr:`times` the
    seconds per call of ``b`` samples (``record``'s time times ``b / batch``, the minimum of
    repeated runs)."""

    def __init__(self, batch: int, order: list, again: float = AGAIN, close: float = CLOSE):
        self.batch = int(batch)
        self.order = list(order)
        self.pos = 0
        self.times: dict = {}
        self.lock = threading.Lock()
        self._again = float(again) if len(self.order) > 1 else 0.0   # 0: no second round
        self._close = float(close) if len(self.order) > 1 else 0.0   # 0: no third round
        self._fresh = fresh_runs(self.order)
        self._first = list(self.order)

    def next(self):
        return self.order[self.pos] if self.pos < len(self.order) else None

    def record(self, key, seconds: float) -> None:
        per_call = float(seconds) * key[1] / self.batch
        self.times[key] = min(self.times.get(key, math.inf), per_call)
        if self.pos < len(self.order) and self.order[self.pos] == key:
            self.pos += 1
        self._next_round()

    def fail(self, key) -> None:
        """Drop ``key`` (it raised): it is neither timed nor run again."""
        self.times.pop(key, None)
        self.order = self.order[:self.pos] + [k for k in self.order[self.pos:] if k != key]
        self._first = [k for k in self._first if k != key]
        self._next_round()

    def _next_round(self) -> None:
        """At the end of the first round, queue once more, in reverse order, the candidates
        within ``again`` of the best time per sample and those whose first run may have paid
        one-off costs (:func:`fresh_runs`), whatever their time.  At the end of the second,
        if two or more candidates are within ``1 + close`` of the best, run those once more
        in the first round's order (the choice between them is where noise decides)."""
        if self.pos < len(self.order) or not self.times:
            return
        per = {k: t / k[1] for k, t in self.times.items()}
        best = min(per.values())
        if self._again > 0:
            self.order += [k for k in reversed(self._first) if k in per
                           and (per[k] <= self._again * best or k in self._fresh)]
            self._again = 0.0
        elif self._close > 0:
            near = [k for k in self._first if k in per and per[k] <= (1 + self._close) * best]
            if len(near) > 1:
                self.order += near
            self._close = 0.0

    @property
    def done(self) -> bool:
        return self.pos >= len(self.order)
