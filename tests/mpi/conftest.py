"""Fixtures and helpers for tests that run under MPI (one pytest session per rank).

Run with ``mpiexec -n N .venv/bin/python -m mpi4py scripts/mpi_pytest.py tests/mpi -q`` (or
``mpiexec -n N .venv/bin/python -m pytest tests/mpi -q``); plain ``pytest tests/mpi`` runs them
as a one-rank job.  The disttensor pytest plugin (``pytest_disttensor.py``, an
entry point of this package) does the MPI side: rank 0 reports, the other ranks log to files,
each rank has its own ``--basetemp``, the outcome of every test phase is the same on every rank
and the exit code is collective.

Rules for MPI tests (all ranks run the same test at the same time):

* Hypothesis: the ``disttensor-mpi`` profile (:mod:`disttensor.testing.profile`) loaded here
  is derandomized (the seed comes from
  the test itself) and has no example database, so every rank draws the same examples in the
  same order (the local constants Hypothesis would mix into its draws are switched off: they
  depend on which modules each rank happened to import).  Never draw anything rank-dependent.
  ``DISTTENSOR_HYPOTHESIS_EXAMPLES`` overrides ``max_examples`` (default 25).  Hypothesis
  bounds shrinking by wall time (minutes), the one way ranks could still drift apart; keep
  failing examples cheap.
* Assertions inside a test must be collective: use :func:`assert_all_ranks` and
  :func:`assert_allclose_all` instead of a bare ``assert`` on rank-local data, so that a failure
  on one rank fails (and makes hypothesis shrink) on every rank.
* Safety net (the plugin): each test phase (setup, call, teardown) ends with a small
  all-gather of its outcome on a private communicator.  If the phase failed on any rank it
  fails on every rank ("failed on rank(s) [..]"), and if it was skipped on some rank it is
  skipped on all, so the ranks never go on to different tests.  ``DISTTENSOR_SYNC_OUTCOMES=0``
  turns this off.  The collected test lists are compared across ranks too.  The net cannot help
  inside a test: a rank that fails or skips before a collective the other ranks enter leaves
  them waiting, so decide skips from replicated facts, and agree (with
  :func:`assert_all_ranks`) before communicating.  To fail fast in that case, a rank that has
  waited ``DISTTENSOR_SYNC_TIMEOUT`` seconds (default 120) in the outcome exchange prints its
  own outcome and aborts the MPI job (exit code 86); ``--mpi-test-timeout S`` aborts a test
  that runs longer than S seconds with a report of where every rank waits (exit code 87).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

from disttensor import testing as _kit
from disttensor.testing.profile import load_mpi_profile

# convolution planning: the cost model (deterministic, nothing timed or written to disk);
# tests/unit/test_microbatch.py exercises the benchmark mode explicitly
os.environ.setdefault("DISTTENSOR_CONV_TUNE", "heuristic")

__all__ = ["assert_all_ranks", "assert_allclose_all", "assert_raises_all"]

# -- hypothesis: the public MPI profile (derandomized, no database, no local constants) --------
load_mpi_profile()


# -- collective assertions: the public kit under the suite's (comm, ...) call order ----------
def assert_all_ranks(comm: MPI.Comm, ok: bool, msg: str = "") -> None:
    """Collective: ``AssertionError`` on every rank (one message) if ``ok`` is false on any
    (:func:`disttensor.testing.assert_all_ranks`)."""
    __tracebackhide__ = True  # pytest: show the caller's line, not this helper's
    _kit.assert_all_ranks(ok, msg, comm=comm)


def assert_allclose_all(comm: MPI.Comm, actual, desired, rtol: float = 1e-7, atol: float = 0.0,
                        *, equal_nan: bool = True, err_msg: str = "") -> None:
    """``numpy.testing.assert_allclose`` of each rank's data, failing on every rank if it fails
    on any (:func:`disttensor.testing.assert_allclose`)."""
    __tracebackhide__ = True
    _kit.assert_allclose(actual, desired, rtol, atol, equal_nan=equal_nan, err_msg=err_msg,
                         comm=comm)


def assert_raises_all(comm: MPI.Comm, exc, match: str, fn) -> None:
    """Collective: ``fn()`` raises ``exc`` matching ``match`` on every rank
    (:func:`disttensor.testing.assert_raises_collectively`)."""
    __tracebackhide__ = True
    _kit.assert_raises_collectively(exc, fn, match=match, comm=comm)


# -- fixtures --------------------------------------------------------------------------------
@pytest.fixture
def comm() -> MPI.Comm:
    """``MPI.COMM_WORLD``."""
    return MPI.COMM_WORLD


@pytest.fixture
def counted(monkeypatch) -> list:
    """Every status all-reduce (agreement or failure) made during the test, as the name of the
    call it agreed (``None`` for a failure-only one): every agreement and failure all-reduce
    goes through :func:`disttensor.core.agreement.status_allreduce`."""
    from disttensor.core import agreement
    calls = []
    orig = agreement.status_allreduce

    def counting(comm, failed, dig):
        calls.append((agreement.current_call() or (None,))[0] if dig is not None else None)
        return orig(comm, failed, dig)
    monkeypatch.setattr(agreement, "status_allreduce", counting)
    return calls


@pytest.fixture
def shared_tmp_path(tmp_path: Path, comm: MPI.Comm) -> Path:
    """One temporary directory seen by all ranks (rank 0's ``tmp_path``), e.g. for parallel
    HDF5 files.  Each rank's own ``tmp_path`` differs (the disttensor pytest plugin gives every
    rank its own ``--basetemp``)."""
    path = Path(comm.bcast(str(tmp_path) if comm.Get_rank() == 0 else None, root=0))
    return path


# -- the disttensor pytest plugin keeps the ranks in step -------------------------------------
def pytest_configure(config):
    plugin = sys.modules.get("pytest_disttensor")
    if plugin is None or not config.pluginmanager.is_registered(plugin):
        raise pytest.UsageError(
            "tests/mpi needs the disttensor pytest plugin (outcome sync across ranks, rank-0 "
            "reporting): `pip install -e .` registers its entry point, or pass "
            "-p pytest_disttensor")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.mpi)
