"""disttensor.linalg.matrix_rank, pinv and matrix_power against NumPy float64 on 1-4 ranks,
under random layouts on 1-D and 2-D grids (uneven and empty blocks), real and complex, 2-D and
stacked; bad input raising on every rank.

Tolerances: ``pinv`` to ``100 max(M, N) eps |A^+|_2`` elementwise (both sides are SVD-based; a
well-conditioned random matrix keeps the bound meaningful), ``matrix_power`` to ``1e-12`` of
the product of norms (``|A|^n``), rank exact (random matrices with exact rank deficiency far
from the tolerance).
"""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor import linalg as L
from checks import (COMM, SIZE, check_blocks as check, collective_checks, dist, examples,
                    last_rank_only, mismatch)
from conftest import assert_raises_all
from disttensor.testing.strategies import layouts
from test_linalg import rand

EPS = np.finfo(np.float64).eps


@settings(max_examples=examples(25))
@given(st.data(), st.sampled_from([(6, 3), (3, 6), (5, 5), (7, 1), (1, 4), (0, 3), (4, 0)]),
       st.integers(0, 2), st.booleans())
@collective_checks
def test_matrix_rank_and_pinv(data, shape, deficiency, cplx):
    A = rand(shape, sum(shape) * 13 + deficiency, np.complex128 if cplx else np.float64)
    m, n = shape
    r = min(m, n)
    if deficiency and r > deficiency:  # exact rank r - deficiency: a product of thin factors
        k = r - deficiency
        A = rand((m, k), 5, A.dtype) @ rand((k, n), 6, A.dtype)
    a = dist(A, data.draw(layouts(shape, SIZE, 2)))
    rank = L.matrix_rank(a)
    check(rank, np.asarray(np.linalg.matrix_rank(A)), "matrix_rank", rtol=0, atol=0)
    check(np.linalg.matrix_rank(a), np.asarray(np.linalg.matrix_rank(A)), "np.linalg.matrix_rank",
          rtol=0, atol=0)
    want = np.linalg.pinv(A, rcond=max(shape + (1,)) * EPS)
    bound = 100 * max(shape + (1,)) * EPS * max(np.linalg.norm(want, 2) if want.size else 0, 1)
    got = L.pinv(a)
    assert got.shape == want.shape
    check(got, want, "pinv", rtol=0, atol=bound)
    check(np.linalg.pinv(a), want, "np.linalg.pinv", rtol=0, atol=bound)


@settings(max_examples=examples(15))
@given(st.data(), st.sampled_from([(2, 3, 3), (3, 2, 4), (2, 4, 2)]))
@collective_checks
def test_stacks_take_the_gather_path(data, shape):
    A = rand(shape, 11)
    a = dist(A, data.draw(layouts(shape, SIZE, 2)))
    check(L.matrix_rank(a), np.linalg.matrix_rank(A), "stacked matrix_rank", rtol=0, atol=0)
    check(L.pinv(a), np.linalg.pinv(A, rcond=max(shape[-2:]) * EPS), "stacked pinv",
          rtol=0, atol=1e-12 * max(1, np.abs(np.linalg.pinv(A)).max()))


@settings(max_examples=examples(25))
@given(st.data(), st.integers(0, 6), st.sampled_from([0, 1, 2, 3, 5, 8, -1, -3]),
       st.booleans())
@collective_checks
def test_matrix_power(data, k, p, cplx):
    A = rand((k, k), 7 * k + 1, np.complex128 if cplx else np.float64)
    if p < 0:  # I + a perturbation of norm 1/2: eigenvalues >= 1/2 in modulus, invertible
        A = np.eye(k) + A / (2 * max(np.linalg.norm(A, 2), 1e-300))
    else:
        A = A / max(np.linalg.norm(A, 2), 1.0)  # |A| <= 1
    a = dist(A, data.draw(layouts((k, k), SIZE, 2)))
    if p < 0 and k == 0:
        return
    want = np.linalg.matrix_power(A, p)
    got = L.matrix_power(a, p)
    assert got.distribution == a.distribution and got.grid is a.grid, "layout not like x"
    tol = 1e-12 * max(np.linalg.norm(A, 2), 1.0) ** abs(p) * \
        (np.linalg.cond(A) ** 2 if p < 0 and k else 1.0)
    check(got, want, f"matrix_power {p}", rtol=0, atol=tol)
    check(np.linalg.matrix_power(a, p), want, "np.linalg.matrix_power", rtol=0, atol=tol)
    if p == 1:
        assert got is not a, "matrix_power(x, 1) must return a new array"


def test_bad_input_raises_everywhere():
    rect = dist(np.ones((3, 4)), ((SIZE,), (0, None), None))
    vec = dist(np.ones(4), ((SIZE,), (0,), None))
    sq = dist(np.eye(3), ((SIZE,), (0, None), None))
    assert_raises_all(COMM, np.linalg.LinAlgError, "at least two-dimensional",
                      lambda: L.pinv(vec))
    assert_raises_all(COMM, np.linalg.LinAlgError, "square", lambda: L.matrix_power(rect, 2))
    assert_raises_all(COMM, TypeError, "integer", lambda: L.matrix_power(sq, 1.5))
    assert_raises_all(COMM, ValueError, "rtol", lambda: L.matrix_rank(sq, rtol=-1.0))
    assert_raises_all(COMM, TypeError, "rtol=", lambda: np.linalg.matrix_rank(sq, tol=1e-3))
    if SIZE > 1:  # arguments that differ between ranks
        with mismatch("matrix_power", "n"):
            L.matrix_power(sq, last_rank_only(3, 2))
        with mismatch("pinv", "rtol"):
            L.pinv(sq, rtol=last_rank_only(1e-3, 1e-6))
