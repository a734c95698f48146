"""disttensor.linalg against NumPy float64 on 1-4 ranks: matmul / @ / np.matmul under every
pair of layouts on 1-D and 2-D grids (uneven and empty blocks, operands on grids of different
shapes, replicated operands), each matmul plan forced once, batched and 1-D operands, complex;
tensordot, einsum, vecdot, outer, diagonal, trace, cross; vector/matrix norms and
``linalg.norm``; TSQR ``qr`` and ``svd``; the gather-path solvers; bad input raising on every
rank, the gather guard.

Tolerances: products to ``1e-12 |A|_F |B|_F`` (absolute, elementwise; a sum of ``k`` products
in another order differs by at most ``k eps |A||B|``); QR/SVD reconstruction and orthogonality
to ``c m n eps`` with ``c = 10``, ``R`` equal to NumPy's up to row signs and singular values to
``1e-12 |A|``; ``solve`` by the residual ``|A x - b| <= 1e-10 |A| |x|``.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from disttensor import linalg as L
from disttensor.linalg import matrix_product as MP, operands as O, summa as S
from checks import (COMM, SIZE, check_blocks as check, collective_checks, dist, examples, expect,
                    grid, last_rank_only, mismatch)
from conftest import assert_raises_all
from disttensor.testing.strategies import layouts

EPS = np.finfo(np.float64).eps


def rand(shape, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def prod_tol(a, b):
    return 1e-12 * max(np.linalg.norm(a), 1.0) * max(np.linalg.norm(b), 1.0)


dims_st = st.integers(0, 7)


# -- matmul --------------------------------------------------------------------------------
@settings(max_examples=examples(40))
@given(st.data(), dims_st, dims_st, dims_st, st.booleans())
@collective_checks
def test_matmul_2d_any_layouts(data, m, k, n, cplx):
    dt_ = np.complex128 if cplx else np.float64
    A, B = rand((m, k), m * 100 + k, dt_), rand((k, n), n * 7 + 1, dt_)
    la = data.draw(layouts((m, k), SIZE, 2))
    lb = data.draw(layouts((k, n), SIZE, 2))
    a, b = dist(A, la), dist(B, lb)
    c = a @ b
    check(c, A @ B, "a @ b", rtol=1e-12, atol=prod_tol(A, B))
    # output rows like a (same ownership), on a's grid
    expect(c.grid is a.grid, "output not on a's grid")
    expect(c.split[0] == a.split[0] and (a.split[0] is None or
                                         c.distribution.sizes(0) == a.distribution.sizes(0)),
           f"rows not like a: {c.distribution} vs {a.distribution}")
    if b.grid.dims == a.grid.dims and b.split[1] is not None and b.split[1] != a.split[0]:
        expect(c.split[1] == b.split[1] and c.distribution.sizes(1) == b.distribution.sizes(1),
               f"columns not like b: {c.distribution} vs {b.distribution}")
    check(np.matmul(a, b), A @ B, "np.matmul", rtol=1e-12, atol=prod_tol(A, B))


@settings(max_examples=examples(20))
@given(st.data(), st.integers(1, 7), st.integers(0, 6), st.integers(1, 7),
       st.sampled_from(["aligned", "summa", "target", "rows", "cols", "k", "summa-after-move"]))
@collective_checks
def test_matmul_every_plan(data, m, k, n, plan):
    """Each plan, forced, gives NumPy's product (uneven/empty blocks from the layouts)."""
    A, B = rand((m, k), 3), rand((k, n), 4)
    if plan in ("summa",):
        dims = data.draw(st.sampled_from([d for d in [(1, SIZE), (SIZE, 1), (2, SIZE // 2)]
                                          if np.prod(d) == SIZE]))
        from disttensor.testing.strategies import split_sizes
        sa = data.draw(split_sizes((m, k), dims, (0, 1)))
        sb = data.draw(split_sizes((k, n), dims, (0, 1)))
        a, b = dist(A, (dims, (0, 1), sa)), dist(B, (dims, (0, 1), sb))
    else:
        a = dist(A, data.draw(layouts((m, k), SIZE, 2)))
        b = dist(B, data.draw(layouts((k, n), SIZE, 2)))
    grid_ = a.grid
    shape = (m, n)
    osplit, osizes = MP._output_layout(a, b, shape)
    out_d = O.distribution_on(shape, grid_, osplit, osizes)
    plans = {p[1]: p for p in _all_plans(a, b, grid_, out_d)}
    if plan not in plans:
        return
    c = _run_plan(a, b, grid_, out_d, plans[plan])
    check(c, A @ B, f"plan {plan}", rtol=1e-12, atol=prod_tol(A, B))
    if "summa" in plan:  # narrow panels: several per block, pipelined broadcasts
        S._PANEL, old = 2, S._PANEL
        try:
            c = _run_plan(a, b, grid_, out_d, plans[plan])
        finally:
            S._PANEL = old
        check(c, A @ B, f"plan {plan} narrow panels", rtol=1e-12, atol=prod_tol(A, B))


def _all_plans(a, b, g, out_d):
    """Every candidate of MP._plan_2d (it returns the cheapest; collect all by masking)."""
    found, seen = [], set()
    orig_min = min

    def capture(plans, key):
        found.extend(plans)
        return orig_min(plans, key=key)
    MP.min = capture
    try:
        MP._plan_2d(a, b, g, out_d)
    finally:
        del MP.min
    return [p for p in found if not (p[1] in seen or seen.add(p[1]))]


def _run_plan(a, b, g, out_d, pl):
    _, name, arg = pl
    if name == "aligned":
        c = MP._aligned_product(a, b, g, MP._aligned_layout(a, b))
    elif name == "summa":
        c = S.summa(a, b, g)
    else:
        g2, da, db = arg
        a2, b2 = O.laid_out(a, g2, da), O.laid_out(b, g2, db)
        c = S.summa(a2, b2, g2) if name == "summa-after-move" else \
            MP._aligned_product(a2, b2, g2, MP._aligned_layout(a2, b2))
    return O.laid_out(c, g, out_d)


@settings(max_examples=examples(25))
@given(st.data(), st.sampled_from([
    ((5,), (5,)), ((5,), (5, 3)), ((4, 5), (5,)), ((3, 4, 5), (5, 2)), ((4, 5), (2, 5, 3)),
    ((2, 1, 3, 4), (5, 4, 2)), ((1, 3, 4), (2, 4, 0)), ((0, 2, 3), (3, 3)), ((5,), (2, 5, 3)),
    ((2, 3, 4), (4,))]))
@collective_checks
def test_matmul_batched_and_vectors(data, shapes):
    sa, sb = shapes
    A, B = rand(sa, 1), rand(sb, 2)
    a = dist(A, data.draw(layouts(sa, SIZE, 2)))
    b = dist(B, data.draw(layouts(sb, SIZE, 2)))
    want = np.matmul(A, B)
    got = L.matmul(a, b)
    check(got, want, f"matmul {sa} @ {sb}", rtol=1e-12, atol=prod_tol(A, B))


@collective_checks
def test_matmul_numpy_operand_and_dtypes():
    A, B = rand((6, 5), 1, np.complex128), rand((5, 3), 2)
    a = dt.from_global(A, grid=grid((SIZE,)), split=(0, None))
    check(a @ B, A @ B, "dist @ numpy", rtol=1e-12, atol=prod_tol(A, B))
    check(B.T @ a.T, B.T @ A.T, "numpy @ dist", rtol=1e-12, atol=prod_tol(A, B))
    ai = dt.from_global(np.arange(12).reshape(3, 4), grid=grid((SIZE,)))
    bi = np.arange(8).reshape(4, 2)
    check(L.matmul(ai, bi), np.arange(12).reshape(3, 4) @ bi, "int matmul")
    af = dt.from_global(A.real.astype(np.float32), grid=grid((SIZE,)), split=(None, 0))
    r = af @ dt.from_global(B.astype(np.float32), grid=grid((SIZE,)))
    check(r, A.real.astype(np.float32) @ B.astype(np.float32), "float32", rtol=1e-5, atol=1e-5)
    # the array API names in np.linalg dispatch too
    R = A.real
    ar = dt.from_global(R, grid=grid((SIZE,)), split=(None, 0))
    tol = dict(rtol=1e-12, atol=1e-12 * np.linalg.norm(R) ** 2)
    check(np.linalg.matmul(ar, ar.mT), R @ R.T, "np.linalg.matmul", **tol)
    check(ar.mT, R.T, "mT")
    check(np.linalg.vector_norm(ar, axis=0), np.linalg.vector_norm(R, axis=0), "vector_norm",
          **tol)
    check(np.linalg.matrix_norm(ar, ord=2), np.linalg.matrix_norm(R, ord=2), "matrix_norm", **tol)
    check(np.linalg.svdvals(ar), np.linalg.svdvals(R), "svdvals", **tol)
    check(np.linalg.diagonal(ar, offset=1), np.linalg.diagonal(R, offset=1), "linalg.diagonal")
    check(np.linalg.tensordot(ar, ar, axes=2), np.linalg.tensordot(R, R, axes=2), "tensordot",
          **tol)


@settings(max_examples=examples(10))
@given(st.data(), st.integers(1, 7), st.integers(1, 7), st.integers(1, 7))
@collective_checks
def test_matmul_adjoint(data, m, k, n):
    """Dot-product test: <C, A B> = <C B^H, A> = <A^H C, B> with every product distributed
    (SUMMA on 2-D grids, the other plans elsewhere)."""
    A, B, C = rand((m, k), 5, np.complex128), rand((k, n), 6, np.complex128), \
        rand((m, n), 7, np.complex128)
    dims = data.draw(st.sampled_from([d for d in [(SIZE,), (1, SIZE), (2, SIZE // 2)]
                                      if np.prod(d) == SIZE]))
    sp = (0, 1) if len(dims) == 2 else (0, None)
    a, b, c = (dist(X, (dims, sp, (None, None))) for X in (A, B, C))

    def inner(x, y):
        return complex(dt.sum(np.conj(x) * y).item())
    lhs = inner(c, a @ b)
    mid = inner(c @ np.conj(b).mT, a)
    rhs = inner(np.conj(a).mT @ c, b)
    scale = np.linalg.norm(A) * np.linalg.norm(B) * np.linalg.norm(C)
    expect(abs(lhs - mid) <= 1e-12 * scale and abs(lhs - rhs) <= 1e-12 * scale,
           f"adjoint: {lhs} {mid} {rhs}")
    expect(abs(lhs - np.vdot(C, A @ B)) <= 1e-12 * scale, "adjoint vs numpy")


# -- contractions -----------------------------------------------------------------------------
@settings(max_examples=examples(25))
@given(st.data(), st.sampled_from([
    ("ij,jk->ik", (3, 4), (4, 5)), ("ij,jk->ki", (3, 0), (0, 2)),
    ("bij,bjk->bik", (2, 3, 4), (2, 4, 2)),
    ("ij,ij->i", (4, 3), (4, 3)), ("ijk,kj->i", (2, 3, 4), (4, 3)), ("ij,kl->ijkl", (2, 3), (2, 2)),
    ("ij,jk", (3, 4), (4, 2)), ("ab,cb->", (3, 4), (2, 4)), ("iab,bc->ci", (2, 3, 5), (5, 4))]))
@collective_checks
def test_einsum(data, case):
    sub, sa, sb = case
    A, B = rand(sa, 11), rand(sb, 12)
    a = dist(A, data.draw(layouts(sa, SIZE, 2)))
    b = dist(B, data.draw(layouts(sb, SIZE, 2)))
    want = np.einsum(sub, A, B)
    check(dt.einsum(sub, a, b), want, sub, rtol=1e-12, atol=prod_tol(A, B))
    check(np.einsum(sub, a, b), want, "np." + sub, rtol=1e-12, atol=prod_tol(A, B))


@settings(max_examples=examples(20))
@given(st.data(), st.sampled_from([
    ((3, 4, 5), (4, 5, 2), 2), ((3, 4), (4, 2), 1), ((2, 3), (4,), 0),
    ((3, 4, 5), (5, 3), ([0, 2], [1, 0])), ((4, 0), (0, 3), 1)]))
@collective_checks
def test_tensordot_dot_outer(data, case):
    sa, sb, axes = case
    A, B = rand(sa, 21), rand(sb, 22)
    a = dist(A, data.draw(layouts(sa, SIZE, 2)))
    b = dist(B, data.draw(layouts(sb, SIZE, 2)))
    tol = dict(rtol=1e-12, atol=prod_tol(A, B))
    check(dt.tensordot(a, b, axes), np.tensordot(A, B, axes), f"tensordot {axes}", **tol)
    check(np.tensordot(a, b, axes), np.tensordot(A, B, axes), "np.tensordot", **tol)
    check(np.outer(a, b), np.outer(A, B), "outer", **tol)
    if len(sa) <= 2 and len(sb) <= 2 and sa[-1] == sb[0]:
        check(np.dot(a, b), np.dot(A, B), "np.dot", **tol)


@settings(max_examples=examples(20))
@given(st.data(), st.sampled_from([((4, 3), (4, 3), -1), ((4, 3), (3,), -1), ((2, 4, 3), (4, 1), 1),
                                   ((5,), (5,), 0), ((3, 0), (3, 0), 1)]), st.booleans())
@collective_checks
def test_vecdot(data, case, cplx):
    sa, sb, axis = case
    dt_ = np.complex128 if cplx else np.float64
    A, B = rand(sa, 31, dt_), rand(sb, 32, dt_)
    a = dist(A, data.draw(layouts(sa, SIZE, 2)))
    b = dist(B, data.draw(layouts(sb, SIZE, 2)))
    want = np.sum(np.conj(A) * B, axis=axis)
    check(dt.vecdot(a, b, axis=axis), want, "vecdot", rtol=1e-12, atol=prod_tol(A, B))
    check(np.vecdot(a, b, axis=axis), want, "np.vecdot", rtol=1e-12, atol=prod_tol(A, B))


@settings(max_examples=examples(20))
@given(st.data(), st.sampled_from([(4, 4), (3, 5), (5, 3), (2, 3, 4), (0, 3)]),
       st.integers(-3, 3))
@collective_checks
def test_diagonal_trace_cross(data, shape, offset):
    A = rand(shape, 41)
    a = dist(A, data.draw(layouts(shape, SIZE, 2)))
    check(np.diagonal(a, offset), np.diagonal(A, offset), "diagonal", rtol=0)
    check(np.trace(a, offset), np.trace(A, offset), "trace", rtol=1e-12, atol=1e-12)
    if len(shape) == 3:
        check(np.diagonal(a, offset, 2, 0), np.diagonal(A, offset, 2, 0), "diagonal(2, 0)")
        check(np.linalg.trace(a, offset=offset), np.linalg.trace(A, offset=offset),
              "linalg.trace", rtol=1e-12, atol=1e-12)
    V, W = rand((4, 3), 42), rand((4, 3), 43)
    lay = data.draw(layouts((4, 3), SIZE, 2))
    check(np.cross(dist(V, lay), dist(W, lay)), np.cross(V, W), "cross", rtol=1e-12, atol=1e-14)


# -- norms -----------------------------------------------------------------------------------------
@settings(max_examples=examples(20))
@given(st.data(), st.sampled_from([(5,), (4, 3), (3, 6), (2, 3, 4), (0, 3)]), st.booleans())
@collective_checks
def test_norms(data, shape, cplx):
    A = rand(shape, 51, np.complex128 if cplx else np.float64)
    a = dist(A, data.draw(layouts(shape, SIZE, 2)))
    tol = dict(rtol=1e-12, atol=1e-12 * max(1.0, np.linalg.norm(A)))
    full = A.size > 0
    check(L.norm(a), np.linalg.norm(A), "norm", **tol)
    check(np.linalg.norm(a, keepdims=True), np.linalg.norm(A, keepdims=True), "keepdims", **tol)
    for ord in (2, 1, 0, 3.5) + ((np.inf, -np.inf, -1) if full else ()):
        check(L.vector_norm(a, ord=ord), np.linalg.vector_norm(A, ord=ord), f"vnorm {ord}",
              **tol)
        check(L.norm(a, ord, axis=-1), np.linalg.norm(A, ord, axis=-1), f"norm ax -1 {ord}",
              **tol)
    if len(shape) >= 2:
        for ord in ("fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf) if full else ("fro",):
            check(L.matrix_norm(a, ord=ord), np.linalg.matrix_norm(A, ord=ord), f"mnorm {ord}",
                  **tol)
            check(L.norm(a, ord, axis=(-1, 0), keepdims=True),
                  np.linalg.norm(A, ord, axis=(-1, 0), keepdims=True), f"norm {ord} (-1,0)",
                  **tol)


# -- QR / SVD ------------------------------------------------------------------------------------
def _unsign_rows(r):
    d = np.sign(np.diag(r)).astype(r.dtype)
    d[d == 0] = 1
    return r * d[:, None]


@settings(max_examples=examples(25))
@given(st.data(), st.integers(0, 12), st.integers(1, 4), st.booleans())
@collective_checks
def test_qr_tsqr(data, m, n, cplx):
    A = rand((m, n), 61 + m, np.complex128 if cplx else np.float64)
    a = dist(A, data.draw(layouts((m, n), SIZE, 2)))
    q, r = L.qr(a)
    Q, R = q.to_numpy(), r.to_numpy()
    k = min(m, n)
    expect(Q.shape == (m, k) and R.shape == (k, n), f"shapes {Q.shape} {R.shape}")
    bound = 10 * max(m, 1) * n * EPS
    nA = max(np.linalg.norm(A), 1e-300)
    expect(np.linalg.norm(Q @ R - A) <= bound * nA, "QR != A")
    expect(np.linalg.norm(Q.conj().T @ Q - np.eye(k)) <= bound, "Q not orthonormal")
    expect(np.allclose(np.triu(R), R), "R not upper triangular")
    Rn = np.linalg.qr(A, mode="r")
    expect(np.allclose(np.abs(np.diag(R)), np.abs(np.diag(Rn)), rtol=1e-10, atol=1e-12 * nA),
           "|diag R| differs from NumPy's")
    if m >= n and np.all(np.abs(np.diag(Rn)) > 1e-8 * nA):
        # rows equal up to (complex) unit factors: compare after making diag(R) positive
        ph = lambda X: X * (np.conj(np.diag(X)) / np.abs(np.diag(X)))[:, None]  # noqa: E731
        expect(np.allclose(ph(R), ph(Rn), rtol=1e-10, atol=1e-10 * nA), "R differs")
    r2 = np.linalg.qr(a, mode="r")
    check(r2, R, "mode='r'", rtol=1e-13, atol=1e-13 * nA)


@settings(max_examples=examples(20))
@given(st.data(), st.sampled_from([(9, 3), (3, 9), (6, 6), (5, 1), (0, 2)]), st.booleans())
@collective_checks
def test_svd(data, shape, cplx):
    A = rand(shape, 71, np.complex128 if cplx else np.float64)
    a = dist(A, data.draw(layouts(shape, SIZE, 2)))
    nA = max(np.linalg.norm(A), 1.0)
    bound = 10 * max(shape) * min(shape) * EPS
    u, s, vh = L.svd(a, full_matrices=False)
    U, S, Vh = u.to_numpy(), s.to_numpy(), vh.to_numpy()
    k = min(shape)
    expect(np.linalg.norm((U * S) @ Vh - A) <= bound * nA, "U S Vh != A")
    expect(np.linalg.norm(U.conj().T @ U - np.eye(k)) <= bound, "U not orthonormal")
    expect(np.linalg.norm(Vh @ Vh.conj().T - np.eye(k)) <= bound, "Vh not orthonormal")
    expect(np.allclose(S, np.linalg.svd(A, compute_uv=False), rtol=0, atol=1e-12 * nA), "S")
    check(np.linalg.svd(a, compute_uv=False), np.linalg.svd(A, compute_uv=False), "svdvals",
          rtol=0, atol=1e-12 * nA)
    U2, S2, V2 = (x.to_numpy() for x in np.linalg.svd(a))  # full_matrices=True: gather path
    expect(U2.shape == (shape[0],) * 2 and np.linalg.norm(U2[:, :k] * S2 @ V2[:k] - A)
           <= bound * nA, "full svd")


# -- gather path ---------------------------------------------------------------------------------
@settings(max_examples=examples(10))
@given(st.data(), st.integers(1, 6), st.integers(0, 3))
@collective_checks
def test_gather_path_solvers(data, n, nrhs):
    rng = np.random.default_rng(n)
    A = rng.standard_normal((n, n)) + n * np.eye(n)
    S = A @ A.T + np.eye(n)
    bshape = (n,) if nrhs == 0 else (n, nrhs)
    Bv = rand(bshape, 81)
    lay = data.draw(layouts((n, n), SIZE, 2))
    a, s = dist(A, lay), dist(S, lay)
    b = dist(Bv, data.draw(layouts(bshape, SIZE, 2)))
    x = L.solve(a, b)
    X = x.to_numpy()
    expect(x.distribution == b.distribution, "solve result not laid out like b")
    expect(np.linalg.norm(A @ X - Bv) <= 1e-10 * np.linalg.norm(A) * max(np.linalg.norm(X), 1),
           "solve residual")
    check(np.linalg.inv(a), np.linalg.inv(A), "inv", rtol=1e-10, atol=1e-12)
    check(np.linalg.det(a), np.linalg.det(A), "det", rtol=1e-10)
    check(np.linalg.cholesky(s), np.linalg.cholesky(S), "cholesky", rtol=1e-10, atol=1e-12)
    w, v = np.linalg.eigh(s)
    W, V = np.linalg.eigh(S)
    check(w, W, "eigvals", rtol=1e-10)
    Vg = v.to_numpy()
    expect(np.allclose(S @ Vg, Vg * W, rtol=1e-9, atol=1e-9 * np.linalg.norm(S)), "eigvecs")
    sign, logdet = L.slogdet(a)
    expect(np.isclose(sign.item(), np.linalg.slogdet(A)[0]) and
           np.isclose(logdet.item(), np.linalg.slogdet(A)[1], rtol=1e-10), "slogdet")


# -- bad input: raises on every rank ------------------------------------------------------------
def test_errors_on_every_rank(monkeypatch):
    g = grid((SIZE,))
    a = dt.from_global(rand((4, 3), 1), grid=g)
    b = dt.from_global(rand((4, 3), 2), grid=g)
    v = dt.from_global(rand((4,), 3), grid=g)
    assert_raises_all(COMM, ValueError, "mismatch in its core dimension", lambda: a @ b)
    assert_raises_all(COMM, ValueError, "does not have enough dimensions",
                      lambda: L.matmul(a, dt.from_global(np.array(2.0), grid=g)))
    assert_raises_all(COMM, ValueError, "broadcast",
                      lambda: L.matmul(dt.zeros((2, 4, 3), grid=g), dt.zeros((3, 3, 2), grid=g)))
    assert_raises_all(COMM, np.linalg.LinAlgError, "must be square", lambda: L.solve(a, v))
    assert_raises_all(COMM, np.linalg.LinAlgError, "at least two-dimensional", lambda: L.qr(v))
    assert_raises_all(COMM, ValueError, "shape-mismatch", lambda: L.tensordot(a, b, 1))
    assert_raises_all(COMM, ValueError, "operands provided to einstein sum",
                      lambda: dt.einsum("ij,jk,kl", a, b))
    assert_raises_all(COMM, ValueError, "sizes 3 and 4", lambda: dt.einsum("ij,jk", a, b))
    assert_raises_all(COMM, ValueError, "Invalid norm order", lambda: L.norm(a, "bad"))
    assert_raises_all(COMM, ValueError, "Improper number",
                      lambda: L.norm(dt.zeros((2, 2, 2), grid=g), 1))
    sq = dt.from_global(np.ones((3, 3)), grid=g)
    assert_raises_all(COMM, np.linalg.LinAlgError, "[Ss]ingular", lambda: L.inv(sq))
    assert_raises_all(COMM, np.linalg.LinAlgError, "not positive definite|Matrix is not",
                      lambda: L.cholesky(-dt.from_global(np.eye(3), grid=g)))
    monkeypatch.setenv("DISTTENSOR_GATHER_LIMIT", "64")
    assert_raises_all(COMM, ValueError, "DISTTENSOR_GATHER_LIMIT", lambda: L.inv(sq))
    assert_raises_all(COMM, ValueError, "DISTTENSOR_GATHER_LIMIT",
                      lambda: L.svd(a, full_matrices=True))
    q, r = L.qr(dt.from_global(rand((40, 2), 9), grid=g))  # TSQR is not guarded
    assert q.shape == (40, 2)


def test_arguments_differing_between_ranks():
    g = grid((SIZE,))
    a = dt.from_global(rand((4, 4), 1), grid=g)
    if SIZE == 1:
        pytest.skip("needs 2 ranks")
    with mismatch("tensordot", "axes"):
        L.tensordot(a, a, last_rank_only(1, 2))
    with mismatch("norm", "ord"):
        L.norm(a, last_rank_only(1, 2))
    with mismatch("qr", "mode"):
        L.qr(a, last_rank_only("r", "reduced"))
