"""The one-pass moments of var/std (disttensor.routines._moments) against NumPy's two-pass
variance: contiguous and strided blocks, chunk boundaries, empty and 0-d blocks, integers,
float32 and complex input, a large mean (where the one-pass sum of squares would cancel), and
the merge over parts in any split."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor.routines import _moments
from disttensor.routines._moments import CHUNK, combine_over, local_moments, merge


def check(block, rtol=1e-13):
    wd = np.complex128 if np.asarray(block).dtype.kind == "c" else np.float64
    n, mean, m2 = local_moments(block, wd)
    assert n == block.size
    if block.size == 0:
        assert (mean, m2) == (0.0, 0.0)
        return
    ref = np.asarray(block).astype(wd)
    np.testing.assert_allclose(mean, ref.mean(), rtol=rtol, atol=1e-300)
    np.testing.assert_allclose(m2, np.var(ref) * block.size, rtol=rtol,
                               atol=1e-12 * np.abs(ref).max() ** 2)


@pytest.mark.parametrize("n", [1, 2, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 7])
def test_chunk_boundaries(n):
    check(np.random.default_rng(n).standard_normal(n))


def test_blocks_of_every_kind():
    rng = np.random.default_rng(1)
    check(rng.standard_normal((300, 170)))
    check(rng.standard_normal((300, 170))[3:-2, 5:150])  # a halo'd interior: strided rows
    check(rng.standard_normal((4, 3 * CHUNK))[:, 1:])  # rows longer than a chunk
    check(rng.standard_normal((40, 50, 3))[::2, 1:, :])
    check(rng.standard_normal((2000,)).astype(np.float32))
    check(rng.integers(-50, 50, (123, 77)))
    check(rng.standard_normal(5000) + 1j * rng.standard_normal(5000))
    check(np.zeros((0, 4)))
    check(np.array(2.5))
    check(np.full(7, 3.0))  # zero variance


def test_large_mean_does_not_cancel():
    x = 1e8 + np.random.default_rng(2).standard_normal(3 * CHUNK + 11)
    n, mean, m2 = local_moments(x, np.float64)
    # sum(x^2) - n mean^2 would lose ~16 digits here; NumPy's two-pass keeps ~8
    np.testing.assert_allclose(m2 / n, np.var(x), rtol=1e-8)
    assert abs(m2 / n - 1.0) < 0.05


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 300), cuts=st.lists(st.integers(0, 300), max_size=5),
       seed=st.integers(0, 2**32 - 1), shift=st.sampled_from([0.0, 1e3, -1e6]))
def test_merge_of_parts_equals_the_whole(n, cuts, seed, shift):
    x = shift + np.random.default_rng(seed).standard_normal(n)
    bounds = sorted({0, n, *(c for c in cuts if c <= n)})
    acc = (0, 0.0, 0.0)
    for a, b in zip(bounds[:-1], bounds[1:]):
        acc = merge(acc, local_moments(x[a:b], np.float64))
    assert acc[0] == n
    if n:
        np.testing.assert_allclose(acc[1], x.mean(), rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(acc[2] / n, np.var(x), rtol=1e-9, atol=1e-13)


def test_combine_over_one_rank_is_identity():
    m = (5, 1.5, 2.0)
    assert combine_over(None, m) == m


def test_small_chunks(monkeypatch):
    monkeypatch.setattr(_moments, "CHUNK", 7)
    check(np.random.default_rng(3).standard_normal((50, 3)))
    check(np.random.default_rng(4).standard_normal((50, 30))[:, 2:])
