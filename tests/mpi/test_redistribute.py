"""Any-to-any redistribution: correctness against the global array, round trips, the
dot-product adjoint test, and awkward inputs (halo, non-contiguous views, zero-size arrays,
float16 and complex dtypes)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi4py import MPI

import disttensor as dt
from conftest import assert_all_ranks, assert_allclose_all
from disttensor.testing.strategies import all_grid_dims, layouts

COMM = MPI.COMM_WORLD
SIZE = COMM.Get_size()

_GRIDS: dict[tuple[int, ...], dt.ProcessGrid] = {}


def get_grid(dims) -> dt.ProcessGrid:
    """One ProcessGrid per shape for the whole session (no communicator leak)."""
    dims = tuple(dims)
    if dims not in _GRIDS:
        _GRIDS[dims] = dt.ProcessGrid(dims)
    return _GRIDS[dims]


DTYPES = ["float64", "float32", "float16", "complex128", "complex64", "int32", "int16", "bool"]


@st.composite
def redistribution_cases(draw, max_ndim: int = 3, max_extent: int = 7):
    ndim = draw(st.integers(1, max_ndim))
    shape = tuple(draw(st.lists(st.integers(0, max_extent), min_size=ndim, max_size=ndim)))
    src = draw(layouts(shape, SIZE))
    dst = draw(layouts(shape, SIZE))
    dtype = draw(st.sampled_from(DTYPES))
    return shape, src, dst, dtype


def global_values(shape, dtype) -> np.ndarray:
    """Distinct values, exact in every tested dtype (float16 holds integers up to 2048)."""
    n = int(np.prod(shape))
    a = (np.arange(n, dtype=np.int64) * 37 + 11) % 2003 - 1000
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return (a + 1j * (a[::-1] if n else a)).reshape(shape).astype(dtype)
    if dtype.kind == "b":
        return (a % 3 == 0).reshape(shape)
    return a.reshape(shape).astype(dtype)


def build(g, layout):
    dims, split, sizes = layout
    return dt.from_global(g, grid=get_grid(dims), split=split, sizes=list(sizes))


def redistribute_to(x, layout):
    dims, split, sizes = layout
    return x.redistribute(grid=get_grid(dims), split=split, sizes=list(sizes))


def check_layout(y, g, layout, what=""):
    dims, split, sizes = layout
    want = dt.Distribution(g.shape, dims, split, list(sizes))
    assert_all_ranks(COMM, y.distribution == want and y.grid.dims == tuple(dims),
                     f"{what}: distribution {y.distribution} != {want}")
    assert_all_ranks(COMM, y.dtype == g.dtype, f"{what}: dtype {y.dtype} != {g.dtype}")
    assert_allclose_all(COMM, y.local, g[y.local_slices], rtol=0, atol=0, err_msg=what)


# ---------------------------------------------------------------------------------------------
@given(case=redistribution_cases())
def test_redistribute_matches_global_and_round_trips(case):
    shape, src, dst, dtype = case
    g = global_values(shape, dtype)
    x = build(g, src)
    check_layout(x, g, src, "from_global")
    y = redistribute_to(x, dst)
    check_layout(y, g, dst, f"redistribute {case}")
    full = y.to_numpy()
    assert_allclose_all(COMM, full, g, rtol=0, atol=0, err_msg="to_numpy")
    gathered = y.gather(root=SIZE - 1)
    assert_all_ranks(COMM, (gathered is None) == (COMM.rank != SIZE - 1), "gather root")
    if gathered is not None:
        np.testing.assert_array_equal(gathered, g)
    back = redistribute_to(y, src)
    check_layout(back, g, src, "round trip")
    # the source is untouched
    assert_allclose_all(COMM, x.local, g[x.local_slices], rtol=0, atol=0, err_msg="source")


def _inner(a, b) -> complex:
    return complex(np.vdot(np.asarray(a, dtype=np.complex128).ravel(),
                           np.asarray(b, dtype=np.complex128).ravel()))


@given(case=redistribution_cases(), seed=st.integers(0, 2**16),
       cplx=st.booleans())
def test_redistribute_adjoint(case, seed, cplx):
    shape, src, dst, _ = case
    dtype = np.complex128 if cplx else np.float64
    rng = np.random.default_rng([seed, COMM.rank])  # replicas hold different data on purpose

    def rand(shp):
        a = rng.standard_normal(shp)
        return (a + 1j * rng.standard_normal(shp)).astype(dtype) if cplx else a

    x = dt.zeros(shape, dtype=dtype, grid=get_grid(src[0]), split=src[1], sizes=list(src[2]))
    x.local[...] = rand(x.local_shape)
    y = dt.zeros(shape, dtype=dtype, grid=get_grid(dst[0]), split=dst[1], sizes=list(dst[2]))
    y.local[...] = rand(y.local_shape)
    rx = redistribute_to(x, dst)
    ry = y.redistribute_adjoint(x)
    assert_all_ranks(COMM, ry.distribution == x.distribution and ry.grid is x.grid,
                     "adjoint result does not have the source layout")
    lhs = COMM.allreduce(_inner(rx.local, y.local), op=MPI.SUM)
    rhs = COMM.allreduce(_inner(x.local, ry.local), op=MPI.SUM)
    scale = COMM.allreduce(float(np.abs(rx.local).sum() * np.abs(y.local).max(initial=0)
                                 + np.abs(x.local).sum() * np.abs(ry.local).max(initial=0)),
                           op=MPI.SUM)
    assert_all_ranks(COMM, abs(lhs - rhs) <= 1e-12 * max(scale, 1.0),
                     f"<Rx,y>={lhs!r} != <x,R*y>={rhs!r} for {case}")


@given(case=redistribution_cases(), halo=st.integers(0, 2))
def test_redistribute_array_with_halo(case, halo):
    shape, src, dst, dtype = case
    g = global_values(shape, dtype)
    x = build(g, src).with_halo(halo)
    x.buffer[...] = 1  # junk in the halo must not leak into the result
    x.local[...] = g[x.local_slices]
    y = redistribute_to(x, dst)
    check_layout(y, g, dst, "from a haloed array")
    assert_all_ranks(COMM, y.halo == ((0, 0),) * len(shape), f"result has a halo {y.halo}")
    back = redistribute_to(y, src)
    check_layout(back, g, src, "round trip")


@given(case=redistribution_cases(max_ndim=3), data=st.data())
def test_redistribute_transposed_view(case, data):
    shape, src, _, dtype = case
    g = global_values(shape, dtype)
    x = build(g, src)
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    xt = x.transpose(perm)
    gt = np.transpose(g, perm)
    check_layout(xt, gt, (src[0], tuple(src[1][p] for p in perm),
                          tuple(src[2][p] for p in perm)), "transpose")
    dst = data.draw(layouts(gt.shape, SIZE))
    y = redistribute_to(xt, dst)
    check_layout(y, gt, dst, f"transposed {perm} -> {dst}")
    # a strided view: every other element along the first axis
    xs = x[::2]
    gs = g[::2]
    dst2 = data.draw(layouts(gs.shape, SIZE))
    ys = redistribute_to(xs, dst2)
    check_layout(ys, gs, dst2, "strided view")


# -- fixed cases ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "complex64", "complex128", "float32", "int8"])
def test_dtypes_between_split_axes(dtype):
    g = global_values((5, 6, 3), dtype)
    for src, dst in [(((SIZE,), (0, None, None), (None,) * 3), ((SIZE,), (None, 0, None), (None,) * 3)),
                     (((SIZE,), (None, None, 0), (None,) * 3), ((1, SIZE), (None, 1, None), (None,) * 3)),
                     (((SIZE, 1), (0, None, None), (None,) * 3), ((SIZE,), (None,) * 3, (None,) * 3))]:
        x = build(g, src)
        y = redistribute_to(x, dst)
        check_layout(y, g, dst, f"{dtype}: {src} -> {dst}")


@pytest.mark.parametrize("shape", [(0,), (0, 5), (4, 0), (0, 0, 3), (3, 0, 2)])
def test_zero_size_arrays(shape):
    g = global_values(shape, "float64")
    for dims in all_grid_dims(SIZE, 2):
        for src_split in [(0,), (None, 0) if len(shape) > 1 else (None,)]:
            src = (dims, src_split + (None,) * (len(shape) - len(src_split)), (None,) * len(shape))
            dst = (dims[::-1], (None,) * (len(shape) - 1) + (len(dims) - 1,), (None,) * len(shape))
            x = build(g, src)
            y = redistribute_to(x, dst)
            check_layout(y, g, dst, f"zero-size {shape} {src} -> {dst}")
            assert_all_ranks(COMM, y.to_numpy().shape == shape, "to_numpy shape")
            r = y.redistribute_adjoint(x)
            assert_all_ranks(COMM, r.local.shape == x.local.shape, "adjoint shape")


def test_all_data_on_one_rank_and_back():
    """Explicit sizes putting everything on the last rank (all others empty)."""
    g = global_values((7, 4), "float64")
    grid = get_grid((SIZE,))
    src = ((SIZE,), (0, None), ([0] * (SIZE - 1) + [7], None))
    dst = ((SIZE,), (None, 0), (None, [4] + [0] * (SIZE - 1)))
    x = build(g, src)
    y = redistribute_to(x, dst)
    check_layout(y, g, dst, "last rank -> first rank")
    z = y.redistribute(grid=grid, split=(0, None))
    check_layout(z, g, ((SIZE,), (0, None), (None, None)), "-> balanced")


def test_redistribute_to_same_layout_is_a_copy():
    g = global_values((6, 5), "float64")
    x = build(g, ((SIZE,), (0, None), (None, None)))
    y = x.redistribute()
    check_layout(y, g, ((SIZE,), (0, None), (None, None)), "identity")
    y.local[...] = -1
    assert_allclose_all(COMM, x.local, g[x.local_slices], rtol=0, atol=0, err_msg="aliasing")


def test_module_level_redistribute():
    g = global_values((6, 5), "float32")
    x = build(g, ((SIZE,), (0, None), (None, None)))
    y = dt.redistribute(x, split=(None, 0))
    check_layout(y, g, ((SIZE,), (None, 0), (None, None)), "dt.redistribute")


def test_redistribute_shape_mismatch_raises():
    x = build(global_values((6, 5), "float64"), ((SIZE,), (0, None), (None, None)))
    bad = dt.Distribution((5, 6), (SIZE,), (0, None))
    with pytest.raises(ValueError, match="shape"):
        x.redistribute(distribution=bad)
    assert COMM.allreduce(1) == SIZE
