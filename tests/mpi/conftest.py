"""Fixtures and helpers for tests that run under MPI (one pytest session per rank).

Run with ``mpiexec -n N .venv/bin/python -m mpi4py scripts/mpi_pytest.py tests/mpi -q``; plain
``pytest tests/mpi`` runs them as a one-rank job.

Rules for MPI tests (all ranks run the same test at the same time):

* Hypothesis: the ``disttensor-mpi`` profile loaded here is derandomized (the seed comes from
  the test itself) and has no example database, so every rank draws the same examples in the
  same order (the local constants Hypothesis would mix into its draws are switched off: they
  depend on which modules each rank happened to import).  Never draw anything rank-dependent.  ``DISTTENSOR_HYPOTHESIS_EXAMPLES`` overrides
  ``max_examples`` (default 25).  Hypothesis bounds shrinking by wall time (minutes), the one
  way ranks could still drift apart; keep failing examples cheap.
* Assertions inside a test must be collective: use :func:`assert_all_ranks` and
  :func:`assert_allclose_all` instead of a bare ``assert`` on rank-local data, so that a failure
  on one rank fails (and makes hypothesis shrink) on every rank.
* Safety net: each test phase (setup, call, teardown) ends with a small all-gather of its
  outcome on a private communicator.  If the phase failed on any rank it fails on every rank
  ("failed on rank(s) [..]"), and if it was skipped on some rank it is skipped on all, so the
  ranks never go on to different tests.  ``DISTTENSOR_SYNC_OUTCOMES=0`` turns this off.  The
  collected test lists are compared across ranks too; if they differ the session stops on all
  ranks instead of deadlocking in the first collective.  The net cannot help inside a test: a
  rank that fails or skips before a collective the other ranks enter leaves them waiting (the
  outer timeout would end the job), so decide skips from replicated facts, and agree (with
  :func:`assert_all_ranks`) before communicating.  To fail fast in that case, a rank that has
  waited ``DISTTENSOR_SYNC_TIMEOUT`` seconds (default 120) in the outcome exchange prints its
  own outcome (the traceback that made it leave the test early) and aborts the MPI job.
"""
from __future__ import annotations

import os
import time
import traceback
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from mpi4py import MPI

# convolution planning: the cost model (deterministic, nothing timed or written to disk);
# tests/unit/test_microbatch.py exercises the benchmark mode explicitly
os.environ.setdefault("DISTTENSOR_CONV_TUNE", "heuristic")

__all__ = ["assert_all_ranks", "assert_allclose_all", "assert_raises_all"]

# -- hypothesis ------------------------------------------------------------------------------
settings.register_profile(
    "disttensor-mpi",
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    max_examples=int(os.environ.get("DISTTENSOR_HYPOTHESIS_EXAMPLES", "25")),
    print_blob=False,
)
settings.load_profile("disttensor-mpi")


