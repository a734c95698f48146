"""Tuning once, not once per shape and rank: reusing a tuned plan for a similar problem, and
one timing and one plan per problem family among the processes that share a plan cache (per
rank, no MPI).

**The reuse rule** (:func:`nearest_similar`).  A problem is *similar* to a tuned one when
everything the plan is keyed on is the same (machine and software fingerprint, pass, batch,
channels, kernel, stride, dilation, groups, dtype, workspace limit, policy, algorithms) except
the spatial extents and the explicit pads (where the limit follows the relative rule,
``limit_rule`` in the key, the rule must be the same, not its value), and every spatial extent is within a factor
:func:`~.settings.similar_factor` (default 2) of the tuned one's.  Of the similar tuned
problems the nearest (smallest sum of ``|log2|`` extent ratios) is taken; its plan is reused
when every micro-batch it names is still a candidate whose workspace fits the limit on the new
shape (otherwise the problem is timed).  So the blocks of a spatially split sample (each
extent halved, the pads of the boundary ranks differing) reuse the plan tuned on one rank, and
a 2x2 split reuses it too; a plan reused is kept in memory, never written to disk, so the disk
holds timed plans only and reuse never chains away from a measurement.

**One timing per family** (:func:`family_lock`).  The processes of a job on one node start
their first step together and would all time the same candidates at once (on shared cores,
each timing disturbed by the others).  Before timing, a process takes an exclusive lock
(``fcntl.flock``) on a file named after the problem's *family* (the fields above without the
spatial extents and pads) in the plan-cache directory and re-reads the disk cache: finding
the plan (or a similar one) a peer stored, it times nothing.  The lock guards only local
timing (no communication inside), is released when the timing ends or the process dies, and
is skipped (each process times for itself) where the directory cannot be written or does not
support locks.

**One plan per family** (:func:`.planner.store_plan`).  A problem tuned on its real calls
(:mod:`.online`) is timed by every rank that runs it, each on its own calls.  A process that
settles takes the same lock, re-reads the cache and, if a peer stored a plan for the problem
or a similar one meanwhile, keeps that plan instead of its own choice (and writes nothing).
So the ranks of a job that share the plan-cache directory run one plan per layer, the first
stored, whatever their own timings said (a rank running a slower plan than its peers makes
them wait at every collective of the step).  Nothing here is collective (a collective inside
the planner could not be agreed: a rank with an empty block never reaches it, and ranks
settle at different calls); processes with separate cache directories (other nodes' local
disks) still choose independently, and ranks that choose differently compute results that
agree to rounding.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from pathlib import Path

__all__ = ["family_of", "spatial_distance", "nearest_similar", "family_lock"]


def family_of(fields: dict) -> dict:
    """``fields`` (the plan-cache key fields) without the spatial extents and pads."""
    prob = dict(fields["problem"])
    x = list(prob.pop("x_shape"))
    prob.pop("pad_lo", None)
    prob.pop("pad_hi", None)
    prob["x_lead"] = x[:2]
    prob["ndim"] = len(x)
    out = {k: v for k, v in fields.items() if k != "problem"}
    if "limit_rule" in out:  # a relative limit: the rule is shared, its value scales
        out.pop("limit", None)
    out["problem"] = prob
    return json.loads(json.dumps(out, sort_keys=True, default=list))


def spatial_distance(a, b, factor: float) -> float | None:
    """Sum of ``|log2(a_i / b_i)|`` over the spatial extents (``a``, ``b`` full ``x_shape`` s),
    or None when an extent differs by more than ``factor`` (or the ranks differ)."""
    a, b = [int(v) for v in a[2:]], [int(v) for v in b[2:]]
    if len(a) != len(b) or min(a + b, default=1) < 1:
        return None
    d = 0.0
    for p, q in zip(a, b):
        r = abs(math.log2(p / q))
        if r > math.log2(factor) + 1e-12:
            return None
        d += r
    return d


def nearest_similar(fields: dict, entries, factor: float):
    """The stored plan (JSON) of the nearest similar problem among ``entries`` (plan-cache
    entries ``{"key": fields, "plan": ...}``), or None.  Ties go to the first entry."""
    if factor < 1:
        return None
    fam = family_of(fields)
    x = fields["problem"]["x_shape"]
    best, best_d = None, math.inf
    for e in entries:
        try:
            key = e["key"]
            if family_of(key) != fam:
                continue
            d = spatial_distance(x, key["problem"]["x_shape"], factor)
        except (KeyError, TypeError, ValueError):
            continue
        if d is not None and d < best_d:
            best, best_d = e.get("plan"), d
    return best


@contextlib.contextmanager
def family_lock(directory: Path, fields: dict):
    """Hold an exclusive lock named after ``fields``' family in ``directory`` (see the
    module); yields whether this process had to wait for another holder."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield False
        return
    name = hashlib.sha256(json.dumps(family_of(fields), sort_keys=True).encode()).hexdigest()
    fd = None
    try:
        lockdir = Path(directory) / "locks"
        lockdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lockdir / f"{name[:32]}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        fd = None
    if fd is None:
        yield False
        return
    waited = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = True
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            os.close(fd)
            fd = None
            yield False
            return
        yield waited
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock
