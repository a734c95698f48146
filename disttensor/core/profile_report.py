"""The pure half of the step profiler (:mod:`disttensor.core.profiler`): per-rank tables,
the summary across ranks, and Chrome Trace Event conversion and checking.  No MPI.

Times in the records are integer nanoseconds; the summary shows milliseconds per step, the
traces microseconds (the Trace Event format's unit).
"""
from __future__ import annotations

import json
import os

__all__ = ["CATEGORIES", "rank_table", "format_summary", "chrome_events", "write_trace",
           "check_trace", "OUTSIDE"]

#: the categories of an op's time, in the order the summary shows them
CATEGORIES = ("kernel", "pack", "p2p wait", "collective", "agreement", "alloc", "python")
#: the summary's row of the time that lies in no op
OUTSIDE = ("(outside ops)", "")


def rank_table(ops, end: int, steps: int, span: int) -> dict:
    """One rank's figures from its op records ``(name, pass, t1, duration, {category:
    exclusive duration})`` (integer ns of one clock; ``t1``: the op's end in wall time).

    ``steps`` steps took ``span`` in all, ending at wall time ``end``: ops ending after it (an
    unfinished step) are left out.  Returns ``{"steps", "span", "order", "rows"}``:
    ``rows[(name, pass)]`` holds ``calls``, each category's exclusive time (``python``: the
    op's time not in any region) and ``total``; ``order`` lists the rows as first run; of
    ``span``, ``rows[OUTSIDE]`` lies in no op."""
    rows: dict = {}
    order: list = []
    in_ops = 0
    for name, pass_, t1, dur, cats in ops:
        if t1 > end:
            continue
        key = (name, pass_)
        row = rows.get(key)
        if row is None:
            row = rows[key] = {"calls": 0, "total": 0, **{c: 0 for c in CATEGORIES}}
            order.append(key)
        row["calls"] += 1
        row["total"] += dur
        charged = 0
        for c, ns in cats.items():
            row[c] += ns
            charged += ns
        row["python"] += dur - charged
        in_ops += dur
    outside = {"calls": 0, **{c: 0 for c in CATEGORIES}}
    outside["python"] = outside["total"] = span - in_ops
    rows[OUTSIDE] = outside
    order.append(OUTSIDE)
    return {"steps": steps, "span": span, "order": order, "rows": rows}


def _merged_order(tables) -> list:
    order, seen = [], set()
    for t in tables:
        for key in t["order"]:
            key = tuple(key)
            if key not in seen and key != OUTSIDE:
                seen.add(key)
                order.append(key)
    return order


def _stats(values) -> tuple[float, int, float]:
    """(max, rank of the max, max/mean) of per-rank values."""
    mx = max(values)
    slow = values.index(mx)
    mean = sum(values) / len(values)
    return mx, slow, (mx / mean if mean > 0 else 1.0)


def summary_rows(tables, sort: str = "order") -> list[dict]:
    """The summary's rows from every rank's :func:`rank_table` (in rank order): per row the
    mean over ranks of each category and of the total in ms per step, the max over ranks,
    the slowest rank and the imbalance max/mean; then the rows ``all ops``,
    ``(outside ops)`` and ``step`` (the whole profiled time per step)."""
    def per_rank(key, field):
        out = []
        for t in tables:
            row = t["rows"].get(key)
            scale = t["steps"] * (1 if field == "calls" else 1e6)
            out.append(0.0 if row is None else row[field] / scale)
        return out

    def make(name, pass_, fields_of):
        totals = fields_of("total")
        mx, slow, imb = _stats(totals)
        row = {"op": name, "pass": pass_, "calls": sum(fields_of("calls")) / len(tables)}
        for c in CATEGORIES:
            row[c] = sum(fields_of(c)) / len(tables)
        row.update(total=sum(totals) / len(tables), max=mx, slowest=slow, imbalance=imb)
        return row

    order = _merged_order(tables)
    rows = [make(n, p, lambda f, k=(n, p): per_rank(k, f)) for n, p in order]
    if sort == "time":
        rows.sort(key=lambda r: -r["total"])

    def all_ops(f):
        return [sum(row[f] for key, row in t["rows"].items() if tuple(key) != OUTSIDE)
                / t["steps"] / (1 if f == "calls" else 1e6) for t in tables]
    rows.append(make("all ops", "", all_ops))
    rows.append(make(OUTSIDE[0], "", lambda f: per_rank(OUTSIDE, f)))

    def step(f):
        if f == "calls":
            return [0.0] * len(tables)
        if f in ("total",):
            return [t["span"] / t["steps"] / 1e6 for t in tables]
        return [a + b for a, b in zip(all_ops(f), per_rank(OUTSIDE, f))]
    rows.append(make("step", "", step))
    return rows


