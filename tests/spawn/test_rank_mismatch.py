"""Arguments that differ between ranks raise on every rank, in time, and never hang.

Each case of ``cases_*.py`` runs in its own ``mpiexec`` (2 and 3 ranks) under a timeout, so a
hang fails that case only.  Every rank must report that it raised the expected exception
within the case's limit (10 s by default: the time inside the case, start-up not counted), and
the job must end cleanly (a rank stuck in a collective would keep it from finalizing).

Plain pytest, no MPI launcher: run by ``scripts/test.sh`` as its own step.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.spawn.registry import load_all  # noqa: E402

CASES = load_all()
JOB_TIMEOUT = float(os.environ.get("DISTTENSOR_SPAWN_TIMEOUT", "60"))
LINE = re.compile(r"^CASE (\S+) rank=(\d+) outcome=(\S+) type=(\S+) secs=([\d.]+) msg=(.*)$")


def _mpiexec_env() -> list[str]:
    shim = ROOT / "build" / "libmpi_idle_sleep.so"
    if os.environ.get("DISTTENSOR_MPI_IDLE_SLEEP", "1") != "0" and shim.exists():
        return ["-genv", "LD_PRELOAD", str(shim)]
    return []


def _params():
    for name, c in sorted(CASES.items()):
        for n in c.nprocs:
            yield pytest.param(name, n, id=f"{name}-n{n}")


@pytest.mark.parametrize("name,nprocs", list(_params()))
def test_case_raises_on_every_rank(name, nprocs, tmp_path):
    c = CASES[name]
    if c.needs_even and nprocs % 2:
        pytest.skip("needs an even number of ranks")
    mpiexec = shutil.which("mpiexec")
    assert mpiexec, "mpiexec not found"
    env = dict(os.environ, DISTTENSOR_SPAWN_TMP=str(tmp_path), OMP_NUM_THREADS="1",
               NUMBA_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = ["timeout", "-k", "5", str(JOB_TIMEOUT), mpiexec, *_mpiexec_env(), "-n",
           str(nprocs), sys.executable, str(ROOT / "tests" / "spawn" / "run_case.py"), name]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    out = p.stdout + p.stderr
    assert p.returncode not in (124, 137), f"{name} hung (killed after {JOB_TIMEOUT} s):\n{out}"
    lines = {}
    for r in range(nprocs):
        f = tmp_path / f"result-rank{r}.txt"
        m = LINE.match(f.read_text().strip()) if f.exists() else None
        if m:
            lines[int(m.group(2))] = m.groups()
    missing = sorted(set(range(nprocs)) - set(lines))
    assert not missing, f"ranks {missing} reported nothing (exit {p.returncode}):\n{out}"
    for r, (_, _, outcome, typ, secs, msg) in sorted(lines.items()):
        assert outcome == "raised", f"rank {r}: {outcome} {typ}: {msg}\n{out}"
        assert float(secs) <= c.limit, f"rank {r} took {secs} s (limit {c.limit} s)"
    types = {t for _, _, _, t, _, _ in lines.values()}
    assert len(types) == 1, f"ranks raised different exception types {types}:\n{out}"
    assert p.returncode == 0, f"exit code {p.returncode}:\n{out}"
