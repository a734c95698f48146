"""Shared helpers of the MPI property tests of the NumPy-style API (creation, ufuncs,
reductions, indexing): a grid cache, scatter of a global array into a layout, and collective
checks that record failures locally and settle them with one collective assertion per example
(an all-reduce per check is what makes oversubscribed runs slow)."""
from __future__ import annotations

import functools
import re

import numpy as np
import pytest
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


def check_blocks(x, expected, what: str = "", *, rtol: float = 0.0, atol: float = 0.0,
                 dtype: bool = True, mask=None, values: bool = True, layout=None) -> None:
    """Record a failure (settled collectively by :func:`settle`) unless ``x`` is a DistArray
    with ``expected``'s shape (and dtype), laid out as ``layout = (dims, split, sizes)`` when
    given, whose block on every rank equals the matching block of ``expected``: exactly (NaNs
    equal) when ``rtol`` and ``atol`` are 0, else to those tolerances; with ``mask`` only where
    the mask is true; ``values=False`` checks all but the values (``empty``)."""
    import disttensor as dt
    expected = np.asarray(expected)
    try:
        assert isinstance(x, dt.DistArray), f"got {type(x).__name__}"
        assert x.shape == expected.shape, f"shape {x.shape} != {expected.shape}"
        if dtype:
            assert x.dtype == expected.dtype, f"dtype {x.dtype} != {expected.dtype}"
        if layout is not None:
            dims, split, sizes = layout
            want_dist = dt.Distribution(expected.shape, dims, split, sizes)
            assert x.distribution == want_dist, f"{x.distribution} != {want_dist}"
            assert x.grid.dims == tuple(dims)
        assert x.distribution.block_shape(x.grid.coords) == x.local.shape
        sl = x.local_slices
        got, want = x.local, expected[sl]
        assert got.shape == want.shape, f"local shape {got.shape} != {want.shape}"
        if not values:
            return
        if mask is not None:
            m = np.broadcast_to(mask, expected.shape)[sl]
            got, want = got[m], want[m]
        if rtol == 0 and atol == 0:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    except Exception as e:  # noqa: BLE001 - reported collectively
        expect(False, f"{what + ': ' if what else ''}{type(e).__name__}: {e}")


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


# -- arguments that differ between ranks (argument agreement tests) ------------------------------
def in_step(tag: str) -> None:
    """Prove the ranks are still in step after an expected failure: an allreduce, an allgather
    of which check we are at (a rank left behind in another collective would mismatch or hang),
    and a small distributed op on fresh arrays (an agreed call: it also agrees whatever
    elementwise calls are still deferred)."""
    assert COMM.allreduce(1, op=MPI.SUM) == SIZE
    where = COMM.allgather(tag)
    assert_all_ranks(COMM, all(w == tag for w in where), f"ranks at different places: {where}")
    x = dt.arange(2 * SIZE + 1, dtype="float64")
    assert float(x.sum()) == float(np.arange(2 * SIZE + 1).sum())


def last_rank_only(bad, good):
    """``bad`` on the last rank (so not the root of anything), ``good`` elsewhere."""
    return bad if COMM.Get_rank() == SIZE - 1 else good


def mismatch(call: str, *names: str):
    """``pytest.raises`` for the ArgumentMismatchError of ``call`` naming each of ``names`` with
    its value on every rank."""
    pattern = rf"^{re.escape(call)}: arguments differ between ranks"
    pattern += "".join(rf"(?=.*'{re.escape(n)}' \(rank 0: .*rank {SIZE - 1}: )" for n in names)
    return pytest.raises(dt.ArgumentMismatchError, match=pattern)


def different_calls(*calls: str):
    """``pytest.raises`` for ranks that reached different collective calls."""
    pattern = r"reached different collective calls \(" + "".join(
        rf"(?=.*{re.escape(c)})" for c in calls)
    return pytest.raises(dt.ArgumentMismatchError, match=pattern)
