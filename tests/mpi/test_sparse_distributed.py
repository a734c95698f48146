"""Distributed sparse matrices (disttensor.sparse.DistCSBMatrix) on 1-4 ranks: products and
adjoint products against dense NumPy float64 (row layout with both exchanges, block layout,
replicated operands, uneven and empty blocks), dot-product tests, the constructors, CG on a
3-D Laplacian against a dense solve, power iteration against eigvalsh, HDF5 round trips across
rank counts and layouts, and bad input raising on every rank."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import disttensor as dt
from checks import examples
from conftest import assert_all_ranks, assert_allclose_all, assert_raises_all
from disttensor.testing import assert_adjoint
from disttensor.sparse.distributed import DistCSBMatrix
from disttensor.sparse.laplacian import laplacian_3d, random_graph
from disttensor.sparse.linalg import cg, eigsh, power_iteration
from disttensor.sparse import io as sio

COMM = MPI.COMM_WORLD
SIZE = COMM.Get_size()
_GRIDS: dict = {}


def grid_of(dims) -> dt.ProcessGrid:
    dims = tuple(dims)
    if dims not in _GRIDS:
        _GRIDS[dims] = dt.ProcessGrid(dims)
    return _GRIDS[dims]


def grid_2d() -> tuple[int, int]:
    return {1: (1, 1), 2: (1, 2), 3: (3, 1), 4: (2, 2)}[SIZE]


@st.composite
def sizes_of(draw, n: int, p: int):
    """p ownership sizes summing to n (zeros allowed), or None (balanced)."""
    if draw(st.booleans()):
        return None
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=p - 1, max_size=p - 1)))
    return [b - a for a, b in zip([0] + cuts, cuts + [n])]


@st.composite
def matrices(draw, layout: str):
    m, n = draw(st.integers(0, 9)), draw(st.integers(0, 9))
    dims = (SIZE,) if layout == "rows" else grid_2d()
    rs = draw(sizes_of(m, dims[0]))
    cs = draw(sizes_of(n, dims[0] if layout == "rows" else dims[1]))
    density = draw(st.sampled_from([0.0, 0.3, 1.0]))
    seed = draw(st.integers(0, 2 ** 31))
    k = draw(st.sampled_from([None, 1, 3]))
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n)) * (rng.random((m, n)) < density)
    return a, dims, rs, cs, k, seed


def _operand(g, values, split_axis, sizes, replicated):
    if replicated:
        return dt.from_global(values, grid=g, split=[None] * values.ndim)
    return dt.from_global(values, grid=g, split=[split_axis] + [None] * (values.ndim - 1),
                          sizes=[list(sizes)] + [None] * (values.ndim - 1))


def _block_close(d, ref) -> bool:
    return np.allclose(d.local, ref[d.local_slices], rtol=1e-12, atol=1e-12)


def _check_all(A, k, ax, want_ax, aty, want_aty, nnz_ok):
    """Every check of a product case in one collective assertion (the suite's time on 4
    oversubscribed ranks is mostly collective waits)."""
    fails = [what for what, ok in (
        ("A @ x layout", ax.distribution == A.output_distribution(k)),
        ("A.T @ y layout", aty.distribution == A.input_distribution(k)),
        ("A @ x values", _block_close(ax, want_ax)),
        ("A.T @ y values", _block_close(aty, want_aty)), ("nnz", nnz_ok)) if not ok]
    assert_all_ranks(COMM, not fails, f"failed: {fails}")


@settings(max_examples=examples(6))
@given(matrices("rows"), st.sampled_from([None, "p2p", "allgather"]), st.booleans())
def test_row_layout_products_match_numpy(case, exchange, replicated):
    a, dims, rs, cs, k, seed = case
    g = grid_of(dims)
    A = DistCSBMatrix.from_dense(a, g, row_sizes=rs, col_sizes=cs)
    m, n = a.shape
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((n,) if k is None else (n, k))
    y = rng.standard_normal((m,) if k is None else (m, k))
    ax = A.matmul(_operand(g, x, 0, A.col_sizes, replicated), exchange=exchange)
    aty = A.rmatmul(_operand(g, y, 0, A.row_sizes, replicated), exchange=exchange)
    _check_all(A, k, ax, a @ x, aty, a.T @ y, A.nnz == np.count_nonzero(a))


@settings(max_examples=examples(5))
@given(matrices("blocks"), st.booleans())
def test_block_layout_products_match_numpy(case, replicated):
    a, dims, rs, cs, k, seed = case
    g = grid_of(dims)
    A = DistCSBMatrix.from_dense(a, g, row_sizes=rs, col_sizes=cs)
    m, n = a.shape
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((n,) if k is None else (n, k))
    y = rng.standard_normal((m,) if k is None else (m, k))
    ax = A @ _operand(g, x, 1, A.col_sizes, replicated)
    aty = A.T @ _operand(g, y, 0, A.row_sizes, replicated)
    _check_all(A, k, ax, a @ x, aty, a.T @ y, A.nnz == np.count_nonzero(a))


@pytest.mark.parametrize("layout,exchange", [("rows", "p2p"), ("rows", "allgather"),
                                             ("blocks", None)])
@pytest.mark.parametrize("shape", [(13, 11), (2, 3)])
def test_adjoint(layout, exchange, shape):
    dims = (SIZE,) if layout == "rows" else grid_2d()
    g = grid_of(dims)
    rng = np.random.default_rng(3)
    a = rng.standard_normal(shape) * (rng.random(shape) < 0.4)
    A = DistCSBMatrix.from_dense(a, g)
    x = dt.from_global(rng.standard_normal((shape[1], 2)), grid=g,
                       split=A.input_distribution(2).split)
    y = dt.from_global(rng.standard_normal((shape[0], 2)), grid=g,
                       split=A.output_distribution(2).split)
    assert_adjoint(lambda v: A.matmul(v, exchange=exchange),
                   lambda w: A.rmatmul(w, exchange=exchange), x, y)


def test_constructors_agree_and_sum_duplicates():
    g = grid_of((SIZE,))
    rng = np.random.default_rng(7)
    m, n, nnz = 10, 8, 40
    rows, cols = rng.integers(0, m, nnz), rng.integers(0, n, nnz)
    vals = rng.standard_normal(nnz)
    dense = np.zeros((m, n))
    np.add.at(dense, (rows, cols), vals)
    # every rank passes an arbitrary share (other ranks' rows included)
    mine = np.arange(nnz) % SIZE == COMM.rank
    A = DistCSBMatrix.from_local_coo(rows[mine], cols[mine], vals[mine], (m, n), g)
    B = DistCSBMatrix.from_global_coo(rows, cols, vals, (m, n), g)
    assert_allclose_all(COMM, A.to_dense(), dense, rtol=1e-14)
    assert_allclose_all(COMM, B.to_dense(), dense, rtol=1e-14)
    g2 = grid_of(grid_2d())
    C = DistCSBMatrix.from_local_coo(rows[mine], cols[mine], vals[mine], (m, n), g2)
    assert_allclose_all(COMM, C.to_dense(), dense, rtol=1e-14)
    r, c, v = C.to_coo()
    assert_all_ranks(COMM, len(r) == np.count_nonzero(dense) == C.nnz, "to_coo entries")

    def fn(lo, hi):
        i = np.arange(lo, hi)
        return np.concatenate([i, i[i > 0]]), np.concatenate([i, i[i > 0] - 1]), \
            np.concatenate([2.0 * i + 1, -np.ones(int(np.sum(i > 0)))])
    want = np.diag(2.0 * np.arange(m) + 1) - np.eye(m, k=-1)
    for gg in (g, g2):
        F = DistCSBMatrix.from_function(fn, (m, m), gg)
        assert_allclose_all(COMM, F.to_dense(), want, rtol=0)
        assert_allclose_all(COMM, F.diagonal(), np.diag(want), rtol=0)


def _laplacian_dense(n: int) -> np.ndarray:
    t = 2 * np.eye(n) - np.eye(n, k=1) - np.eye(n, k=-1)
    i = np.eye(n)
    return (np.kron(np.kron(t, i), i) + np.kron(np.kron(i, t), i) + np.kron(np.kron(i, i), t))


@pytest.mark.parametrize("layout", ["rows", "blocks"])
def test_cg_on_a_3d_laplacian_matches_a_dense_solve(layout):
    n = 8
    g = grid_of((SIZE,) if layout == "rows" else grid_2d())
    N = n ** 3
    rs = None
    if layout == "rows" and SIZE > 1:   # uneven, with an empty block
        rs = [0] + [N // (SIZE - 1)] * (SIZE - 2) + [N - (N // (SIZE - 1)) * (SIZE - 2)]
    A = laplacian_3d(n, g, row_sizes=rs, col_sizes=rs)
    dense = _laplacian_dense(n)
    assert_allclose_all(COMM, A.to_dense(), dense, rtol=0)
    if layout == "rows" and SIZE > 1:   # a stencil's halo: neighbours' faces, point to point
        assert_all_ranks(COMM, A.halo.method(1, 8) == "p2p", "cost rule on a stencil")
    b = np.sin(np.arange(N) * 0.37) + 1.0
    want = np.linalg.solve(dense, b)
    bd = dt.from_global(b, grid=g, split=A.output_distribution().split,
                        sizes=[list(A.row_sizes)])
    M = None if layout == "rows" else "jacobi"
    x, info = cg(A, bd, rtol=1e-13, M=M)
    err = np.linalg.norm(x.to_numpy() - want) / np.linalg.norm(want)
    assert_all_ranks(COMM, info == 0 and err <= 1e-10, f"cg error {err}, info {info} (M={M})")
    x, info = cg(A, bd, rtol=1e-13, maxiter=3)
    assert_all_ranks(COMM, info == 3, f"info {info} after 3 iterations")


def test_power_iteration_on_a_random_graph_matches_eigvalsh():
    want = None
    for dims in ((SIZE,), grid_2d()):
        G = random_graph(48, 4, seed=5, grid=grid_of(dims))
        d = G.to_dense()
        assert_all_ranks(COMM, np.array_equal(d, d.T) and d.sum() == 2 * 48 * 4,
                         "symmetric adjacency with 2 n degree entries")
        if want is None:
            want = np.linalg.eigvalsh(d)[-1]
            lam, v, info = power_iteration(G)
            assert_all_ranks(COMM, info == 0 and abs(lam - want) <= 1e-10 * want,
                             f"power iteration {lam} vs eigvalsh {want} (info {info})")
            vv = v.to_numpy()
            assert_allclose_all(COMM, d @ vv, want * vv, atol=1e-6)
            first = d
        else:   # the same graph on another grid; eigsh-lite there
            assert_allclose_all(COMM, d, first, rtol=0)
            w, _ = eigsh(G)
            assert_allclose_all(COMM, w, [want], rtol=1e-10)


def test_hdf5_round_trip_across_rank_counts_and_layouts(comm, shared_tmp_path):
    rng = np.random.default_rng(11)
    m, n = 9, 6
    a = rng.standard_normal((m, n)) * (rng.random((m, n)) < 0.5)
    a[2] = 0.0
    path = shared_tmp_path / "sparse.h5"
    for dims, name, other in (((SIZE,), "rows", grid_2d()), (grid_2d(), "blocks", (SIZE,))):
        A = DistCSBMatrix.from_dense(a, grid_of(dims))
        sio.write_hdf5(A, path, f"m/{name}")
        B = sio.read_hdf5(path, f"m/{name}", grid_of(other))   # read in the other layout
        assert_allclose_all(COMM, B.to_dense(), a, rtol=0)
    # another rank count: every rank alone reads what all wrote
    alone = sio.read_hdf5(path, "m/rows", dt.ProcessGrid(comm=MPI.COMM_SELF))
    assert_allclose_all(COMM, alone.to_dense(), a, rtol=0)
    if COMM.rank == 0:   # a CSR matrix SciPy can read: checked with h5py
        import h5py
        with h5py.File(path, "r") as f:
            g = f["m/blocks"]
            ptr, ind, dat = g["indptr"][:], g["indices"][:], g["data"][:]
            shape = tuple(g.attrs["shape"])
        back = np.zeros(shape)
        for i in range(shape[0]):
            back[i, ind[ptr[i]:ptr[i + 1]]] = dat[ptr[i]:ptr[i + 1]]
        ok = np.array_equal(back, a) and all(
            np.all(np.diff(ind[ptr[i]:ptr[i + 1]]) > 0) for i in range(m))
    else:
        ok = True
    assert_all_ranks(COMM, ok, "the file is canonical CSR")


def test_errors_raise_on_every_rank(comm, shared_tmp_path):
    g = grid_of((SIZE,))
    rng = np.random.default_rng(2)
    a = rng.standard_normal((6, 5)) * (rng.random((6, 5)) < 0.5)
    A = DistCSBMatrix.from_dense(a, g)
    x_bad = dt.from_global(np.ones(4), grid=g, split=(0,))
    assert_raises_all(COMM, ValueError, "mismatch in its core dimension",
                      lambda: A @ x_bad)
    if SIZE > 1:  # same shape, another ownership
        other = [5] + [0] * (SIZE - 1)
        x_other = dt.from_global(np.ones(5), grid=g, split=(0,), sizes=[other])
        assert_raises_all(COMM, ValueError, "does not match", lambda: A @ x_other)
        assert_allclose_all(COMM, A @ A.align_input(x_other), a @ np.ones(5), rtol=1e-12)
    assert_raises_all(COMM, IndexError, "out of bounds",
                      lambda: DistCSBMatrix.from_local_coo([0, 6 if COMM.rank == SIZE - 1
                                                            else 1], [0, 0], [1.0, 2.0],
                                                           (6, 5), g))
    assert_raises_all(COMM, IndexError, "out of bounds",
                      lambda: DistCSBMatrix.from_global_coo([0], [-1], [1.0], (6, 5), g))
    assert_raises_all(COMM, ValueError, "same length",
                      lambda: DistCSBMatrix.from_local_coo([0, 1], [0], [1.0], (6, 5), g))
    assert_raises_all(COMM, ValueError, "layout",
                      lambda: DistCSBMatrix.from_dense(a, g, layout="cols"))
    assert_raises_all(COMM, ValueError, "square", lambda: cg(A, np.ones(6)))
    if SIZE > 1:   # arguments that differ between ranks
        assert_raises_all(COMM, dt.ArgumentMismatchError, "shape",
                          lambda: DistCSBMatrix.from_local_coo([], [], [], (6, 5 + COMM.rank),
                                                               g))
        x = dt.from_global(np.ones(5), grid=g, split=(0,), sizes=[list(A.col_sizes)])
        assert_raises_all(COMM, dt.ArgumentMismatchError, "exchange",
                          lambda: A.matmul(x, exchange="p2p" if COMM.rank else "allgather"))
        assert_raises_all(COMM, dt.ArgumentMismatchError, "group",
                          lambda: sio.write_hdf5(A, shared_tmp_path / "e.h5",
                                                 f"g{COMM.rank}"))
    assert_raises_all(COMM, KeyError, "nope", lambda: _read_missing_group(shared_tmp_path, g, A))


def _read_missing_group(d, g, A):
    sio.write_hdf5(A, d / "ok.h5", "here")
    return sio.read_hdf5(d / "ok.h5", "nope", g)