def format_summary(tables, sort: str = "order", clock: str = "wall") -> str:
    """The summary table (text) of :func:`summary_rows`, with a header naming the ranks,
    steps and ``clock``."""
    rows = summary_rows(tables, sort)
    steps = tables[0]["steps"]
    head = ["op", "pass", "calls"] + list(CATEGORIES) + ["total", "max", "slowest", "max/mean"]
    body = []
    for r in rows:
        body.append([r["op"], r["pass"], f"{r['calls']:.0f}" if r["calls"] else ""]
                    + [f"{r[c]:.3f}" for c in CATEGORIES]
                    + [f"{r['total']:.3f}", f"{r['max']:.3f}", f"{r['slowest']}",
                       f"{r['imbalance']:.2f}"])
    widths = [max(len(head[i]), *(len(b[i]) for b in body)) for i in range(len(head))]

    def line(cells):
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    rule = "-" * len(line(head))
    what = "ms per step" if clock == "wall" else "CPU ms per step"
    out = [f"step profile: {len(tables)} rank{'s' if len(tables) > 1 else ''}, {steps} "
           f"step{'s' if steps > 1 else ''}; {what}, mean over ranks (max: the slowest "
           f"rank's; max/mean: imbalance)", line(head), rule]
    out += [line(b) for b in body[:-3]] + [rule] + [line(b) for b in body[-3:]]
    return "\n".join(out)


def chrome_events(rank: int, regions, ops, step_marks, origin: int) -> list[dict]:
    """Rank ``rank``'s records as Chrome Trace Event dicts: metadata naming the process
    (``rank r``) and its two lanes (tid 0 ``steps``, tid 1 ``ops``), one complete (``"X"``)
    event per step, op (category its pass) and region (category its category), ``ts`` and
    ``dur`` in microseconds from ``origin`` (ns)."""
    def us(t):
        return (t - origin) / 1000.0

    ev = [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
           "args": {"name": f"rank {rank}"}},
          {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
           "args": {"sort_index": rank}},
          {"name": "thread_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": "steps"}},
          {"name": "thread_name", "ph": "M", "pid": rank, "tid": 1, "args": {"name": "ops"}}]
    prev = None
    for k, t in enumerate(step_marks):
        if prev is not None:
            ev.append({"name": f"step {k}", "cat": "step", "ph": "X", "pid": rank, "tid": 0,
                       "ts": us(prev), "dur": (t - prev) / 1000.0})
        prev = t
    for name, pass_, t0, t1, cats in ops:
        ev.append({"name": name, "cat": pass_, "ph": "X", "pid": rank, "tid": 1,
                   "ts": us(t0), "dur": (t1 - t0) / 1000.0,
                   "args": {"pass": pass_, **{f"{c} us": ns / 1000.0 for c, ns in
                                               cats.items()}}})
    for cat, label, t0, t1, excl, *_ in regions:
        ev.append({"name": label, "cat": cat, "ph": "X", "pid": rank, "tid": 1,
                   "ts": us(t0), "dur": (t1 - t0) / 1000.0,
                   "args": {"exclusive us": excl / 1000.0}})
    return ev


def write_trace(path: str, events) -> None:
    """Write ``events`` as a Trace Event JSON object file (``{"traceEvents": [...]}``)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"traceEvents": list(events), "displayTimeUnit": "ms"}, f)
    os.replace(tmp, path)


_PHASES = {"X", "M"}


def check_trace(doc) -> None:
    """Raise ``ValueError`` unless ``doc`` (a loaded trace) is a Trace Event object whose
    events are metadata (``"M"``: ``process_name``/``thread_name``/``*_sort_index`` with
    ``args``) or complete events (``"X"``: string ``name``, integer ``pid``/``tid``, number
    ``ts`` and ``dur >= 0``), and whose complete events on each (pid, tid) lane nest
    properly (each one that starts inside another ends inside it)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError("a trace is an object with a traceEvents list")
    lanes: dict = {}
    for e in doc["traceEvents"]:
        ph = e.get("ph")
        if ph not in _PHASES:
            raise ValueError(f"unexpected phase {ph!r} in {e}")
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            raise ValueError(f"pid and tid must be integers: {e}")
        if not isinstance(e.get("name"), str):
            raise ValueError(f"name must be a string: {e}")
        if ph == "M":
            if e["name"] not in ("process_name", "thread_name", "process_sort_index",
                                 "thread_sort_index") or not isinstance(e.get("args"), dict):
                raise ValueError(f"bad metadata event {e}")
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or dur < 0:
            raise ValueError(f"complete events need numeric ts and dur >= 0: {e}")
        lanes.setdefault((e["pid"], e["tid"]), []).append((ts, -dur, e["name"]))
    eps = 1e-3  # the format's microseconds carry nanoseconds: allow rounding
    for lane, evs in lanes.items():
        evs.sort()
        stack: list = []
        for ts, mdur, name in evs:
            end = ts - mdur
            while stack and stack[-1][0] <= ts + eps:
                stack.pop()
            if stack and end > stack[-1][0] + eps:
                raise ValueError(f"event {name!r} at {ts} us on lane {lane} overlaps "
                                 f"{stack[-1][1]!r} without nesting in it")
            stack.append((end, name))
