"""Fixtures and helpers for tests that run under MPI (one pytest session per rank).

Run with ``mpiexec -n N .venv/bin/python -m mpi4py scripts/mpi_pytest.py tests/mpi -q`` (or
``mpiexec -n N .venv/bin/python -m pytest tests/mpi -q``); plain ``pytest tests/mpi`` runs them
as a one-rank job.  The disttensor pytest plugin (``disttensor/testing/pytest_plugin.py``, an
entry point of this package) does the MPI side: rank 0 reports, the other ranks log to files,
each rank has its own ``--basetemp``, the outcome of every test phase is the same on every rank
and the exit code is collective.

Rules for MPI tests (all ranks run the same test at the same time):

* Hypothesis: the ``disttensor-mpi`` profile loaded here is derandomized (the seed comes from
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
    HDF5 files.  Each rank's own ``tmp_path`` differs (the disttensor pytest plugin gives every
    rank its own ``--basetemp``)."""
    path = Path(comm.bcast(str(tmp_path) if comm.Get_rank() == 0 else None, root=0))
    return path


# -- the disttensor pytest plugin keeps the ranks in step -------------------------------------
def pytest_configure(config):
    plugin = sys.modules.get("disttensor.testing.pytest_plugin")
    if plugin is None or not config.pluginmanager.is_registered(plugin):
        raise pytest.UsageError(
            "tests/mpi needs the disttensor pytest plugin (outcome sync across ranks, rank-0 "
            "reporting): `pip install -e .` registers its entry point, or pass "
            "-p disttensor.testing.pytest_plugin")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.mpi)