def _same_constants_on_every_rank() -> None:
    """Hypothesis (6.1xx) mixes into its draws literal constants it collects from the local
    modules in ``sys.modules`` at draw time.  Modules imported lazily differ between ranks (a
    rank with an empty block never loads the kernel module a busy rank loads), so derandomized
    runs drew different examples on different ranks (e.g. another ``seed`` for the same case)
    and replicated data stopped being replicated.  Collect no local constants: the built-in
    constant pool alone is the same everywhere."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a Hypothesis without the mechanism
        return
    if hasattr(providers, "_get_local_constants") and hasattr(providers, "Constants"):
        none = providers.Constants()
        providers._get_local_constants = lambda: none


_same_constants_on_every_rank()


# -- collective assertions -------------------------------------------------------------------
def assert_all_ranks(comm: MPI.Comm, ok: bool, msg: str = "") -> None:
    """Collective assertion: raise ``AssertionError`` on every rank if ``ok`` is false on any.

    The message names the failing ranks and carries each failing rank's ``msg``.  Costs one
    small all-reduce when everything passed (plus an all-gather on failure)."""
    __tracebackhide__ = True  # pytest: show the caller's line, not this helper's
    ok = bool(ok)
    if comm.Get_size() == 1:
        if not ok:
            raise AssertionError(f"{msg} (failed on rank(s) [0])")
        return
    if comm.allreduce(ok, op=MPI.LAND):
        return
    infos = comm.allgather(None if ok else str(msg))
    failed = [r for r, m in enumerate(infos) if m is not None]
    detail = "; ".join(f"rank {r}: {infos[r]}" for r in failed if infos[r])
    raise AssertionError(f"failed on rank(s) {failed} (this is rank {comm.Get_rank()})"
                         + (f": {detail}" if detail else ""))


def _to_numpy(a):
    if hasattr(a, "get") and type(a).__module__.startswith("cupy"):
        return a.get()
    if hasattr(a, "local") and hasattr(a, "gather"):  # a DistArray slipped in: compare its block
        a = a.local
        return a.get() if type(a).__module__.startswith("cupy") else np.asarray(a)
    return a


def assert_allclose_all(comm: MPI.Comm, actual, desired, rtol: float = 1e-7, atol: float = 0.0,
                        *, equal_nan: bool = True, err_msg: str = "") -> None:
    """``numpy.testing.assert_allclose`` on each rank's data, failing on every rank if it fails
    on any (CuPy arrays are copied to the host first)."""
    __tracebackhide__ = True
    ok, msg = True, ""
    try:
        np.testing.assert_allclose(_to_numpy(actual), _to_numpy(desired), rtol=rtol, atol=atol,
                                   equal_nan=equal_nan, err_msg=err_msg)
    except Exception as e:  # noqa: BLE001 - AssertionError, or a TypeError etc. from bad input
        ok, msg = False, f"{type(e).__name__}: {str(e).strip()}"
    assert_all_ranks(comm, ok, msg)


def assert_raises_all(comm: MPI.Comm, exc, match: str, fn) -> None:
    """Collective: ``fn()`` must raise ``exc`` with a message matching the regular expression
    ``match`` on every rank; fails on every rank otherwise."""
    import re
    ok, msg = True, ""
    try:
        fn()
        ok, msg = False, "did not raise"
    except exc as e:
        if not re.search(match, str(e)):
            ok, msg = False, f"wrong message: {e}"
    except Exception as e:  # noqa: BLE001 - any other exception is a failure
        ok, msg = False, f"raised {type(e).__name__}: {e}"
    assert_all_ranks(comm, ok, msg)


# -- fixtures --------------------------------------------------------------------------------
@pytest.fixture
def comm() -> MPI.Comm:
    """``MPI.COMM_WORLD``."""
    return MPI.COMM_WORLD


@pytest.fixture
def shared_tmp_path(tmp_path: Path, comm: MPI.Comm) -> Path:
    """One temporary directory seen by all ranks (rank 0's ``tmp_path``), e.g. for parallel
    HDF5 files.  Each rank's own ``tmp_path`` differs (``scripts/mpi_pytest.py`` gives every
    rank its own ``--basetemp``)."""
    path = Path(comm.bcast(str(tmp_path) if comm.Get_rank() == 0 else None, root=0))
    return path


# -- keeping the ranks in step ---------------------------------------------------------------
_SYNC = os.environ.get("DISTTENSOR_SYNC_OUTCOMES", "1") not in ("0", "false", "no")
_sync_comm: MPI.Comm | None = None


def _get_sync_comm() -> MPI.Comm | None:
    """A private duplicate of COMM_WORLD (created collectively at the end of collection), so
    the outcome exchange can never match a collective of a test that is still running on a
    rank that fell behind."""
    global _sync_comm
    if not _SYNC or MPI.COMM_WORLD.Get_size() == 1:
        return None
    if _sync_comm is None:
        _sync_comm = MPI.COMM_WORLD.Dup()
    return _sync_comm


_config: pytest.Config | None = None


def pytest_configure(config):
    global _config
    _config = config
    config.addinivalue_line("markers", "mpi: runs under mpiexec (collective over COMM_WORLD)")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.mpi)


def pytest_collection_finish(session):
    comm = _get_sync_comm()
    if comm is None:
        return
    ids = "\n".join(item.nodeid for item in session.items)
    mine = (len(session.items), zlib.crc32(ids.encode()), int(session.testsfailed))
    everyone = comm.allgather(mine)
    if any(x != everyone[0] for x in everyone[1:]):
        pytest.exit("ranks collected different tests or hit different collection errors "
                    f"(items, crc32 of node ids, errors) by rank: {everyone}", returncode=2)


_PASSED, _SKIPPED, _FAILED = 0, 1, 2
_SYNC_TIMEOUT = float(os.environ.get("DISTTENSOR_SYNC_TIMEOUT", "120"))


ABORT_EXIT_CODE = 86  # exit status of a job aborted because its ranks got out of step


def _abort(comm: MPI.Comm, text: str) -> None:
    """Print ``text`` where a person will see it and end the whole MPI job."""
    lines = "".join(f"[rank {comm.Get_rank()}] {line}\n" for line in text.splitlines())
    capman = _config.pluginmanager.getplugin("capturemanager") if _config else None
    if capman is not None:  # give fds 1 and 2 back to where they pointed before pytest
        try:
            capman.suspend_global_capture(in_=True)
        except Exception:  # noqa: BLE001
            pass
    # the terminal (a duplicate kept by scripts/mpi_pytest.py) and the rank's own stderr (its
    # log file on ranks > 0), each file once
    tty = os.environ.get("DISTTENSOR_TEST_TERMINAL_FD", "")
    seen = set()
    for fd in ([int(tty)] if tty.isdigit() else []) + [2]:
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            os.write(fd, lines.encode(errors="replace"))
        except OSError:
            pass
    time.sleep(2)  # let mpiexec forward the message before the abort tears the job down
    MPI.COMM_WORLD.Abort(ABORT_EXIT_CODE)


def _short_traceback(err: BaseException) -> str:
    """The traceback of ``err`` without pytest's, pluggy's and this file's frames."""
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not any(part in f.filename for part in ("/_pytest/", "/pluggy/", __file__))]
    return "".join(traceback.format_list(frames) + traceback.format_exception_only(type(err), err))


