"""bench/_timing.spin_before_sleep: the step benchmarks' spin budget for the MPICH idle-sleep
shim is set only where ranks do not outnumber cores and never over the caller's value."""
from __future__ import annotations

import os
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "bench")
sys.path.insert(0, BENCH)

import _timing  # noqa: E402

VAR = "DISTTENSOR_MPI_IDLE_SPIN_NS"
LAUNCHERS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_SIZE")


def _launched(monkeypatch, ranks, cores=2):
    monkeypatch.delenv(VAR, raising=False)
    for v in LAUNCHERS:
        monkeypatch.delenv(v, raising=False)
    if ranks is not None:
        monkeypatch.setenv("MPI_LOCALNRANKS", str(ranks))
    monkeypatch.setattr(os, "cpu_count", lambda: cores)


def test_budget_where_ranks_fit_the_cores(monkeypatch):
    for ranks in (None, 1, 2):  # (None: a single process, no launcher)
        _launched(monkeypatch, ranks)
        assert _timing.spin_before_sleep() == _timing.IDLE_SPIN_NS
        assert os.environ[VAR] == str(_timing.IDLE_SPIN_NS)
    _launched(monkeypatch, 2)
    assert _timing.spin_before_sleep(500_000) == 500_000 and os.environ[VAR] == "500000"


def test_no_budget_when_oversubscribed(monkeypatch):
    _launched(monkeypatch, 3)
    assert _timing.spin_before_sleep() == 0 and VAR not in os.environ
    _launched(monkeypatch, None)
    monkeypatch.setenv("PMI_SIZE", "4")  # another launcher's variable
    assert _timing.spin_before_sleep() == 0 and VAR not in os.environ


def test_the_callers_value_wins(monkeypatch):
    _launched(monkeypatch, 2)
    monkeypatch.setenv(VAR, "0")
    assert _timing.spin_before_sleep() == 0 and os.environ[VAR] == "0"
    monkeypatch.setenv(VAR, "123")
    assert _timing.spin_before_sleep() == 123
