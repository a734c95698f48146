"""disttensor.testing.assertions in one process (a one-rank job): numpy.testing's semantics,
the messages, bad arguments; tests/mpi/test_testing_assertions.py has the collective side."""
from __future__ import annotations

import re

import numpy as np
import pytest

import disttensor as dt
from disttensor.testing.assertions import (assert_adjoint, assert_all_ranks, assert_allclose,
                                           assert_array_equal, assert_raises_collectively,
                                           assert_same_on_all_ranks)


def test_allclose_follows_numpy_semantics():
    a = np.array([1.0, 2.0, np.inf, np.nan])
    assert_allclose(a, a.copy())
    assert_allclose(a, a + 1e-8, rtol=1e-7)  # rtol relative to |desired|
    assert_allclose(np.zeros(3), 1e-9, atol=1e-8)  # a scalar broadcasts
    assert_allclose(1, 1)
    with pytest.raises(AssertionError, match=r"Mismatched elements: 1 / 4 on rank 0"):
        assert_allclose(a, a, equal_nan=False)
    with pytest.raises(AssertionError, match=r"shapes \(4,\), \(3,\) mismatch"):
        assert_allclose(a, a[:3])
    with pytest.raises(AssertionError, match=r"shapes \(3,\), \(\) mismatch"):
        assert_allclose(np.zeros(3), 0.0, strict=True)
    with pytest.raises(ValueError, match="rtol and atol must be >= 0"):
        assert_allclose(a, a, atol=-1)


def test_array_equal_follows_numpy_semantics():
    assert_array_equal([1, 2], np.array([1, 2]))
    assert_array_equal(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]))
    assert_array_equal(np.array(["a", "b"]), np.array(["a", "b"]))
    with pytest.raises(AssertionError, match=r"dtypes int64, int32 mismatch"):
        assert_array_equal(np.arange(3), np.arange(3, dtype=np.int32), strict=True)
    with pytest.raises(AssertionError, match=r"Mismatched elements: 1 / 2 on rank 0"):
        assert_array_equal(np.array(["a", "b"]), np.array(["a", "c"]))


def test_message_reports_worst_element_in_global_coordinates():
    g = np.arange(12.0).reshape(4, 3)
    x = dt.from_global(g, split=(None,))
    bad = g.copy()
    bad[3, 1] += 4.0
    bad[0, 2] -= 0.5
    with pytest.raises(AssertionError) as info:
        assert_allclose(x, bad, err_msg="note")
    assert str(info.value) == (
        "Not equal to tolerance rtol=1e-07, atol=0\nnote\n"
        "Mismatched elements: 2 / 12 (16.7%) on rank 0\n"
        "Max absolute difference among violations: 4 at global index (3, 1) on rank 0 "
        "(actual 10.0, desired 14.0)\n"
        "Max relative difference among violations: 0.333333 at global index (0, 2) on rank 0 "
        "(actual 2.0, desired 1.5)\n"
        "rank 0: 2 mismatched in its block [0:4, 0:3]")


def test_unsigned_and_bool_differences():
    with pytest.raises(AssertionError, match=r"Max absolute difference among violations: 2 "):
        assert_array_equal(np.array([3], np.uint8), np.array([5], np.uint8))
    with pytest.raises(AssertionError, match=r"index \(1,\)"):
        assert_array_equal(np.array([True, True]), np.array([True, False]))


def test_zero_dim_distarray_and_distarray_pairs():
    x = dt.from_global(np.arange(6.0))
    assert_allclose(dt.sum(x), 15.0)
    assert_allclose(x, dt.from_global(np.arange(6.0), split=(None,)))
    with pytest.raises(AssertionError, match=r"global index \(5,\)"):
        assert_array_equal(x, dt.from_global(np.array([0, 1, 2, 3, 4, 9.0])))


def test_assert_all_ranks_and_same_value():
    assert_all_ranks(True)
    with pytest.raises(AssertionError, match=r"^failed on rank 0 of 1\nrank 0: why$"):
        assert_all_ranks(0, "why")
    assert_same_on_all_ranks((1, [2.0, np.arange(3)], {"a": None}))


def test_raises_collectively():
    assert assert_raises_collectively(KeyError, {}.__getitem__, "k").args == ("k",)
    with assert_raises_collectively(ValueError, match=r"^bad \d$") as ctx:
        raise ValueError("bad 7")
    assert str(ctx.value) == "bad 7"
    with pytest.raises(AssertionError, match=r"rank 0: raised KeyError"):
        assert_raises_collectively(ValueError, {}.__getitem__, "k")
    with pytest.raises(AssertionError, match=r"rank 0: did not raise"):
        with assert_raises_collectively(ValueError):
            pass
    with pytest.raises(KeyboardInterrupt):  # not an Exception: passes through untouched
        with assert_raises_collectively(ValueError):
            raise KeyboardInterrupt
    with pytest.raises(TypeError, match="exception class"):
        assert_raises_collectively("ValueError", int, "x")
    with pytest.raises(TypeError, match="without fn"):
        assert_raises_collectively(ValueError, match="x", extra=1)


def test_adjoint_real_and_complex():
    rng = np.random.default_rng(0)
    m = rng.standard_normal((4, 6)) + 1j * rng.standard_normal((4, 6))
    x, y = rng.standard_normal(6) + 0j, rng.standard_normal(4) + 1j
    assert_adjoint(lambda v: m @ v, lambda w: m.conj().T @ w, x, y)
    with pytest.raises(AssertionError, match=r"<f\(x\), y> = .*\n<x, f_adjoint\(y\)> = "):
        assert_adjoint(lambda v: m @ v, lambda w: m.T @ w, x, y)  # forgot the conjugate
    a = dt.from_global(rng.standard_normal((5, 2)))
    assert_adjoint(lambda v: 3 * v, lambda w: 3 * w, a, a.copy(), rtol=1e-12)
    assert_adjoint(lambda v: np.float32(2) * v, lambda w: 2 * w, np.ones(3, np.float32),
                   np.ones(3, np.float32))
    with pytest.raises(AssertionError, match=re.escape("f raised ZeroDivisionError")):
        assert_adjoint(lambda v: 1 / 0, lambda w: w, a, a)
    with pytest.raises(ValueError, match="inner must be"):
        assert_adjoint(lambda v: v, lambda w: w, a, a, inner="per-rank")
