"""``DISTTENSOR_COLLECTIVE_TIMEOUT`` turns a deliberate deadlock into an abort with a report
from every rank (plain pytest; launches its own ``mpiexec``)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.spawn.test_rank_mismatch import _mpiexec_env  # noqa: E402


def _run(scenario: str, n: int, timeout: float = 2.0):
    env = dict(os.environ, DISTTENSOR_COLLECTIVE_TIMEOUT=str(timeout),
               DISTTENSOR_WATCHDOG_GRACE="1", OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    cmd = ["timeout", "-k", "5", "90", shutil.which("mpiexec"), *_mpiexec_env(), "-n", str(n),
           sys.executable, str(ROOT / "tests" / "spawn" / "watchdog_deadlock.py"), scenario]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    return p, time.monotonic() - t0


@pytest.mark.parametrize("n", [2, 3])
def test_deadlock_between_two_communicators_aborts_with_reports(n):
    p, secs = _run("two-comms", n)
    out = p.stdout + p.stderr
    assert p.returncode not in (0, 124 + 128, 137) and "returned" not in p.stdout, out
    assert "timed out" not in out and secs < 80, out
    for r in range(n):
        assert f"rank {r} ready" in p.stdout, out
        # every rank says where it waits: an all-reduce inside the sum, with its arguments
        assert f"rank {r}: waiting" in p.stderr, out
    assert "exceeded 2 s (DISTTENSOR_COLLECTIVE_TIMEOUT)" in p.stderr, out
    assert "inside sum(" in p.stderr or "inside " in p.stderr, out
    assert "DistArray(shape=" in p.stderr, out


def test_wait_outside_the_library_is_reported_as_such():
    p, _ = _run("user-barrier", 2)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "returned" not in p.stdout, out
    assert "rank 0: waiting" in p.stderr, out
    assert "rank 1: not waiting in a disttensor collective" in p.stderr, out
