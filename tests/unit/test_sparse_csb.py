"""disttensor.sparse.CSBMatrix on the CPU: A @ X, A.T @ X and SDDMM against dense NumPy
float64 on random shapes (square, tall, wide, 1xN, Nx1, 0x0, empty rows and blocks, a dense
block), densities 0-100%, float32/float64, both index types, forced splits of heavy lines;
construction and conversions; clear errors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor.sparse import CSBMatrix, local_cpu, sddmm
from disttensor.sparse.blocking import line_nnz

MEDIUM = settings(max_examples=60, deadline=None)
RTOL = {np.float32: 3e-5, np.float64: 1e-12}


def _matrix(rng, shape, density, dtype):
    a = rng.standard_normal(shape)
    a[rng.random(shape) >= density] = 0
    return a.astype(dtype)


def _close(got, want, dtype, k):
    """``got`` against the float64 ``want`` within RTOL[dtype] of the sum of |terms|."""
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    if want.size:
        scale = max(1.0, np.abs(want).max()) * max(1, k)
        np.testing.assert_allclose(got, want, rtol=0, atol=RTOL[dtype] * scale)


shapes = st.tuples(st.integers(0, 70), st.integers(0, 70))
densities = st.sampled_from([0.0, 0.05, 0.3, 0.7, 1.0])
dtypes = st.sampled_from([np.float32, np.float64])
block_sizes = st.sampled_from([None, 1, 2, 8, 16, 512])


@MEDIUM
@given(shapes, densities, dtypes, block_sizes, st.integers(0, 9), st.integers(0, 2**32 - 1))
def test_products_match_dense(shape, density, dtype, block_size, k, seed):
    rng = np.random.default_rng(seed)
    a = _matrix(rng, shape, density, dtype)
    A = CSBMatrix.from_dense(a, block_size=block_size)
    ref = a.astype(np.float64)
    m, n = shape
    assert A.shape == shape and A.dtype == dtype and A.nnz == np.count_nonzero(a)
    x = rng.standard_normal((n, k)).astype(dtype)
    z = rng.standard_normal((m, k)).astype(dtype)
    y = A @ x
    assert y.dtype == dtype and y.shape == (m, k)
    _close(y, ref @ x, dtype, n)
    yt = A.T @ z
    assert yt.dtype == dtype and yt.shape == (n, k)
    _close(yt, ref.T @ z, dtype, m)
    _close(A @ x[:, 0] if k else A @ np.zeros(n, dtype), ref @ (x[:, 0] if k else
                                                               np.zeros(n)), dtype, n)
    rows, cols, vals = A.to_coo()
    g = sddmm(A, z, x)
    assert g.dtype == dtype and g.shape == (A.nnz,)
    _close(g, (z.astype(np.float64) @ x.T)[rows, cols], dtype, k)
    gt = sddmm(A.T, x, z)
    _close(gt, (x.astype(np.float64) @ z.T)[cols, rows], dtype, k)


@MEDIUM
@given(st.tuples(st.integers(1, 90), st.integers(1, 90)), densities, dtypes,
       st.sampled_from([1, 4, 8]), st.integers(1, 40), st.integers(1, 5),
       st.integers(0, 2**32 - 1), st.booleans())
def test_split_heavy_lines_match_dense(shape, density, dtype, beta, target, k, seed,
                                       parallel):
    """Lines cut into chunks (a small target) give the same products: the partial results
    of a split line are combined correctly, in both orientations, by the parallel kernels
    and by their one-thread twins."""
    saved = local_cpu.PARALLEL_MIN_WORK
    local_cpu.PARALLEL_MIN_WORK = 0 if parallel else 1 << 62
    try:
        _split_case(shape, density, dtype, beta, target, k, seed)
    finally:
        local_cpu.PARALLEL_MIN_WORK = saved


def _split_case(shape, density, dtype, beta, target, k, seed):
    rng = np.random.default_rng(seed)
    a = _matrix(rng, shape, density, dtype)
    A = CSBMatrix.from_dense(a, block_size=beta)
    ref = a.astype(np.float64)
    x = rng.standard_normal((shape[1], k)).astype(dtype)
    z = rng.standard_normal((shape[0], k)).astype(dtype)
    plan = A.structure.plan(False, local_cpu.workers(), target)
    s = A.structure
    heavy = line_nnz(s.blk_ptr, s.nbr, s.nbc, False) > target
    np.testing.assert_array_equal(plan.split_lines, np.flatnonzero(heavy))
    _close(local_cpu.spmm(A.structure, A.values, x, False, target), ref @ x, dtype, shape[1])
    _close(local_cpu.spmm(A.structure, A.values, z, True, target), ref.T @ z, dtype, shape[0])
    rows, cols, _ = A.to_coo()
    _close(local_cpu.sddmm(A.structure, z, x, dtype), (z.astype(np.float64) @ x.T)[rows, cols],
           dtype, k)


def test_special_shapes_and_patterns():
    rng = np.random.default_rng(1)
    cases = {
        "0x0": np.zeros((0, 0)), "1xN": rng.standard_normal((1, 50)),
        "Nx1": rng.standard_normal((50, 1)), "0x5": np.zeros((0, 5)), "5x0": np.zeros((5, 0)),
        "empty": np.zeros((30, 40)),
    }
    a = np.zeros((64, 64))
    a[16:32, 32:48] = rng.standard_normal((16, 16))        # one dense block, the rest empty
    cases["dense-block"] = a
    b = np.zeros((40, 33))
    b[::7] = rng.standard_normal((6, 33))                  # empty rows between full ones
    cases["empty-rows"] = b
    for name, a in cases.items():
        for bs in (None, 16):
            A = CSBMatrix.from_dense(a, block_size=bs)
            x = rng.standard_normal((a.shape[1], 3))
            z = rng.standard_normal((a.shape[0], 3))
            np.testing.assert_allclose(A @ x, a @ x, atol=1e-12, err_msg=name)
            np.testing.assert_allclose(A.T @ z, a.T @ z, atol=1e-12, err_msg=name)
            np.testing.assert_array_equal(A.to_dense(), a, err_msg=name)
    A = CSBMatrix.from_dense(cases["dense-block"], block_size=16)
    counts = np.diff(A.structure.blk_ptr)
    assert np.count_nonzero(counts) == 1 and counts.max() == 256


def test_storage_order_is_block_major_then_morton():
    from disttensor.sparse.morton import morton_encode
    rng = np.random.default_rng(2)
    a = _matrix(rng, (37, 29), 0.4, np.float64)
    A = CSBMatrix.from_dense(a, block_size=8)
    r, c, v = A.to_coo()
    nbc = -(-29 // 8)
    key = ((r // 8) * nbc + c // 8) * 64 + morton_encode(r % 8, c % 8).astype(np.int64)
    assert np.all(np.diff(key) > 0)
    np.testing.assert_array_equal(v, a[r, c])
    assert A.structure.lrow.dtype == np.uint8
    assert CSBMatrix.from_dense(a, block_size=512).structure.lcol.dtype == np.uint16


def test_from_coo_sums_duplicates_and_keeps_explicit_zeros():
    rows = np.array([0, 2, 0, 2, 1, 0])
    cols = np.array([1, 3, 1, 3, 0, 2])
    vals = np.array([1.0, 2.0, 3.0, -2.0, 5.0, 0.0])
    A = CSBMatrix.from_coo(rows, cols, vals, (3, 4), block_size=2)
    want = np.zeros((3, 4))
    np.add.at(want, (rows, cols), vals)
    np.testing.assert_array_equal(A.to_dense(), want)
    assert A.nnz == 4          # (0,1), (2,3) summed to 0 but kept, (1,0), explicit (0,2)
    x = np.arange(4.0)
    np.testing.assert_allclose(A @ x, want @ x)
    B = CSBMatrix.from_coo([0, 1], [1, 0], np.array([1, 2], dtype=np.int32), (2, 2))
    assert B.dtype == np.float64
    assert CSBMatrix.from_coo([0], [0], np.ones(1, np.float16), (1, 1)).dtype == np.float32


def test_transpose_is_a_view_and_values_roundtrip():
    rng = np.random.default_rng(3)
    a = _matrix(rng, (20, 13), 0.5, np.float32)
    A = CSBMatrix.from_dense(a)
    assert A.T.shape == (13, 20) and A.T.values is A.values
    assert A.T.structure is A.structure and A.T.T.shape == A.shape
    np.testing.assert_array_equal(A.T.to_dense(), a.T)
    r, c, v = A.T.to_coo()
    np.testing.assert_array_equal(a.T[r, c], v)
    B = A.with_values(2 * A.values)
    assert B.structure is A.structure
    np.testing.assert_array_equal(B.to_dense(), 2 * a)
    np.testing.assert_array_equal(A.T.with_values(A.values).to_dense(), a.T)
    C = A.astype(np.float64)
    assert C.dtype == np.float64 and C.structure is A.structure
    np.testing.assert_array_equal(C.to_dense(), a.astype(np.float64))
    assert A.density == pytest.approx(np.count_nonzero(a) / a.size)
    assert CSBMatrix.from_dense(np.zeros((0, 3))).density == 0.0
    x = rng.standard_normal((5, 20)).astype(np.float32)
    np.testing.assert_allclose(x @ A, x @ a, rtol=1e-5, atol=1e-5)    # __rmatmul__


def test_scipy_round_trip():
    sps = pytest.importorskip("scipy.sparse")
    rng = np.random.default_rng(4)
    for shape, density in (((50, 70), 0.1), ((1, 9), 1.0), ((0, 0), 0.0), ((33, 1), 0.5)):
        s = sps.random(*shape, density=density, format="csr", random_state=rng)
        A = CSBMatrix.from_scipy(s)
        np.testing.assert_array_equal(A.to_dense(), s.toarray())
        back = A.to_scipy()
        assert back.shape == s.shape
        np.testing.assert_array_equal(back.toarray(), s.toarray())
        np.testing.assert_array_equal(A.T.to_scipy().toarray(), s.toarray().T)
    coo = sps.coo_array((np.array([1.0, 2.0, 0.0]), (np.array([0, 0, 1]),
                                                      np.array([1, 1, 0]))), shape=(2, 2))
    A = CSBMatrix.from_scipy(coo)
    assert A.nnz == 2 and A.to_dense()[0, 1] == 3.0


def test_errors_are_clear():
    rng = np.random.default_rng(5)
    A = CSBMatrix.from_dense(rng.standard_normal((6, 4)))
    with pytest.raises(ValueError, match="has 5 rows.*needs 4"):
        A @ np.ones((5, 2))
    with pytest.raises(ValueError, match="has 4 rows.*needs 6"):
        A.T @ np.ones(4)
    with pytest.raises(ValueError, match="1-D or 2-D"):
        A @ np.ones((4, 2, 2))
    with pytest.raises(ValueError, match="1-D or 2-D"):
        A @ np.float64(1.0)
    with pytest.raises(TypeError, match="float32 but the CSB matrix is float64"):
        A @ np.ones(4, np.float32)
    with pytest.raises(TypeError, match="dtypes must match"):
        sddmm(A, np.ones((6, 2)), np.ones((4, 2), np.float32))
    with pytest.raises(ValueError, match="same number of columns"):
        sddmm(A, np.ones((6, 2)), np.ones((4, 3)))
    with pytest.raises(ValueError, match="needs 6"):
        sddmm(A, np.ones((5, 2)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="2-D"):
        CSBMatrix.from_dense(np.ones(3))
    with pytest.raises(ValueError, match="2-D"):
        CSBMatrix.from_dense(np.ones((2, 2, 2)))
    with pytest.raises(IndexError, match="row index 3 is out of range"):
        CSBMatrix.from_coo([0, 3], [0, 0], [1.0, 1.0], (3, 3))
    with pytest.raises(IndexError, match="column index -1 is out of range"):
        CSBMatrix.from_coo([0, 1], [0, -1], [1.0, 1.0], (3, 3))
    with pytest.raises(ValueError, match="differ in length"):
        CSBMatrix.from_coo([0, 1], [0], [1.0, 1.0], (3, 3))
    with pytest.raises(TypeError, match="integers"):
        CSBMatrix.from_coo([0.5], [0], [1.0], (3, 3))
    with pytest.raises(ValueError, match="negative"):
        CSBMatrix.from_coo([], [], [], (-1, 3))
    with pytest.raises(ValueError, match="power of two"):
        CSBMatrix.from_dense(np.ones((4, 4)), block_size=3)
    with pytest.raises(TypeError, match="float32 or float64"):
        CSBMatrix.from_dense(np.ones((2, 2), np.complex128))
    with pytest.raises(TypeError, match="float32 or float64"):
        A.astype(np.int32)
    with pytest.raises(ValueError, match="needs 24 values"):
        A.with_values(np.ones(5))
    with pytest.raises(TypeError, match="scipy.sparse"):
        CSBMatrix.from_scipy(np.ones((2, 2)))
