"""Launcher mode of the disttensor pytest plugin: in a plain pytest session, a test marked
``@pytest.mark.mpi(n=K)`` (K > 1, or a list of rank counts) runs in its own
``mpiexec -n K python -m pytest <node id>``, one job per rank count, one after another.

The job runs under a timeout (the per-test timeout, else :data:`DEFAULT_TEST_TIMEOUT`, plus
:data:`STARTUP_SLACK` seconds), in the rootdir, with the same ini file; the test passes if it
passed in every job, is skipped if a job skipped it, and fails otherwise, with the job's output
(rank 0's report and the logs of the ranks that failed) as the failure text.  ``mpiexec`` is
``--mpiexec`` or the one on ``PATH``; ``DISTTENSOR_MPIEXEC_ARGS`` adds launcher arguments
(split like a shell command line, e.g. ``-genv LD_PRELOAD /path/lib.so``).  The test's
fixtures are set up only in the launched job, not in the plain session.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

from pytest_disttensor import LAUNCHER_ENV, RESULT_ENV, per_test_timeout

DEFAULT_TEST_TIMEOUT = 300.0
STARTUP_SLACK = 60.0


class LaunchFailed(Exception):
    """The launched job failed; the message is the whole report."""


@lru_cache(maxsize=8)
def _is_open_mpi(mpiexec: str) -> bool:
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Open MPI" in out or "OpenRTE" in out


def _run(cmd: list[str], cwd: Path, env: dict, timeout: float) -> tuple[int | None, str]:
    """Run ``cmd`` in a session of its own; kill the whole group after ``timeout`` s.
    Returns (exit code or None when killed, combined output)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out.decode(errors="replace")
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a grandchild keeps the pipe open
            out = b""
        return None, out.decode(errors="replace")


class MpiLaunchItem(pytest.Item):
    """Stands in for a test marked ``@pytest.mark.mpi(n=...)`` in a plain session (same node
    id, markers and location) and runs it in its own ``mpiexec`` job per rank count."""

    def __init__(self, *, nprocs: tuple[int, ...], location, **kwargs):
        super().__init__(**kwargs)
        self.nprocs = nprocs
        self._location = location

    @classmethod
    def replacing(cls, item: pytest.Item, nprocs: tuple[int, ...]) -> MpiLaunchItem:
        new = cls.from_parent(item.parent, name=item.name, nodeid=item.nodeid, path=item.path,
                              nprocs=nprocs, location=item.reportinfo())
        new.own_markers = list(item.own_markers)
        new.keywords.update(item.keywords)
        return new

    def reportinfo(self):
        return self._location

    def _command(self, n: int, workdir: Path, seconds: float) -> list[str]:
        config = self.config
        mpiexec = config.getoption("mpiexec", None) or shutil.which("mpiexec")
        if not mpiexec:
            raise LaunchFailed(f"{self.nodeid} needs {n} MPI ranks (@pytest.mark.mpi) but no "
                               "mpiexec was found on PATH; install an MPI or pass --mpiexec")
        extra = shlex.split(os.environ.get("DISTTENSOR_MPIEXEC_ARGS", ""))
        if _is_open_mpi(mpiexec):
            extra.append("--oversubscribe")
        cmd = [mpiexec, *extra, "-n", str(n), sys.executable, "-m", "pytest", self.nodeid,
               "-q", "-p", "no:cacheprovider", f"--rootdir={config.rootpath}",
               f"--mpi-test-timeout={seconds:g}", f"--basetemp={workdir / 'tmp'}",
               f"--mpi-log-dir={workdir / 'logs'}"]
        if config.inipath is not None:
            cmd += ["-c", str(config.inipath)]
        if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
            cmd += ["-p", "pytest_disttensor"]
        return cmd

    def runtest(self) -> None:
        seconds = per_test_timeout(self.config) or DEFAULT_TEST_TIMEOUT
        factory = getattr(self.config, "_tmp_path_factory", None)  # what tmp_path uses
        base = (factory.mktemp("mpi-launch", numbered=True) if factory is not None
                else Path(tempfile.mkdtemp(prefix="mpi-launch-")))
        env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
        skipped = []
        for n in self.nprocs:
            workdir = base / f"n{n}"
            workdir.mkdir()
            (workdir / "logs").mkdir()
            result_file = workdir / "result.json"
            cmd = self._command(n, workdir, seconds)
            rc, out = _run(cmd, self.config.rootpath, dict(env, **{RESULT_ENV: str(result_file)}),
                           seconds + STARTUP_SLACK)
            head = f"mpiexec -n {n}: {shlex.join(cmd)}"
            if rc is None:
                raise LaunchFailed(f"{head}\nkilled after {seconds + STARTUP_SLACK:g} s "
                                   f"(the per-test timeout plus start-up)\n{out}")
            try:
                result = json.loads(result_file.read_text())
            except (OSError, ValueError):
                raise LaunchFailed(f"{head}\nexited with code {rc} without a result (the job "
                                   f"aborted or crashed)\n{out}") from None
            outcome, reason = result["outcomes"].get(self.nodeid, (None, ""))
            if outcome is None:
                raise LaunchFailed(f"{head}\ndid not run {self.nodeid} (exit code {rc})\n{out}")
            if outcome == "failed" or (rc != 0 and outcome != "skipped"):
                raise LaunchFailed(f"{head}\nfailed (exit code {rc})\n{out}")
            if outcome == "skipped":
                skipped.append(f"n={n}: {reason}")
        if len(skipped) == len(self.nprocs):
            pytest.skip("; ".join(skipped))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, LaunchFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)