def _exchange_codes(comm: MPI.Comm, code: int, where: str, own: str) -> list[int]:
    """All-gather one small int per rank, giving up after ``DISTTENSOR_SYNC_TIMEOUT`` seconds.

    A rank that waits that long here has finished ``where`` while some other rank has not,
    almost always because this rank left the test early (a rank-local failure or skip) and the
    others sit in a collective of the test that it will never enter.  Waiting longer cannot
    help, so it prints its own outcome (the likely cause) and aborts the job."""
    send = np.array([code], dtype=np.int64)
    recv = np.zeros(comm.Get_size(), dtype=np.int64)
    req = comm.Iallgather(send, recv)
    t0 = time.monotonic()
    delay = 1e-4
    while not req.Test():
        if time.monotonic() - t0 > _SYNC_TIMEOUT:
            _abort(comm, f"waited {_SYNC_TIMEOUT:.0f} s for the other ranks to finish {where}: "
                         "probably some rank is blocked in a collective that another rank left "
                         "early (a rank-local failure, skip or exit).  This rank's outcome: "
                         f"{own}\nAborting the MPI job (DISTTENSOR_SYNC_TIMEOUT sets the wait).")
        time.sleep(delay)
        delay = min(2 * delay, 0.02)
    return [int(c) for c in recv]


def _sync_phase(phase: str, item):
    comm = _get_sync_comm()
    if comm is None:
        return (yield)
    err: BaseException | None = None
    try:
        result = yield
    except (KeyboardInterrupt, SystemExit, pytest.exit.Exception):
        raise
    except BaseException as e:  # noqa: BLE001 - includes pytest's Skipped/Failed outcomes
        err, result = e, None
    if err is None:
        code, summary, own = _PASSED, "", "passed"
    elif isinstance(err, pytest.skip.Exception):
        code, summary = _SKIPPED, str(err)
        own = f"skipped: {summary}"
    else:
        code, summary = _FAILED, f"{type(err).__name__}: {str(err).strip()[:500]}"
        own = "failed:\n" + _short_traceback(err)
    codes = _exchange_codes(comm, code, f"{phase} of {item.nodeid}", own)
    if err is not None:
        if any(c != code for c in codes):
            comm.allgather(summary)  # the others ask for it (below)
        raise err
    if all(c == _PASSED for c in codes):
        return result
    summaries = comm.allgather(summary)
    failed = [r for r, c in enumerate(codes) if c == _FAILED]
    if failed:
        pytest.fail(f"{phase} failed on rank(s) {failed} (passed on this rank "
                    f"{comm.Get_rank()}); rank {failed[0]}: {summaries[failed[0]]}",
                    pytrace=False)
    skipped = [r for r, c in enumerate(codes) if c == _SKIPPED]
    pytest.skip(f"skipped on rank(s) {skipped}: {summaries[skipped[0]]}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _sync_phase("setup", item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _sync_phase("call", item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    return (yield from _sync_phase("teardown", item))
