"""The disttensor pytest plugin (``pytest_disttensor.py``), end to end: each test
runs pytest on a small case file of ``plugin_cases/`` in its own process, under ``mpiexec``
where it says so, every process under ``timeout``.

A failure on one rank fails the whole run on every rank; a deadlock becomes a clean abort with
a report from every rank within the per-test timeout; plain pytest launches tests marked
``@pytest.mark.mpi(n=...)`` in their own ``mpiexec``; too few ranks and malformed marks are
refused with a clear message; a session without MPI and without marks is left alone.

Plain pytest, no MPI launcher: run by ``scripts/test.sh`` as part of ``tests/spawn``.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parent / "plugin_cases"
sys.path.insert(0, str(ROOT))
from tests.spawn.test_rank_mismatch import _mpiexec_env  # noqa: E402

JOB_TIMEOUT = 60  # seconds per process; each case takes a few


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MPI_LOCALNRANKS", "PYTEST_"))}
    env.update(OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               DISTTENSOR_MPIEXEC_ARGS=shlex.join(_mpiexec_env()), **extra)
    return env


def _pytest(case: str, tmp_path: Path, *args: str, nprocs: int | None = None, **env):
    """pytest on ``plugin_cases/<case>`` (under ``mpiexec -n nprocs`` when given); returns the
    completed process (stdout and stderr together) and the seconds it took."""
    cmd = [sys.executable, "-m", "pytest", str(CASES / case), "-q", "-p", "no:cacheprovider",
           f"--basetemp={tmp_path / 'base'}", *args]
    if nprocs is not None:
        cmd = [shutil.which("mpiexec"), *_mpiexec_env(), "-n", str(nprocs),
               *cmd, f"--mpi-log-dir={tmp_path / 'logs'}"]
    t0 = time.monotonic()
    p = subprocess.run(["timeout", "-k", "5", str(JOB_TIMEOUT), *cmd], cwd=ROOT, env=_env(**env),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p, time.monotonic() - t0


@pytest.mark.parametrize("n", [2, 3])
def test_failure_on_one_rank_fails_the_run_on_every_rank(n, tmp_path):
    p, _ = _pytest("case_one_rank_fails.py", tmp_path, nprocs=n)
    out = p.stdout
    assert p.returncode == 1, out
    # rank 0 reports the other rank's failure; the ranks stayed in step for the next test
    assert f"call failed on rank(s) [{n - 1}] (passed on this rank 0)" in out, out
    assert re.search(r"^1 failed, 1 passed", out, re.M), out
    for r in range(1, n):  # every other rank's log is shown, with its own verdict
        assert re.search(rf"^\[rank {r}\] 1 failed, 1 passed", out, re.M), out
    assert f"[rank {n - 1}] E       AssertionError: deliberate failure on rank {n - 1}" in out
    codes = ", ".join(f"{r}: 1" for r in range(n))
    assert f"mpi: n={n}: pytest exit codes by rank {{{codes}}} -> exit 1" in out, out


def test_exit_code_is_collective_even_without_outcome_sync(tmp_path):
    result = tmp_path / "result.json"  # rank 0 writes its session's exit code there
    p, _ = _pytest("case_one_rank_fails.py", tmp_path, nprocs=2, DISTTENSOR_SYNC_OUTCOMES="0",
                   DISTTENSOR_PYTEST_RESULT=str(result))
    assert re.search(r"^2 passed", p.stdout, re.M), p.stdout  # rank 0 saw no failure ...
    assert json.loads(result.read_text())["exitstatus"] == 1, p.stdout  # ... and exits 1
    assert p.returncode == 1, p.stdout
    assert "mpi: n=2: pytest exit codes by rank {1: 1} -> exit 1" in p.stdout, p.stdout


def test_deadlock_aborts_within_the_timeout_with_a_report_per_rank(tmp_path):
    p, secs = _pytest("case_deadlock.py", tmp_path, "--mpi-test-timeout=3", nprocs=2)
    out = p.stdout
    assert p.returncode == 87, out  # TIMEOUT_EXIT_CODE, not the outer timeout's 124
    assert secs < 30, out
    assert "case_deadlock.py::test_last_rank_skips_the_sum ran past the per-test timeout " \
           "of 3 s" in out, out
    # rank 0 waits in the sum's all-reduce, the last rank (which skipped it) at the end of
    # the test; each says so, with its stack
    assert re.search(r"^\[rank 0\] waiting [\d.]+ s in MPI_Allreduce .* inside sum\(", out,
                     re.M), out
    assert re.search(r"^\[rank 0\] .*case_deadlock.py\", line \d+ in test_last_rank", out,
                     re.M), out
    assert "[rank 1] waiting for the other ranks to finish call of" in out, out
    assert "[rank 1] not waiting in a disttensor collective" in out, out


def test_plain_pytest_launches_marked_tests_in_their_own_mpiexec(tmp_path):
    p, _ = _pytest("case_marked.py", tmp_path, "-k", "serial or pass or one_or_two", "-rA")
    out = p.stdout
    assert p.returncode == 0, out
    assert re.search(r"^3 passed, 2 deselected", out, re.M), out
    # the marked tests ran in 2-rank jobs: each rank had its own tmp_path
    for r in range(2):
        assert len(list((tmp_path / "base").glob(f"mpi-launch*/n2/tmp/rank{r}/*/ok"))) == 2


def test_plain_pytest_reports_a_failure_in_the_launched_job(tmp_path):
    p, _ = _pytest("case_marked.py", tmp_path, "-k", "fail_on_rank_1")
    out = p.stdout
    assert p.returncode == 1, out
    assert re.search(r"^1 failed, 4 deselected", out, re.M), out
    assert "mpiexec -n 2:" in out and "failed (exit code 1)" in out, out
    assert "call failed on rank(s) [1] (passed on this rank 0)" in out, out
    assert "[rank 1] E       AssertionError: deliberate failure on rank 1" in out, out


def test_too_few_ranks_are_refused_with_a_clear_message(tmp_path):
    p, _ = _pytest("case_marked.py", tmp_path, "-k", "needs_three", nprocs=2)
    out = p.stdout
    assert p.returncode == 1, out
    assert "needs 3 MPI ranks (@pytest.mark.mpi(n=...)) but this job has 2: run it under " \
           "mpiexec -n 3" in out, out
    assert "1 error" in out, out
    # a bigger job skips a test written for fewer ranks
    p, _ = _pytest("case_marked.py", tmp_path, "-k", "two_ranks_pass", "-rs", nprocs=3)
    assert p.returncode == 0 and "needs 2 MPI ranks, this job has 3" in p.stdout, p.stdout


def test_malformed_mark_is_a_usage_error(tmp_path):
    p, _ = _pytest("case_bad_mark.py", tmp_path)
    assert p.returncode == 4, p.stdout
    assert "@pytest.mark.mpi(n=...) takes a positive int or a non-empty list of them, got " \
           "n=0" in p.stdout, p.stdout


def test_inert_in_a_plain_session_without_marks(tmp_path):
    """Same outcomes, exit code, cache and temporary directories with and without it."""
    runs = {}
    for label, args in (("on", []), ("off", ["-p", "no:disttensor"])):
        cache = tmp_path / f"cache-{label}"
        cmd = [sys.executable, "-m", "pytest", str(CASES / "case_plain.py"), "-q", "-s",
               "-o", f"cache_dir={cache}", *args]
        p = subprocess.run(["timeout", "-k", "5", str(JOB_TIMEOUT), *cmd], cwd=ROOT,
                           env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        assert (cache / "v" / "cache" / "lastfailed").exists(), p.stdout  # cache still on
        tmp = re.search(r"^TMP (\S+)", p.stdout, re.M).group(1)
        assert "pytest-mpi" not in tmp and re.search(r"/pytest-\d+/", tmp), p.stdout
        summary = re.search(r"^(\d+ failed.*) in [\d.]+s", p.stdout, re.M).group(1)
        runs[label] = (p.returncode, summary)
    assert runs["on"] == runs["off"] == (1, "1 failed, 1 passed, 1 skipped"), runs
    p = subprocess.run([sys.executable, "-m", "pytest", "--help"], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert "--mpi-test-timeout" in p.stdout  # the plugin was loaded (entry point) above
