"""Shared helpers of the MPI property tests of the NumPy-style API (creation, ufuncs,
reductions, indexing): a grid cache, scatter of a global array into a layout, and collective
checks that record failures locally and settle them with one collective assertion per example
(an all-reduce per check is what makes oversubscribed runs slow)."""
from __future__ import annotations

import functools

import numpy as np
from hypothesis import settings
from mpi4py import MPI

import disttensor as dt
from conftest import assert_all_ranks

COMM = MPI.COMM_WORLD
SIZE = COMM.Get_size()

_GRIDS: dict = {}
_FAILS: list[str] = []


def examples(n: int) -> int:
    """``n`` scaled by ``DISTTENSOR_HYPOTHESIS_EXAMPLES`` (default 25, see conftest.py)."""
    return max(1, n * settings.default.max_examples // 25)


def grid(dims) -> dt.ProcessGrid:
    """One ProcessGrid per grid shape (collective to create; every rank draws the same
    examples, so all create them in the same order)."""
    dims = tuple(dims)
    if dims not in _GRIDS:
        _GRIDS[dims] = dt.ProcessGrid(dims)
    return _GRIDS[dims]


def dist(a, layout) -> dt.DistArray:
    dims, split, sizes = layout
    return dt.from_global(np.asarray(a), grid=grid(dims), split=split, sizes=sizes)


def expect(ok: bool, msg: str) -> None:
    if not ok:
        _FAILS.append(msg)


def settle() -> None:
    """Collective: fail on every rank if any check failed on any rank."""
    fails = list(_FAILS)
    _FAILS.clear()
    assert_all_ranks(COMM, not fails, " | ".join(fails[:3]))


def collective_checks(fn):
    """Run the test body, then settle its recorded checks (goes under ``@given``)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _FAILS.clear()
        fn(*args, **kwargs)
        settle()
    return wrapper
