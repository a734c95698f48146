"""Run pytest inside an MPI job, one pytest session per rank (what ``scripts/test.sh`` uses).

Usage (from the repository root)::

    mpiexec -n 4 .venv/bin/python -m mpi4py scripts/mpi_pytest.py tests/mpi -q [pytest args]

The disttensor pytest plugin (``pytest_disttensor.py``) does the MPI work, so
``mpiexec -n 4 .venv/bin/python -m pytest tests/mpi -q`` behaves the same: rank 0 reports, the
other ranks log to ``rank<r>-n<size>.log`` files shown when they failed, each rank has its own
``--basetemp``, no cache provider, test outcomes and the exit code are collective.  This
wrapper adds what suits this repository's runs:

* the per-rank logs go to ``build/test-logs`` and the temporary directories to
  ``build/test-tmp/n<size>/rank<r>`` (``DISTTENSOR_TEST_LOG_DIR`` / ``DISTTENSOR_TEST_TMP_DIR``
  override them; two jobs at once in one checkout need their own);
* ``-o faulthandler_timeout=S`` (``DISTTENSOR_TEST_STACK_DUMP_S``, default 300 s): a test that
  runs longer than that dumps every thread's stack, so a deadlock killed by the outer
  ``timeout`` leaves tracebacks behind (on the terminal for rank 0, in the logs for the others);
* under ``python -m mpi4py`` (an exception that escapes calls ``MPI_Abort`` instead of leaving
  the other ranks waiting), MPI is finalized before the collective exit code is returned, so
  a failed run ends cleanly instead of through ``MPI_Abort``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pytest_args(argv: list[str]) -> list[str]:
    os.environ.setdefault("DISTTENSOR_TEST_LOG_DIR", str(ROOT / "build" / "test-logs"))
    os.environ.setdefault("DISTTENSOR_TEST_TMP_DIR", str(ROOT / "build" / "test-tmp"))
    extra = []
    if not any("faulthandler_timeout" in a for a in argv):
        seconds = os.environ.get("DISTTENSOR_TEST_STACK_DUMP_S", "300")
        extra += ["-o", f"faulthandler_timeout={seconds}"]
    return extra + list(argv)


def main(argv: list[str]) -> int:
    import pytest
    from mpi4py import MPI

    rc = int(pytest.main(_pytest_args(argv)))  # the same on every rank (the plugin)
    MPI.Finalize()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
