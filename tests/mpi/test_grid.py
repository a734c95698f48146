"""ProcessGrid: dims completion, row-major coordinates, neighbours, sub-communicators and the
default grid."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from conftest import assert_all_ranks
from disttensor.core.distribution import coords_to_rank, rank_to_coords
from disttensor.testing.strategies import all_grid_dims

COMM = MPI.COMM_WORLD
SIZE = COMM.Get_size()
RANK = COMM.Get_rank()
ALL_DIMS = all_grid_dims(SIZE, 3)


def row_major_coords(rank: int, dims) -> tuple[int, ...]:
    """Independent reference: the last grid axis varies fastest."""
    strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
    return tuple((rank // s) % d for s, d in zip(strides, dims))


@pytest.fixture
def grids():
    """Grids created by a test, freed (collectively) afterwards."""
    made = []
    yield made
    for g in made:
        g.free()


# -- dims ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dims", [None, 0, (0,), (0, 0), (0, 0, 0), (1, 0), (0, 1, 0)])
def test_zero_dims_filled_by_compute_dims(dims, grids):
    g = dt.ProcessGrid(dims)
    grids.append(g)
    if dims is None or isinstance(dims, int):
        want = (SIZE,)
    else:
        want = tuple(MPI.Compute_dims(SIZE, list(dims)))
    assert g.dims == want
    assert math.prod(g.dims) == SIZE == g.size
    assert g.ndim == len(want)
    assert g.periods == (False,) * len(want)
    # fixed entries are kept
    if isinstance(dims, tuple):
        assert all(d == w for d, w in zip(dims, want) if d)


def test_partially_fixed_dims(grids):
    if SIZE % 2:
        pytest.skip("needs an even number of ranks")
    g = dt.ProcessGrid((2, 0))
    grids.append(g)
    assert g.dims == (2, SIZE // 2)
    g2 = dt.ProcessGrid((0, 2, 0))
    grids.append(g2)
    assert g2.dims[1] == 2 and math.prod(g2.dims) == SIZE


def test_int_dims(grids):
    g = dt.ProcessGrid(SIZE)
    grids.append(g)
    assert g.dims == (SIZE,)


def test_dims_that_cannot_be_completed():
    with pytest.raises(ValueError, match="cannot be completed"):
        dt.ProcessGrid((SIZE + 1, 0))
    with pytest.raises(ValueError, match="non-negative"):
        dt.ProcessGrid((-1, SIZE))
    with pytest.raises(ValueError, match="periods"):
        dt.ProcessGrid((SIZE, 1), periods=(True,))
    assert COMM.allreduce(1) == SIZE


# -- coordinates ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dims", ALL_DIMS)
def test_coords_row_major(dims, grids):
    g = dt.ProcessGrid(dims)
    grids.append(g)
    everyone = COMM.allgather(g.coords)  # collective first: the asserts below are rank-local
    assert g.rank == RANK  # reorder=False: same rank as in the communicator
    want = row_major_coords(RANK, dims)
    assert g.coords == want
    assert tuple(g.cart.Get_coords(RANK)) == want  # MPI agrees
    assert g.rank_of(want) == RANK
    for r in range(SIZE):
        c = row_major_coords(r, dims)
        assert g.coords_of(r) == c == rank_to_coords(r, dims)
        assert g.rank_of(c) == r == coords_to_rank(c, dims) == g.cart.Get_cart_rank(list(c))
    assert sorted(everyone) == sorted(itertools.product(*(range(d) for d in dims)))
    with pytest.raises(IndexError):
        g.rank_of(tuple(d for d in dims))
    with pytest.raises(IndexError):
        g.coords_of(SIZE)


# -- neighbours ----------------------------------------------------------------------------------
@pytest.mark.parametrize("periods", [False, True, "mixed"])
@pytest.mark.parametrize("dims", ALL_DIMS)
def test_neighbors(dims, periods, grids):
    if periods == "mixed":
        periods = tuple(i % 2 == 0 for i in range(len(dims)))
    g = dt.ProcessGrid(dims, periods=periods)
    grids.append(g)
    per = (periods,) * len(dims) if isinstance(periods, bool) else periods
    assert g.periods == per
    me = g.coords
    for axis in range(len(dims)):
        for disp in (-2, -1, 1, 2, dims[axis], dims[axis] + 1):
            for override in (None, False, True):
                p = per[axis] if override is None else override
                c = list(me)
                c[axis] += disp
                if p:
                    c[axis] %= dims[axis]
                want = coords_to_rank(c, dims) if 0 <= c[axis] < dims[axis] else MPI.PROC_NULL
                got = g.neighbor(axis, disp, periodic=override)
                assert got == want, (axis, disp, override, got, want)
        lo, hi = g.neighbors(axis)
        src, dst = g.cart.Shift(axis, 1)  # MPI's own answer for the grid's periodicity
        assert (lo, hi) == (src, dst)
        assert g.neighbors(axis, periodic=True) == (g.neighbor(axis, -1, True), g.neighbor(axis, 1, True))
    with pytest.raises(ValueError, match="grid axis"):
        g.neighbor(len(dims))


def test_neighbors_exchange_consistently(grids):
    """A Sendrecv along every axis with the neighbours reported delivers the right ranks."""
    for dims in ALL_DIMS:
        g = dt.ProcessGrid(dims, periods=True)
        grids.append(g)
        for axis in range(g.ndim):
            lo, hi = g.neighbors(axis)
            got = np.array([-1])
            g.cart.Sendrecv(np.array([g.rank]), dest=hi, recvbuf=got, source=lo)
            assert got[0] == lo


# -- sub-communicators ---------------------------------------------------------------------------
@pytest.mark.parametrize("dims", ALL_DIMS)
def test_sub_comm(dims, grids):
    g = dt.ProcessGrid(dims)
    grids.append(g)
    nd = len(dims)
    for k in range(nd + 1):
        for axes in itertools.combinations(range(nd), k):
            # rank-local checks first, agreed on by every rank before the next collective
            ok, msg = True, ""
            try:
                sub = g.sub_comm(axes)
                assert sub != MPI.COMM_NULL, "got MPI_COMM_NULL"
                assert sub.size == math.prod(dims[a] for a in axes), f"size {sub.size}"
                # rank in the sub-communicator: row-major over the kept axes
                want_rank = coords_to_rank([g.coords[a] for a in axes], [dims[a] for a in axes])
                assert sub.rank == want_rank, f"rank {sub.rank} != {want_rank}"
                # cached: the same object next time, whatever the order/duplicates of axes
                assert g.sub_comm(tuple(reversed(axes)) + axes) is sub, "not cached"
            except Exception as e:  # noqa: BLE001
                ok, msg = False, f"axes {axes}: {type(e).__name__}: {e}"
            assert_all_ranks(COMM, ok, msg)
            # members: exactly the ranks that differ from me only along `axes`, listed in
            # sub-rank order = row-major order of their coordinates
            members = sub.allgather(g.rank)
            others = [a for a in range(nd) if a not in axes]
            want = [r for r in range(SIZE)
                    if all(rank_to_coords(r, dims)[a] == g.coords[a] for a in others)]
            total = sub.allreduce(g.rank)
            assert_all_ranks(COMM, members == want and total == sum(want),
                             f"axes {axes}: members {members} (sum {total}), want {want}")
    with pytest.raises(ValueError, match="grid axes"):
        g.sub_comm((nd,))


# -- default grid --------------------------------------------------------------------------------
def test_default_grid_get_set():
    original = dt.get_default_grid()
    try:
        assert isinstance(original, dt.ProcessGrid)
        assert original.dims == (SIZE,)
        assert dt.get_default_grid() is original  # created once
        x = dt.zeros((2 * SIZE + 1, 3))
        assert x.grid is original and x.split == (0, None)
        if SIZE % 2 == 0:
            g = dt.ProcessGrid((2, SIZE // 2))
        else:
            g = dt.ProcessGrid((SIZE, 1))
        dt.set_default_grid(g)
        assert dt.get_default_grid() is g
        y = dt.ones((5, 4, 3))
        assert y.grid is g and y.split == (0, 1, None)
        np.testing.assert_array_equal(y.to_numpy(), np.ones((5, 4, 3)))
        with pytest.raises(TypeError, match="ProcessGrid"):
            dt.set_default_grid((2, 2))
        assert dt.get_default_grid() is g  # a failed set changes nothing
        dt.set_default_grid(None)  # reset: a fresh 1-D grid over COMM_WORLD on next use
        fresh = dt.get_default_grid()
        assert fresh is not g and fresh.dims == (SIZE,)
        g.free()
        fresh.free()
    finally:
        dt.set_default_grid(original)
    assert_all_ranks(COMM, dt.get_default_grid() is original, "default grid not restored")


def test_grid_over_a_sub_communicator():
    """A grid need not span COMM_WORLD: split the world in halves, each with its own grid."""
    color = RANK % 2
    sub = COMM.Split(color, RANK)
    try:
        g = dt.ProcessGrid((0,), comm=sub)
        assert g.dims == (sub.size,)
        x = dt.arange(7, grid=g)
        np.testing.assert_array_equal(x.to_numpy(), np.arange(7))
        g.free()
    finally:
        sub.Free()
    assert COMM.allreduce(1) == SIZE
