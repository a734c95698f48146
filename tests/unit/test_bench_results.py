"""bench/_results.py (the CSV every benchmark appends to) and bench/run_all.py's target
summary: the figures a closing note quotes go through these, so they are tested like code."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "bench")
sys.path.insert(0, BENCH)

import _results  # noqa: E402
import run_all  # noqa: E402


def test_record_is_a_no_op_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("DISTTENSOR_BENCH_CSV", raising=False)
    monkeypatch.chdir(tmp_path)
    _results.record("x", "c", "m", 1.0)
    assert os.listdir(tmp_path) == []


def test_record_round_trip_header_once_and_rank_zero_only(tmp_path, monkeypatch):
    path = tmp_path / "r.csv"
    monkeypatch.setenv("DISTTENSOR_BENCH_CSV", str(path))
    _results.record("halo", "face 1 MiB", "ratio_vs_sendrecv", 1.1234567, "x", target=1.2,
                    better="lower", ranks=2)
    _results.record("halo", "face 1 MiB", "ratio_vs_sendrecv", 9.0, "x", rank=1)  # dropped
    _results.record("conv", "32->64", "torch_over_ours", 0.5, "x", target=1.0, device="gpu")
    text = path.read_text().splitlines()
    assert text[0].split(",") == list(_results.FIELDS)
    assert len(text) == 3
    rows = _results.read(str(path))
    assert rows[0]["value"] == pytest.approx(1.12346) and rows[0]["target"] == 1.2
    assert rows[0]["ranks"] == 2 and rows[0]["better"] == "lower"
    assert rows[1]["device"] == "gpu" and rows[1]["ranks"] == 1
    with pytest.raises(ValueError, match="better"):
        _results.record("a", "b", "c", 1.0, better="bigger")


@pytest.mark.parametrize("value,target,better,met", [
    (1.3, 1.2, "lower", False), (1.2, 1.2, "lower", True), (0.9, 0.9, "higher", True),
    (0.89, 0.9, "higher", False), (2.0, 1.0, "higher", True)])
def test_targets_are_judged_on_the_right_side(value, target, better, met):
    assert run_all._meets({"value": value, "target": target, "better": better}) is met


def test_summary_counts_targets_and_marks_misses(tmp_path):
    rows = [{"bench": "halo", "case": "a", "metric": "r", "value": 1.5, "unit": "x",
             "target": 1.2, "better": "lower", "ranks": 2, "device": "cpu"},
            {"bench": "scaling", "case": "b", "metric": "efficiency", "value": 0.95,
             "unit": "fraction", "target": 0.9, "better": "higher", "ranks": 2,
             "device": "cpu"},
            {"bench": "fft", "case": "c", "metric": "x", "value": 2.0, "unit": "x",
             "target": None, "better": "higher", "ranks": 2, "device": "cpu"}]

    class A:
        full = False
        gpu = False
    text = run_all._summary(rows, [("halo", 2, "ok", 3.0), ("x", 4, "timeout", 420.0)], [],
                            str(tmp_path), A())
    assert "1 of 2 targeted figures meet their target; 3 figures in all" in text
    assert "| halo | a | r | 2 | cpu | 1.5 x | <= 1.2 | **no** |" in text
    assert "| x | 4 | timeout | 420 |" in text
    assert (tmp_path / "summary.md").read_text() == text


def test_runner_lists_jobs_and_refuses_unknown_names():
    py = sys.executable
    out = subprocess.run([py, os.path.join(BENCH, "run_all.py"), "--list"], check=True,
                         capture_output=True, text=True).stdout
    for j in run_all.JOBS:
        assert j.name in out
    bad = subprocess.run([py, os.path.join(BENCH, "run_all.py"), "--only", "nope"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown job" in bad.stderr
