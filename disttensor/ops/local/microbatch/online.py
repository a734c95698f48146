"""Tuning a convolution on its real calls (online tuning; per rank, no MPI).

Timing a large layer-pass apart from the work (even on a proxy) makes the first training
step pay for every candidate.  Online tuning instead runs each call of a not-yet-tuned
problem with one candidate ``(algorithm, micro_batch)`` of its short list and times it: the
first call runs the cost model's pick, each following call of the same problem (normally the
next steps) the next candidate, and once the list is exhausted the fastest division is
settled (:func:`.planner.settle`) and stored like a timed plan.  Every call computes its full,
correct result; the only extra work is running the slower candidates once each.

:func:`online_order` (pure) is the short list: the candidates the cost model puts within
:func:`~.settings.model_prefilter` of its best (:func:`.planner.prefilter`), best modelled
time per sample first, then the same candidates again in reverse order: every candidate is
timed twice and its faster run kept, because a candidate's first run pays one-off costs
(loading its compiled kernels into the process, growing the scratch buffers to its
micro-batch: measured 25 ms against 6.5 ms steady for a 32^3 layer), which ranked the best
algorithm last when each was timed once.  :func:`uniform_plan` (pure) is
the plan one call runs for a candidate.  :class:`OnlineTuner` holds one problem's progress.
"""
from __future__ import annotations

import math
import threading

from .planner import prefilter
from .problem import Plan
from .timing import model_times

__all__ = ["online_order", "uniform_plan", "OnlineTuner"]


def online_order(problem, algos: dict, fit: dict, factor: float) -> list:
    """The candidates ``(name, b)`` of ``fit`` to run, in order (see the module)."""
    kept = prefilter(problem, algos, fit, factor)
    model = model_times(problem, algos, kept)
    order = sorted(kept, key=lambda k: (model.get(k, math.inf) / k[1], -k[1], k[0]))
    if len(order) > 1:
        order += order[::-1]
    return order


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

    def __init__(self, batch: int, order: list):
        self.batch = int(batch)
        self.order = list(order)
        self.pos = 0
        self.times: dict = {}
        self.lock = threading.Lock()

    def next(self):
        return self.order[self.pos] if self.pos < len(self.order) else None

    def record(self, key, seconds: float) -> None:
        per_call = float(seconds) * key[1] / self.batch
        self.times[key] = min(self.times.get(key, math.inf), per_call)
        if self.pos < len(self.order) and self.order[self.pos] == key:
            self.pos += 1

    def fail(self, key) -> None:
        """Drop ``key`` (it raised): it is neither timed nor run again."""
        self.times.pop(key, None)
        self.order = self.order[:self.pos] + [k for k in self.order[self.pos:] if k != key]

    @property
    def done(self) -> bool:
        return self.pos >= len(self.order)
