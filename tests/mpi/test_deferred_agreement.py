"""Deferred agreement of elementwise calls that move no data (issue 25).

An elementwise call whose DistArray operands share one layout runs on the local blocks with
no message; on more than one rank its agreement is deferred to the next agreement over the
grid (:mod:`disttensor.core.agreement`).  Checked here: such calls make no all-reduce and the
next call agrees them in its own one; their results equal NumPy's on 1-D and 2-D grids,
uneven and empty blocks, ``out=``, operands with halos, two-output ufuncs and 0-d arrays; a
rank-dependent argument of a deferred call raises :class:`disttensor.ArgumentMismatchError`
on every rank at the latest at the next communicating call, naming the deferred call and the
argument; a deferred call that raises on one rank only is retried as an agreed call; nested
calls inside an entry point defer nothing; :func:`~disttensor.core.agreement.eager` agrees
each call at once.
"""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from checks import (check_blocks, different_calls, grid, in_step, last_rank_only, mismatch,
                    settle)
from conftest import assert_all_ranks
from disttensor.core import agreement

COMM = MPI.COMM_WORLD
SIZE = COMM.Get_size()
RANK = COMM.Get_rank()

two_ranks = pytest.mark.skipif(SIZE == 1, reason="needs two ranks to differ")


def layouts():
    """(grid dims, split, sizes) of a (rows, 3) array: 1-D grid, uneven with an empty block,
    and a 2-D grid where the rank count allows."""
    rows = 2 * SIZE + 1
    out = [((SIZE,), (0, None), None, rows)]
    sizes = [0] + [1] * (SIZE - 2) + [rows - (SIZE - 2)] if SIZE > 1 else [rows]
    out.append(((SIZE,), (0, None), (sizes, None), rows))
    if SIZE % 2 == 0:
        out.append(((2, SIZE // 2), (0, 1), None, rows))
    return out


# -- results ----------------------------------------------------------------------------------
def test_aligned_calls_match_numpy():
    rng = np.random.default_rng(3)
    for dims, split, sizes, rows in layouts():
        a = rng.standard_normal((rows, 3))
        b = rng.standard_normal((rows, 3)) + 2.0
        x = dt.from_global(a, grid=grid(dims), split=split, sizes=sizes)
        y = dt.from_global(b, grid=grid(dims), split=split, sizes=sizes)
        what = f"{dims} {split} {sizes}"
        check_blocks(x + y, a + b, f"add {what}")
        check_blocks(x * 2.5, a * 2.5, f"scalar {what}")
        check_blocks(3 - x, 3 - a, f"reflected {what}")
        check_blocks(np.sqrt(y * y), np.sqrt(b * b), f"sqrt {what}", rtol=1e-15)
        check_blocks(x * np.float32(2), a * np.float32(2), f"numpy scalar {what}")
        check_blocks(x.astype("float32") * 2.0, a.astype("float32") * 2.0, f"weak {what}")
        check_blocks(x > y, a > b, f"compare {what}")
        q, r = np.divmod(x, y)
        check_blocks(q, np.divmod(a, b)[0], f"divmod q {what}")
        check_blocks(r, np.divmod(a, b)[1], f"divmod r {what}")
        z = dt.from_global(np.zeros((rows, 3)), grid=grid(dims), split=split, sizes=sizes)
        np.add(x, y, out=z)
        check_blocks(z, a + b, f"out= {what}")
        z += x
        check_blocks(z, a + b + a, f"in place {what}")
        h = dt.from_global(a, grid=grid(dims), split=split, sizes=sizes, halo=1)
        check_blocks(h - x, a - a, f"halo operand {what}")
    s = dt.from_global(np.array(2.5))
    check_blocks(s * s, np.asarray(np.array(2.5) * np.array(2.5)), "0-d")
    settle()
    in_step("results")


def test_aligned_call_errors_on_every_rank():
    x = dt.arange(2 * SIZE + 1, dtype="float64")
    with pytest.raises(TypeError, match="bitwise_and"):
        np.bitwise_and(x, x)
    i = dt.arange(2 * SIZE + 1)
    with pytest.raises(TypeError, match="Cannot cast"):
        i += 1.5
    in_step("errors")


# -- cost -------------------------------------------------------------------------------------
def test_deferred_calls_make_no_message(counted):
    x = dt.arange(4 * SIZE, dtype="float64")
    y = x * 2.0
    z = x + y  # warm
    float(z.sum())
    counted.clear()
    for _ in range(5):
        z = np.sqrt(x * y + 1.0) - x
    assert_all_ranks(COMM, counted == [], f"aligned calls made all-reduces {counted}")
    float(z.sum())
    want = ["sum"] if SIZE > 1 else []
    assert_all_ranks(COMM, counted == want, f"the next call: {counted}, expected {want}")
    counted.clear()
    with agreement.eager():
        x + y
        x * 3.0
    want = ["add", "multiply"] if SIZE > 1 else []
    assert_all_ranks(COMM, counted == want, f"eager: {counted}, expected {want}")
    in_step("cost")


def test_nested_calls_defer_nothing():
    """Calls inside an entry point (run one level deeper: their arguments derive from agreed
    ones) are neither agreed nor deferred."""
    from disttensor.core.entry import nested
    x = dt.arange(4 * SIZE, dtype="float64")
    float(x.sum())
    with nested():
        y = x * 2.0 + x
    assert_all_ranks(COMM, agreement.take_pending(x.grid.cart) is None,
                     "a nested call was deferred")
    x * 2.0
    deferred = agreement.take_pending(x.grid.cart)
    assert_all_ranks(COMM, (deferred is not None) == (SIZE > 1), f"user call: {deferred}")
    check_blocks(y, np.arange(4 * SIZE) * 3.0, "nested result")
    settle()
    in_step("nested")


# -- rank-dependent arguments -----------------------------------------------------------------
def rank_dependent(split, sizes=None, dtype="float64") -> dt.DistArray:
    """A (2 * SIZE, 3) array whose layout may differ between ranks (made with agreement off:
    creation sends no message then)."""
    with agreement.disabled():
        return dt.ones((2 * SIZE, 3), dtype=dtype, split=split, sizes=sizes)


@two_ranks
def test_rank_dependent_arguments_raise_at_the_next_agreement():
    a = dt.ones((2 * SIZE, 3))
    # another function on one rank
    with different_calls("add", "multiply"):
        a * a if RANK == SIZE - 1 else a + a
        a.sum()
    # a scalar of another type (it changes the result dtype)
    with mismatch("multiply", "x2"):
        a * last_rank_only(2, 2.0)
        a.sum()
    # operands whose layout differs between ranks but is aligned on each rank
    p = rank_dependent(last_rank_only((None, 0), (0, None)))
    with mismatch("add", "x1", "x2"):
        p + p
        a.max()
    # a dtype that differs
    q = rank_dependent((0, None), dtype=last_rank_only("float32", "float64"))
    with mismatch("subtract", "x1"):
        q - 1.0
        a.sum()
    # out= of another layout on one rank: the last rank agrees at once (its out= needs no
    # redistribution either way, so both defer: caught at the next call)
    o = rank_dependent(last_rank_only((None, 0), (0, None)))
    with mismatch("negative", "out"):
        np.negative(p, out=o)
        a.sum()
    in_step("deferred differ")


@two_ranks
def test_deferred_on_some_ranks_agreed_on_others():
    """The operand needs a redistribution on the last rank only: that rank agrees the call at
    once, the others defer it and meet it in their next agreement; every rank raises before
    the redistribution moves data."""
    a = dt.ones((2 * SIZE, 4))
    b = last_rank_only(a.redistribute(split=(None, 0)), dt.ones((2 * SIZE, 4)))
    with mismatch("add", "x2"):
        a + b
        a.sum()
    in_step("mixed")


@two_ranks
def test_deferred_call_failing_on_one_rank():
    """A deferred call that raises on one rank only is retried as an agreed call: every rank
    raises the mismatch (the ranks passed different dtypes), none is left behind."""
    i = dt.arange(2 * SIZE)
    f = rank_dependent((0, None), dtype="float64")
    g = rank_dependent((0, None), dtype=last_rank_only("float64", "int64"))
    with mismatch("bitwise_and", "x1"):
        np.bitwise_and(g, g)  # TypeError on the last rank only
        f.sum()
    assert i.shape == (2 * SIZE,)
    in_step("one rank fails")


@two_ranks
def test_one_call_more_and_far_back():
    a = dt.ones((2 * SIZE, 3))
    # one rank makes one deferred call more: the next call meets the extra one
    with different_calls("absolute", "sum"):
        a + 1.0
        if RANK == SIZE - 1:
            abs(a)
        a.sum()
    # the differing call is the 3rd since the last agreement: named with its position
    with mismatch("multiply", "x2") as info:
        a + 1.0
        a - 1.0
        a * last_rank_only(np.float32(2), 2.0)
        a.sum()
    assert_all_ranks(COMM, "call 3 since the ranks last agreed" in str(info.value),
                     str(info.value))
    # further back than the log reaches: still raised, with the advice to run eagerly
    with pytest.raises(dt.ArgumentMismatchError, match="DISTTENSOR_AGREEMENT=eager"):
        a * last_rank_only(2, 2.0)
        for _ in range(agreement.LOG_LENGTH + 2):
            a + 1.0
        a.sum()
    in_step("far back")


@two_ranks
def test_settle_and_eager():
    a = dt.ones((2 * SIZE, 3))
    with mismatch("multiply", "x2"):
        a * last_rank_only(2, 2.0)
        agreement.settle(a.grid.cart)
    with agreement.eager():
        with mismatch("multiply", "x2"):
            a * last_rank_only(2, 2.0)  # raised by the call itself
    agreement.settle(a.grid.cart)  # nothing pending: passes
    in_step("settle")
