"""The linear algebra added for issue 25 against NumPy float64/complex128 on 1-4 ranks, random
layouts on 1-D and 2-D grids (uneven and empty blocks): ``einsum`` with more operands, ``...``,
repeated labels and size-1 broadcasting (and its greedy order), ``kron``, ``inner``,
``lstsq`` (TSQR for tall matrices, gather path for wide ones; rank-deficient, 1-D and 2-D
right-hand sides), ``cond`` (every order, stacks, singular matrices), ``eig``/``eigvals``;
NumPy dispatch; bad input raising NumPy's exception on every rank.

Tolerances: products to ``1e-12 |A| |B|`` (absolute) as tests/mpi/test_linalg.py; least
squares solutions to ``1e-9`` relative to ``|x|`` (backward stable solvers on matrices of
condition below ~1e3, or exactly rank-deficient ones: the minimum-norm solution is well
conditioned), singular values to ``1e-12 |A|``; the gather path runs NumPy on the same
matrix, so ``eig`` and the gathered ``cond`` are compared to ``1e-12``.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from disttensor import linalg as L
from disttensor.linalg.einsum import greedy_pair
from checks import (COMM, SIZE, check_blocks as check, collective_checks, dist, examples, expect,
                    grid, last_rank_only, mismatch)
from conftest import assert_raises_all
from disttensor.testing.strategies import layouts


def rand(shape, seed, cplx=False):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    return a + 1j * rng.standard_normal(shape) if cplx else a


def tol(*arrays):
    return 1e-12 * np.prod([max(np.linalg.norm(a), 1.0) for a in arrays])


def lay(data, shape):
    return data.draw(layouts(shape, SIZE, 2))


# -- einsum --------------------------------------------------------------------------------------
EINSUM_CASES = [
    ("ij,jk,kl->il", (3, 4), (4, 5), (5, 2)),
    ("ij,jk,kl", (3, 4), (4, 0), (0, 2)),
    ("ab,bc,cd,de->ae", (2, 3), (3, 4), (4, 2), (2, 3)),
    ("...ij,...jk->...ik", (2, 3, 4), (4, 2)),
    ("i...,i...->...", (3, 2, 2), (3, 1, 2)),
    ("ii->i", (4, 4)),
    ("ii", (3, 3)),
    ("bii->bi", (2, 3, 3)),
    ("iij,jk->ik", (3, 3, 2), (2, 4)),
    ("ij->ji", (3, 5)),
    ("ij->", (3, 4)),
    ("ij,ij->ij", (1, 4), (3, 4)),
    ("i,j,k->ijk", (2,), (3,), (2,)),
    ("i,i", (5,), (5,)),
    ("ijk,jil->kl", (3, 2, 4), (2, 3, 2)),
]


@settings(max_examples=examples(10))
@given(st.data(), st.sampled_from(EINSUM_CASES), st.booleans())
@collective_checks
def test_einsum_many_operands(data, case, cplx):
    sub, shapes = case[0], case[1:]
    arrays = [rand(s, 7 * i + 1, cplx) for i, s in enumerate(shapes)]
    ops = [dist(a, lay(data, a.shape)) for a in arrays]
    want = np.einsum(sub, *arrays)
    check(dt.einsum(sub, *ops), want, sub, rtol=1e-12, atol=tol(*arrays))
    check(np.einsum(sub, *ops), want, "np." + sub, rtol=1e-12, atol=tol(*arrays))
    if len(ops) > 1:  # a NumPy operand next to DistArrays is a replicated value
        check(dt.einsum(sub, ops[0], *arrays[1:]), want, "mixed " + sub, rtol=1e-12,
              atol=tol(*arrays))


def test_greedy_order():
    # a x b, b x c, c x d with a = c = 100: contract the two small-result operands first
    sizes = {"a": 100, "b": 2, "c": 100, "d": 2}
    assert greedy_pair(["ab", "bc", "cd"], "ad", sizes) == (1, 2)
    assert greedy_pair(["ab", "bc", "cd"], "ad", dict(sizes, a=2, c=3, d=100)) == (0, 1)


@settings(max_examples=examples(8))
@given(st.data(), st.sampled_from([((3, 2), (2, 4)), ((4,), (2, 3)), ((2, 3, 2), (3,)),
                                   ((3,), (0,)), ((2, 2), (3, 2)), ((), (3,))]),
       st.booleans())
@collective_checks
def test_kron_inner(data, case, cplx):
    sa, sb = case
    A, B = rand(sa, 3, cplx), rand(sb, 4)
    a = dist(A, lay(data, sa)) if sa else dt.from_global(A, grid=grid((SIZE,)))
    b = dist(B, lay(data, sb))
    check(L.kron(a, b), np.kron(A, B), "kron", rtol=1e-12, atol=1e-14)
    check(np.kron(a, b), np.kron(A, B), "np.kron", rtol=1e-12, atol=1e-14)
    check(dt.kron(b, a), np.kron(B, A), "kron swapped", rtol=1e-12, atol=1e-14)
    if not sa or sa[-1] == sb[-1]:
        check(np.inner(a, b), np.inner(A, B), "np.inner", rtol=1e-12, atol=tol(A, B))
    if sa and sa[-1] == sb[-1]:
        check(dt.inner(b, a), np.inner(B, A), "inner swapped", rtol=1e-12, atol=tol(A, B))


# -- lstsq -----------------------------------------------------------------------------------
@settings(max_examples=examples(10))
@given(st.data(), st.integers(1, 9), st.integers(1, 5), st.sampled_from([None, 1, 3]),
       st.booleans(), st.booleans())
@collective_checks
def test_lstsq(data, m, n, k, deficient, cplx):
    A = rand((m, n), m * 10 + n, cplx)
    if deficient and n >= 2:
        A[:, -1] = A[:, 0]  # exactly rank-deficient: NumPy's minimum-norm solution
    B = rand((m,) if k is None else (m, k), 5, cplx)
    a, b = dist(A, lay(data, A.shape)), dist(B, lay(data, B.shape))
    X, res, rank, s = np.linalg.lstsq(A, B)
    for name, got in (("dt", L.lstsq(a, b)), ("np", np.linalg.lstsq(a, b))):
        x, r, rk, sv = got
        scale = 1e-9 * max(np.linalg.norm(X), 1.0)
        check(x, X, f"{name} lstsq x (m={m}, n={n})", rtol=1e-9, atol=scale)
        check(r, res, f"{name} residuals", rtol=1e-8, atol=1e-10 * max(np.linalg.norm(B), 1))
        expect(rk == rank and isinstance(rk, int), f"{name} rank {rk} != {rank}")
        check(sv, s, f"{name} singular values", rtol=1e-10, atol=tol(A))
        expect(x.split == (None,) * x.ndim, "x not replicated")
    from disttensor.linalg import decompositions as D
    T = np.concatenate([A] * (40 // m + 1))  # taller than 2 chunks of max(2, n) rows per rank
    D._R_CHUNK, old = 2, D._R_CHUNK  # the chunked local R (a flat TSQR tree on the rank)
    try:
        x, r, rk, sv = L.lstsq(dist(T, lay(data, T.shape)), T[:, 0])
    finally:
        D._R_CHUNK = old
    want = np.linalg.lstsq(T, T[:, 0])
    check(x, want[0], "lstsq x, chunked R", rtol=1e-9, atol=1e-9)
    check(sv, want[3], "singular values, chunked R", rtol=1e-10, atol=tol(T))
    x1 = L.lstsq(a, b, rcond=0.5)[0]  # a large cutoff: fewer singular values kept
    check(x1, np.linalg.lstsq(A, B, rcond=0.5)[0], "rcond=0.5", rtol=1e-9,
          atol=1e-9 * max(np.linalg.norm(X), 1.0))


# -- cond ----------------------------------------------------------------------------------------
COND_ORDERS = [None, 2, -2, 1, -1, np.inf, -np.inf, "fro", "nuc"]


@settings(max_examples=examples(8))
@given(st.data(), st.integers(1, 6), st.sampled_from(COND_ORDERS), st.booleans())
@collective_checks
def test_cond(data, n, p, cplx):
    A = rand((n, n), n, cplx)
    a = dist(A, lay(data, A.shape))
    for q in COND_ORDERS:
        check(L.cond(a, q), np.linalg.cond(A, q), f"cond p={q}", rtol=1e-9)
    check(np.linalg.cond(a, p), np.linalg.cond(A, p), f"np cond p={p}", rtol=1e-9)
    T = rand((3, n, n), 1, cplx)
    t = dist(T, lay(data, T.shape))
    c = L.cond(t, p)
    check(c, np.linalg.cond(T, p), f"stack cond p={p}", rtol=1e-12)
    expect(c.split[0] == t.split[0], "stack cond not split like the batch axis")
    W = rand((n + 2, n), 2)  # rectangular: p None/2/-2 only
    w = dist(W, lay(data, W.shape))
    for q in (None, 2, -2):
        check(L.cond(w, q), np.linalg.cond(W, q), f"rectangular cond p={q}", rtol=1e-9)
    Z = np.zeros((n, n))
    check(L.cond(dist(Z, lay(data, Z.shape))), np.linalg.cond(Z), "cond of 0 is inf")


# -- eig ----------------------------------------------------------------------------------------
@settings(max_examples=examples(6))
@given(st.data(), st.integers(1, 6), st.booleans(), st.booleans())
@collective_checks
def test_eig(data, n, cplx, stack):
    A = rand((2, n, n) if stack else (n, n), n + 3, cplx)
    a = dist(A, lay(data, A.shape))
    W, V = np.linalg.eig(A)
    w, v = L.eig(a)
    check(w, W, "eig w", rtol=1e-12, atol=1e-14)
    check(v, V, "eig v", rtol=1e-12, atol=1e-14)
    expect(v.distribution == a.distribution, f"eig v layout {v.distribution}")
    expect(w.split == a.split[:-2] + (None,), f"eig w layout {w.distribution}")
    w2, v2 = np.linalg.eig(a)
    check(w2, W, "np eig w", rtol=1e-12, atol=1e-14)
    check(np.linalg.eigvals(a), np.linalg.eigvals(A), "eigvals", rtol=1e-12, atol=1e-14)
    check(L.eigvals(a), np.linalg.eigvals(A), "L.eigvals", rtol=1e-12, atol=1e-14)


# -- bad input ----------------------------------------------------------------------------------
def test_bad_input_on_every_rank(monkeypatch):
    g = grid((SIZE,))
    a = dt.from_global(rand((5, 3), 1), grid=g)
    v = dt.from_global(rand((5,), 2), grid=g)
    sq = dt.from_global(rand((3, 3), 3), grid=g)
    LinAlgError = np.linalg.LinAlgError
    assert_raises_all(COMM, LinAlgError, "1-dimensional array given", lambda: L.lstsq(v, v))
    assert_raises_all(COMM, LinAlgError, "Incompatible dimensions", lambda: L.lstsq(a, v[:4]))
    assert_raises_all(COMM, LinAlgError, "3-dimensional array given",
                      lambda: L.lstsq(a, dt.zeros((5, 2, 2), grid=g)))
    assert_raises_all(COMM, LinAlgError, "must be square", lambda: L.eig(a))
    assert_raises_all(COMM, LinAlgError, "at least two-dimensional", lambda: L.eigvals(v))
    assert_raises_all(COMM, LinAlgError, "infs or NaNs",
                      lambda: L.eig(dt.from_global(np.full((3, 3), np.nan), grid=g)))
    assert_raises_all(COMM, LinAlgError, "not defined on empty",
                      lambda: L.cond(dt.zeros((0, 0), grid=g)))
    assert_raises_all(COMM, LinAlgError, "must be square", lambda: L.cond(a, 1))
    assert_raises_all(COMM, ValueError, "Invalid norm order", lambda: L.cond(sq, 3))
    assert_raises_all(COMM, ValueError, "operands could not be broadcast",
                      lambda: dt.einsum("ij,jk,kl", a, a, a))
    assert_raises_all(COMM, ValueError, "collapsing index 'i'", lambda: dt.einsum("ii", a))
    assert_raises_all(COMM, ValueError, "no '...' ellipsis",
                      lambda: dt.einsum("...i->i", a))
    assert_raises_all(COMM, ValueError, "never appeared", lambda: dt.einsum("ij->k", a))
    assert_raises_all(COMM, ValueError, "not aligned", lambda: L.inner(a, sq[:, :2]))
    monkeypatch.setenv("DISTTENSOR_GATHER_LIMIT", "40")
    for fn in (L.eig, L.eigvals, lambda x: L.cond(x, 1)):
        assert_raises_all(COMM, ValueError, "DISTTENSOR_GATHER_LIMIT", lambda: fn(sq))
    assert_raises_all(COMM, ValueError, "DISTTENSOR_GATHER_LIMIT",
                      lambda: L.lstsq(a[:2], v[:2]))
    tall = dt.from_global(rand((40, 2), 9), grid=g)  # TSQR paths are not guarded
    assert L.lstsq(tall, tall)[2] == 2 and L.cond(tall).shape == ()


def test_arguments_differing_between_ranks():
    if SIZE == 1:
        pytest.skip("needs 2 ranks")
    a = dt.from_global(rand((6, 3), 1), grid=grid((SIZE,)))
    with mismatch("lstsq", "rcond"):
        L.lstsq(a, a, last_rank_only(0.1, None))
    with mismatch("einsum", "subscripts"):
        dt.einsum(last_rank_only("ij->ji", "ij->ij"), a)
    with mismatch("cond", "p"):
        L.cond(a, last_rank_only(-2, 2))
