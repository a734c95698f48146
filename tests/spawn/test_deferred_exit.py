"""A script that ends right after an elementwise call which one rank had to agree (its operand
was laid out differently) while the others deferred it: the job must end with
ArgumentMismatchError on every rank (the ranks that deferred agree their pending calls at exit,
meeting the waiting rank), not hang in MPI_Finalize; a correct script that ends with deferred
calls pending exits 0."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spawn.test_rank_mismatch import JOB_TIMEOUT, _mpiexec_env

ROOT = Path(__file__).resolve().parents[2]

MISMATCH = """
import disttensor as dt
from mpi4py import MPI
r, n = MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size
a = dt.ones((2 * n, 4))
by_rows, by_cols = a.copy(), a.redistribute(split=(None, 0))
c = a + (by_cols if r == n - 1 else by_rows)
print(f"rank {r} returned", flush=True)
"""

CORRECT = """
import disttensor as dt
from mpi4py import MPI
a = dt.ones((8, 4))
b = (a + 1.0) * a
print(f"rank {MPI.COMM_WORLD.rank} returned", flush=True)
"""


def _run(code, n, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    env.pop("DISTTENSOR_AGREEMENT", None)
    cmd = ["timeout", "-k", "5", str(JOB_TIMEOUT), shutil.which("mpiexec"), *_mpiexec_env(),
           "-n", str(n), sys.executable, str(script)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)


@pytest.mark.parametrize("n", [2, 3])
def test_mismatch_at_exit_raises_instead_of_hanging(tmp_path, n):
    p = _run(MISMATCH, n, tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode not in (0, 124, 137), out
    assert out.count("ArgumentMismatchError: add: arguments differ") >= 2, out


def test_correct_script_with_pending_calls_exits_cleanly(tmp_path):
    p = _run(CORRECT, 2, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rank 0 returned" in p.stdout and "rank 1 returned" in p.stdout
