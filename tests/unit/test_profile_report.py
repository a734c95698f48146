"""The step profiler's pure half (disttensor.core.profile_report): per-rank tables (exclusive
times, the python remainder, unfinished steps), the summary across ranks (means, slowest rank,
imbalance), and the Chrome Trace Event conversion and its checker."""
from __future__ import annotations

import json

import pytest

from disttensor.core import profile_report as R

MS = 1_000_000  # ns


def _ops():
    # (name, pass, t1, duration, {category: exclusive})
    return [("conv", "forward", 10 * MS, 6 * MS, {"kernel": 4 * MS, "pack": MS}),
            ("relu", "forward", 12 * MS, 2 * MS, {"kernel": MS}),
            ("conv", "backward", 20 * MS, 8 * MS, {"kernel": 5 * MS, "p2p wait": 2 * MS}),
            ("conv", "forward", 30 * MS, 4 * MS, {"kernel": 3 * MS}),
            ("late", "forward", 45 * MS, MS, {})]  # after the last step mark


def test_rank_table_exclusive_python_and_outside():
    t = R.rank_table(_ops(), end=40 * MS, steps=2, span=40 * MS)
    assert t["steps"] == 2 and t["span"] == 40 * MS
    assert t["order"] == [("conv", "forward"), ("relu", "forward"), ("conv", "backward"),
                          R.OUTSIDE]
    conv = t["rows"][("conv", "forward")]
    assert conv["calls"] == 2 and conv["total"] == 10 * MS
    assert conv["kernel"] == 7 * MS and conv["pack"] == MS
    assert conv["python"] == 10 * MS - 8 * MS
    for key in t["order"]:  # the categories of a row add up to its total
        row = t["rows"][key]
        assert sum(row[c] for c in R.CATEGORIES) == row["total"]
    assert t["rows"][R.OUTSIDE]["total"] == 40 * MS - (6 + 2 + 8 + 4) * MS
    assert ("late", "forward") not in t["rows"]


def _table(scale: float, steps: int = 2):
    ops = [(n, p, t1, int(d * scale), {c: int(v * scale) for c, v in cats.items()})
           for n, p, t1, d, cats in _ops()]
    return R.rank_table(ops, end=40 * MS, steps=steps, span=int(40 * MS * scale))


def test_summary_rows_mean_max_slowest_imbalance():
    rows = R.summary_rows([_table(1.0), _table(3.0)])
    conv = rows[0]
    assert (conv["op"], conv["pass"]) == ("conv", "forward")
    # per step: rank 0 5 ms, rank 1 15 ms
    assert conv["total"] == pytest.approx(10.0) and conv["max"] == pytest.approx(15.0)
    assert conv["slowest"] == 1 and conv["imbalance"] == pytest.approx(1.5)
    assert conv["kernel"] == pytest.approx((3.5 + 10.5) / 2)
    assert conv["calls"] == pytest.approx(1.0)
    names = [r["op"] for r in rows]
    assert names[-3:] == ["all ops", R.OUTSIDE[0], "step"]
    all_ops, outside, step = rows[-3:]
    assert all_ops["total"] == pytest.approx((10 + 30) / 2)  # (20 ms, 60 ms) / 2 steps
    assert step["total"] == pytest.approx((20 + 60) / 2)
    assert all_ops["total"] + outside["total"] == pytest.approx(step["total"])
    for c in R.CATEGORIES:
        assert all_ops[c] + outside[c] == pytest.approx(step[c])


def test_summary_rows_sort_by_time_and_missing_rows():
    a, b = _table(1.0), _table(1.0)
    del b["rows"][("relu", "forward")]
    b["order"].remove(("relu", "forward"))
    rows = R.summary_rows([a, b], sort="time")
    body = rows[:-3]
    assert [r["total"] for r in body] == sorted((r["total"] for r in body), reverse=True)
    relu = next(r for r in body if r["op"] == "relu")
    assert relu["slowest"] == 0 and relu["imbalance"] == pytest.approx(2.0)


def test_format_summary_is_a_table_of_every_row():
    text = R.format_summary([_table(1.0), _table(2.0)])
    lines = text.splitlines()
    assert "2 ranks, 2 steps" in lines[0]
    assert lines[1].split()[:3] == ["op", "pass", "calls"]
    assert any(line.startswith("conv") and "backward" in line for line in lines)
    assert lines[-1].startswith("step")
    assert R.format_summary([_table(1.0)], clock="cpu").splitlines()[0].count("CPU ms") == 1


def _records():
    ms = MS
    regions = [("kernel", "conv_forward", 2 * ms, 5 * ms, 2 * ms, 0, 0),
               ("alloc", "alloc", 3 * ms, 4 * ms, ms, 1, 0),
               ("p2p wait", "MPI_Waitall", 6 * ms, 7 * ms, ms, 0, 0)]
    ops = [("conv", "forward", ms, 8 * ms, {"kernel": 2 * ms})]
    return regions, ops, [0, 8 * ms, 16 * ms]


def test_chrome_events_units_lanes_and_metadata(tmp_path):
    regions, ops, marks = _records()
    ev = R.chrome_events(3, regions, ops, marks, origin=MS)
    meta = [e for e in ev if e["ph"] == "M"]
    assert {e["args"]["name"] for e in meta if e["name"] == "thread_name"} == {"steps", "ops"}
    assert [e["args"]["name"] for e in meta if e["name"] == "process_name"] == ["rank 3"]
    x = [e for e in ev if e["ph"] == "X"]
    assert all(e["pid"] == 3 for e in x)
    steps = [e for e in x if e["tid"] == 0]
    assert [(e["ts"], e["dur"]) for e in steps] == [(-1000.0, 8000.0), (7000.0, 8000.0)]
    conv = next(e for e in x if e["name"] == "conv")
    assert (conv["ts"], conv["dur"], conv["cat"]) == (0.0, 7000.0, "forward")
    alloc = next(e for e in x if e["name"] == "alloc")
    assert (alloc["ts"], alloc["dur"], alloc["cat"]) == (2000.0, 1000.0, "alloc")
    path = tmp_path / "t.json"
    R.write_trace(str(path), ev)
    doc = json.loads(path.read_text())
    R.check_trace(doc)
    assert len(doc["traceEvents"]) == len(ev)


def test_check_trace_rejects_overlap_and_bad_events():
    regions, ops, marks = _records()
    ev = R.chrome_events(0, regions, ops, marks, origin=0)
    bad = ev + [{"name": "straddle", "ph": "X", "pid": 0, "tid": 1, "ts": 4000.0,
                 "dur": 5000.0}]
    with pytest.raises(ValueError, match="overlaps"):
        R.check_trace({"traceEvents": bad})
    for e in ({"name": "b", "ph": "B", "pid": 0, "tid": 1, "ts": 0},
              {"name": "x", "ph": "X", "pid": "0", "tid": 1, "ts": 0, "dur": 1},
              {"name": "x", "ph": "X", "pid": 0, "tid": 1, "ts": 0, "dur": -1},
              {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1}):
        with pytest.raises(ValueError):
            R.check_trace({"traceEvents": [e]})
    with pytest.raises(ValueError):
        R.check_trace([])
    # touching ends (one event ends where the next begins) nest fine
    R.check_trace({"traceEvents": [
        {"name": "a", "ph": "X", "pid": 0, "tid": 1, "ts": 0.0, "dur": 2.0},
        {"name": "b", "ph": "X", "pid": 0, "tid": 1, "ts": 2.0, "dur": 2.0}]})
