"""The disttensor pytest plugin (entry point ``disttensor``): pytest sessions under ``mpiexec``
and tests marked ``@pytest.mark.mpi(n=...)`` run in their own ``mpiexec`` from plain pytest.

A top-level module installed with disttensor, not a module of the package, so that pytest can
load it in every session without importing :mod:`disttensor` (which starts MPI): it imports
the package's :mod:`disttensor.testing.mpi_session` and :mod:`disttensor.testing.launcher`
only when a session runs under an MPI launcher or holds ``@pytest.mark.mpi(n=...)`` tests.

Two modes, chosen when pytest starts:

* **Under an MPI launcher** (``mpiexec -n N python -m pytest ...``; detected from the
  launcher's environment, ``PMI_RANK``/``PMI_SIZE``/``OMPI_COMM_WORLD_SIZE``/
  ``MPI_LOCALNRANKS``/``PMIX_RANK``, or an mpi4py already initialized with more than one rank),
  every rank runs its own pytest session over the same tests (:mod:`.mpi_session` with N > 1):

  - rank 0 reports to the terminal; every other rank writes its stdout and stderr (file
    descriptors 1 and 2, so C output and stack dumps too) to ``rank<r>-n<N>.log`` in
    ``--mpi-log-dir`` (``DISTTENSOR_TEST_LOG_DIR``; default
    ``<tmp>/pytest-mpi-of-<user>/logs``), printed with a ``[rank r]`` prefix at the end of a
    session that failed on that rank;
  - each rank gets its own ``--basetemp`` (``<basetemp>/rank<r>`` when one is given, else
    ``$DISTTENSOR_TEST_TMP_DIR/n<N>/rank<r>``, else ``<tmp>/pytest-mpi-of-<user>/n<N>/rank<r>``)
    and the cache provider is off (as ``-p no:cacheprovider``): no races between ranks;
  - the collected test lists are compared (different lists stop the session on every rank);
  - the outcome of every test phase (setup, call, teardown) is all-gathered: a phase that
    failed on some rank fails on every rank, one skipped on some rank is skipped on all, so the
    ranks never drift into different tests (``DISTTENSOR_SYNC_OUTCOMES=0`` turns this off).
    A rank that waits ``DISTTENSOR_SYNC_TIMEOUT`` seconds (default 120) in that exchange has
    left a test that others are still in (blocked in a collective it skipped): it prints its
    own outcome and aborts the job (exit code :data:`ABORT_EXIT_CODE`, 86);
  - the exit code is collective: every rank exits with the same code, non-zero if any rank
    failed (the most severe code; "no tests collected", 5, only if nothing worse happened);
  - ``--mpi-test-timeout S`` (ini ``mpi_test_timeout``, env ``DISTTENSOR_TEST_TIMEOUT``; off by
    default) ends a test that runs longer than ``S`` seconds: every rank prints where it waits
    (its disttensor collective wait as the library's watchdog records it, and every thread's
    stack), then the job aborts with :data:`TIMEOUT_EXIT_CODE` (87).

  ``@pytest.mark.mpi(n=K)`` tests run where the job has K ranks, are skipped in bigger jobs
  and fail with a clear message in smaller ones (``n`` may be a list of rank counts).

* **Plain pytest** (no launcher): a test marked ``@pytest.mark.mpi(n=K)`` (K > 1) runs in its
  own ``mpiexec -n K python -m pytest <node id>`` (:mod:`.launcher`): under a timeout (the
  per-test timeout, or 300 s, plus 60 s of start-up), output captured and shown on failure,
  ``mpiexec`` from ``--mpiexec`` or ``PATH``, extra launcher arguments from
  ``DISTTENSOR_MPIEXEC_ARGS``.  A bare ``@pytest.mark.mpi`` (no ``n``) changes nothing: the test
  runs in the pytest process as a one-rank job.  Without such marks the plugin is inert: it
  imports nothing (not mpi4py) and changes no outcome, option default or exit code.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import pytest

__all__ = ["ABORT_EXIT_CODE", "TIMEOUT_EXIT_CODE", "abort_job", "mpi_world_size",
           "required_ranks", "under_mpi_launcher"]

ABORT_EXIT_CODE = 86  # the job was aborted because its ranks got out of step
TIMEOUT_EXIT_CODE = 87  # the job was aborted because a test ran past --mpi-test-timeout
LAUNCHER_ENV = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
MARKER_HELP = ("mpi(n=None): collective over MPI_COMM_WORLD; with n (an int or a list of "
               "ints) it needs exactly that many ranks, and plain pytest runs it in its own "
               "mpiexec -n n")

_session = None  # the MpiSession of this rank, under a launcher with more than one rank
_timer = None  # the TestTimer of a one-rank job under a launcher


def under_mpi_launcher() -> bool:
    """True when this process was started by an MPI launcher (its environment says so) or
    runs in an initialized MPI job of more than one rank.  Imports nothing."""
    if any(v in os.environ for v in LAUNCHER_ENV):
        return True
    mpi = sys.modules.get("mpi4py.MPI")
    return bool(mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()
                and mpi.COMM_WORLD.Get_size() > 1)


def mpi_world_size() -> int:
    """The number of ranks of this job (1 without a launcher; imports mpi4py under one)."""
    if not under_mpi_launcher():
        return 1
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_size()


def required_ranks(item: pytest.Item) -> tuple[int, ...] | None:
    """The rank counts ``@pytest.mark.mpi(n=...)`` asks for (``None``: no ``n``, any count).
    Raises ``pytest.UsageError`` for anything but positive ints."""
    mark = item.get_closest_marker("mpi")
    if mark is None:
        return None
    n = mark.kwargs.get("n", mark.args[0] if mark.args else None)
    if n is None:
        return None
    values = list(n) if isinstance(n, Sequence) and not isinstance(n, str) else [n]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                             for v in values):
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.mpi(n=...) takes a positive int "
                                f"or a non-empty list of them, got n={n!r}")
    return tuple(sorted(set(values)))


def abort_job(text: str, code: int = ABORT_EXIT_CODE) -> None:
    """End the whole MPI job from inside a test, after printing ``text`` where a person will
    see it (the terminal on rank 0, the rank's log elsewhere): for a rank that knows the others
    wait in a collective it will never enter.  Without a multi-rank session: stderr, then
    ``MPI_Abort`` of ``COMM_WORLD``."""
    if _session is not None:
        _session.abort(text, code)
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
    from mpi4py import MPI
    MPI.COMM_WORLD.Abort(code)


def _option(config: pytest.Config, name: str, env: str, ini: str | None = None):
    value = config.getoption(name, None)
    if value is None and env in os.environ:
        value = os.environ[env]
    if value is None and ini is not None:
        value = config.getini(ini) or None
    return value


def per_test_timeout(config: pytest.Config) -> float:
    """The per-test timeout in seconds (0: off)."""
    value = _option(config, "mpi_test_timeout", "DISTTENSOR_TEST_TIMEOUT", "mpi_test_timeout")
    try:
        seconds = float(value or 0)
    except ValueError:
        raise pytest.UsageError(f"--mpi-test-timeout / mpi_test_timeout / "
                                f"DISTTENSOR_TEST_TIMEOUT: seconds, got {value!r}") from None
    return max(seconds, 0.0)


# -- hooks -------------------------------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("disttensor", "disttensor: MPI test runs")
    group.addoption("--mpi-test-timeout", dest="mpi_test_timeout", default=None,
                    metavar="S", help="under mpiexec: abort the job, with a report of where "
                    "each rank waits, when a test runs longer than S seconds (0: off; env "
                    "DISTTENSOR_TEST_TIMEOUT)")
    group.addoption("--mpi-log-dir", dest="mpi_log_dir", default=None, metavar="DIR",
                    help="under mpiexec: where ranks > 0 write rank<r>-n<size>.log (env "
                    "DISTTENSOR_TEST_LOG_DIR)")
    group.addoption("--mpiexec", dest="mpiexec", default=None, metavar="PATH",
                    help="the MPI launcher for @pytest.mark.mpi(n=...) tests in a plain "
                    "pytest session (default: mpiexec from PATH)")
    parser.addini("mpi_test_timeout", "per-test timeout in seconds under mpiexec (0: off)",
                  default="")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, args, parser):
    """Under a launcher with more than one rank: set up the rank's session before pytest's
    output capture starts (ranks > 0 log to files from here on)."""
    global _session
    _session = None
    if under_mpi_launcher() and mpi_world_size() > 1:
        from disttensor.testing.mpi_session import MpiSession
        _session = MpiSession(early_config)
    return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    global _timer
    config.addinivalue_line("markers", MARKER_HELP)
    if _session is not None:
        _session.configure(config, per_test_timeout(config))
    elif under_mpi_launcher() and per_test_timeout(config) > 0:  # a one-rank job
        from disttensor.testing.mpi_session import TestTimer
        _timer = TestTimer(config, per_test_timeout(config), None)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items):
    if under_mpi_launcher():
        for item in items:
            required_ranks(item)  # bad marks fail at collection
        return
    launch = [i for i, item in enumerate(items) if (required_ranks(item) or (1,)) != (1,)]
    if launch:
        from disttensor.testing.launcher import MpiLaunchItem
        for i in launch:
            items[i] = MpiLaunchItem.replacing(items[i], required_ranks(items[i]))


def pytest_collection_finish(session: pytest.Session) -> None:
    if _session is not None:
        _session.compare_collections(session)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    timer = _session.timer if _session is not None else _timer
    if timer is None:
        return (yield)
    timer.arm(item.nodeid)
    try:
        return (yield)
    finally:
        timer.disarm()


def _check_ranks(item: pytest.Item) -> None:
    """Under a launcher: a test needing another rank count is skipped (the job is bigger) or
    refused (the job is too small), the same on every rank."""
    need = required_ranks(item)
    if need is None or not under_mpi_launcher():
        return
    size = mpi_world_size()
    if size in need:
        return
    wanted = need[0] if len(need) == 1 else f"one of {list(need)}"
    if size < need[0]:
        pytest.fail(f"{item.nodeid} needs {wanted} MPI ranks (@pytest.mark.mpi(n=...)) but "
                    f"this job has {size}: run it under mpiexec -n {need[0]}, or from plain "
                    f"pytest, which launches it in its own mpiexec", pytrace=False)
    pytest.skip(f"needs {wanted} MPI ranks, this job has {size}")


def _forget_deferred_calls() -> None:
    """Each test starts with no deferred elementwise calls pending (disttensor agrees them at
    the next communicating call: a test that failed half-way must not leave them to the next
    test).  Nothing is imported when disttensor is not loaded."""
    agreement = sys.modules.get("disttensor.core.agreement")
    if agreement is not None and hasattr(agreement, "clear_pending"):
        agreement.clear_pending()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    _forget_deferred_calls()
    if _session is None:
        _check_ranks(item)
        return (yield)
    return (yield from _session.sync_phase("setup", item, before=lambda: _check_ranks(item)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    if _session is None:
        return (yield)
    return (yield from _session.sync_phase("call", item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    if _session is None:
        return (yield)
    return (yield from _session.sync_phase("teardown", item))


RESULT_ENV = "DISTTENSOR_PYTEST_RESULT"  # the launcher's child writes its outcomes there
_outcomes: dict[str, list] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Outcomes by node id, for the launcher that started this job (rank 0 writes them)."""
    if RESULT_ENV not in os.environ:
        return
    outcome, reason = report.outcome, ""
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
    previous = _outcomes.get(report.nodeid)
    if previous is None or previous[0] == "passed" or outcome == "failed":
        _outcomes[report.nodeid] = [outcome, reason]


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    """The collective exit code (every rank leaves with the same one)."""
    if _session is not None:
        _session.finish(session)
    path = os.environ.get(RESULT_ENV)
    if path and (_session is None or _session.rank == 0):
        import json
        with open(path, "w") as f:
            json.dump({"exitstatus": int(session.exitstatus), "outcomes": _outcomes}, f)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Ranks > 0 that failed print their logs, one rank after another."""
    global _timer
    if _session is not None:
        _session.show_logs()
    if _timer is not None:
        _timer.stop()
        _timer = None
