"""Bad input raises a clear exception on ALL ranks, and the ranks stay in step afterwards.

Every test expects the failure with ``pytest.raises`` on every rank (a rank that does not
raise fails the test, collectively through the conftest safety net) and then runs
:func:`in_step`: a few collectives with no barrier that would hang or mismatch if one rank
were still inside the failed operation.  Some cases fail on one rank only (a wrong local
shape, different arguments per rank); the library must still raise everywhere.
"""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from conftest import assert_all_ranks

COMM = MPI.COMM_WORLD
SIZE = COMM.Get_size()
RANK = COMM.Get_rank()


def in_step(tag: str) -> None:
    """Prove the ranks are still in step: an allreduce, an allgather of which check we are at
    (a rank left behind in another collective would mismatch or hang), and a small
    distributed op on fresh arrays."""
    assert COMM.allreduce(1, op=MPI.SUM) == SIZE
    where = COMM.allgather(tag)
    assert_all_ranks(COMM, all(w == tag for w in where), f"ranks at different places: {where}")
    x = dt.arange(2 * SIZE + 1, dtype="float64")
    assert float(x.sum()) == float(np.arange(2 * SIZE + 1).sum())


def last_rank_only(bad, good):
    """``bad`` on the last rank (so not the root of anything), ``good`` elsewhere."""
    return bad if RANK == SIZE - 1 else good


# -- errors every rank detects from replicated metadata ------------------------------------------
def test_mismatched_shapes_in_binary_op():
    a = dt.zeros((4, 3))
    b = dt.zeros((5,))
    with pytest.raises(ValueError, match=r"could not be broadcast.*\(4, 3\).*\(5,\)"):
        a + b
    with pytest.raises(ValueError, match="broadcast"):
        a * np.ones(5)  # a NumPy operand, too
    in_step("binary")


def test_grid_size_differs_from_comm_size():
    with pytest.raises(ValueError, match=rf"hold {SIZE + 1} ranks but the communicator has {SIZE}"):
        dt.ProcessGrid((SIZE + 1,))
    with pytest.raises(ValueError, match="cannot be completed"):
        dt.ProcessGrid((SIZE + 1, 0))
    in_step("grid size")


def test_split_names_missing_grid_axis():
    grid = dt.get_default_grid()
    with pytest.raises(ValueError, match=r"names grid axis 1 .*only 1 axes"):
        dt.zeros((4, 4), grid=grid, split=(0, 1))
    with pytest.raises(ValueError, match="grid axis"):
        dt.from_global(np.zeros((4, 4)), grid=grid, split=(None, 3))
    with pytest.raises(ValueError, match="more than one tensor axis"):
        dt.zeros((4, 4), grid=grid, split=(0, 0))
    x = dt.zeros((4, 4))
    with pytest.raises(ValueError, match="grid axis"):
        x.redistribute(split=(None, 2))
    in_step("split")


def test_halo_wider_than_global_extent():
    x = dt.zeros((3, 5), halo=((4, 1), (0, 0)))
    with pytest.raises(ValueError, match=r"halo \(4, 1\) on axis 0 is wider than its global extent 3"):
        x.exchange_halo("zero")
    with pytest.raises(ValueError, match="wider than its global extent"):
        x.halo_exchange(("zero", "periodic"))
    with pytest.raises(ValueError, match="wider than its global extent"):
        x.reverse_exchange_halo()
    x.exchange_halo(("periodic", "zero"))  # legal when the axis wraps
    in_step("halo")


def test_inplace_dtype_mismatch():
    a = dt.zeros(5, dtype="int64")
    b = dt.ones(5, dtype="float64")
    with pytest.raises(TypeError, match=r"Cannot cast ufunc 'add' output from dtype\('float64'\)"):
        a += b
    with pytest.raises(TypeError, match="Cannot cast ufunc"):
        a *= 1.5
    np.testing.assert_array_equal(a.to_numpy(), np.zeros(5, dtype="int64"))  # unchanged
    in_step("inplace")


def test_out_of_range_integer_index():
    x = dt.arange(4)
    with pytest.raises(IndexError, match="index 10 is out of bounds for axis 0 with size 4"):
        x[10]
    with pytest.raises(IndexError, match="out of bounds"):
        x[-5]
    with pytest.raises(IndexError, match="out of bounds"):
        x[4] = 1
    y = dt.zeros((3, 2))
    with pytest.raises(IndexError, match="index 2 is out of bounds for axis 1 with size 2"):
        y[0, 2]
    in_step("index range")


def test_too_many_indices():
    x = dt.arange(4)
    with pytest.raises(IndexError, match="too many indices for array: array is 1-dimensional, but 2"):
        x[0, 0]
    with pytest.raises(IndexError, match="too many indices"):
        dt.zeros((2, 2))[:, :, 0]
    in_step("too many")


def test_other_collective_argument_errors():
    x = dt.zeros(4)
    with pytest.raises(ValueError, match=rf"root {SIZE} outside 0..{SIZE - 1}"):
        x.gather(root=SIZE)
    with pytest.raises(ValueError, match=r"ownership sizes .* summing to the extent 4"):
        dt.zeros(4, sizes=[(5,) + (0,) * (SIZE - 1)])
    with pytest.raises(ValueError, match="'zero' or 'periodic'"):
        dt.zeros(4, halo=1).exchange_halo("mirror")
    in_step("misc")


# -- errors only some ranks see ------------------------------------------------------------------
def test_from_local_blocks_that_do_not_fit():
    if SIZE > 1:
        # an unsplit axis with a different extent on one rank
        local = np.zeros((2, last_rank_only(4, 3)))
        with pytest.raises(ValueError, match=r"axis 1 is not split but the local extents differ"):
            dt.from_local(local)
        # a different number of axes on one rank
        local = last_rank_only(np.zeros((2, 3, 1)), np.zeros((2, 3)))
        with pytest.raises(ValueError, match="different numbers of axes"):
            dt.from_local(local)
    # a block that does not match an explicit distribution on one rank only
    dist = dt.Distribution((2 * SIZE, 3), (SIZE,), (0, None))
    local = np.zeros(last_rank_only((3, 3), (2, 3)))
    with pytest.raises(ValueError, match=r"does not match the distribution's block \(2, 3\)"):
        dt.from_local(local, distribution=dist)
    in_step("from_local")


def test_from_local_replicas_disagree():
    """Split over grid axis 1 of a (2, p/2) grid: ranks along grid axis 0 hold the same block
    coordinate, so their extents along the split axis must agree."""
    if SIZE % 2:
        pytest.skip("needs an even number of ranks")
    grid = dt.ProcessGrid((2, SIZE // 2))
    try:
        local = np.zeros((last_rank_only(3, 2), 4))
        with pytest.raises(ValueError, match="hold different extents of tensor axis 0"):
            dt.from_local(local, grid=grid, split=(1, None))
    finally:
        grid.free()
    in_step("replicas")


def test_process_grid_dims_differ_between_ranks():
    if SIZE == 1:
        pytest.skip("needs two ranks to differ")
    with pytest.raises(ValueError, match="grid dims and periods differ between ranks"):
        dt.ProcessGrid(last_rank_only((1, SIZE), (SIZE, 1)))
    # a valid shape on most ranks but an invalid one on the last rank
    with pytest.raises(ValueError, match=r"hold .* ranks but the communicator has"):
        dt.ProcessGrid(last_rank_only((SIZE + 1,), (SIZE,)))
    with pytest.raises(ValueError, match="differ between ranks"):
        dt.ProcessGrid((SIZE,), periods=last_rank_only(True, False))
    in_step("grid dims")


@pytest.mark.parametrize("root", sorted({0, SIZE - 1}))
def test_from_global_root_passes_none(root):
    a = None if RANK == root else np.arange(6.0)  # the others' arrays are ignored
    with pytest.raises(ValueError, match="the root rank must pass the array"):
        dt.from_global(a, root=root)
    with pytest.raises(ValueError, match=rf"root {SIZE} outside"):
        dt.from_global(np.arange(6.0), root=SIZE)
    in_step("from_global root")


def test_from_global_arrays_differ_without_root():
    if SIZE == 1:
        pytest.skip("needs two ranks to differ")
    with pytest.raises(ValueError, match="differ between ranks"):
        dt.from_global(np.zeros(last_rank_only(4, 3)))
    in_step("from_global differ")


def test_halo_widths_differ_between_ranks():
    if SIZE == 1:
        pytest.skip("needs two ranks to differ")
    x = dt.zeros((3 * SIZE, 4), halo=last_rank_only(2, 1))
    with pytest.raises(ValueError, match="must be the same on every rank"):
        x.exchange_halo()
    y = dt.zeros((3 * SIZE, 4), halo=1)
    with pytest.raises(ValueError, match="must be the same on every rank"):
        y.exchange_halo(last_rank_only("periodic", "zero"))
    # one rank invalid (too wide for a non-periodic axis), the others fine
    z = dt.zeros((2, 4), halo=((last_rank_only(3, 1), 0), (0, 0)))
    with pytest.raises(ValueError, match="wider than its global extent"):
        z.exchange_halo()
    in_step("halo per rank")


def test_grids_over_different_communicators():
    if SIZE == 1:
        pytest.skip("needs two ranks")
    sub = COMM.Split(0, SIZE - 1 - RANK)  # same group, reversed order
    try:
        g = dt.ProcessGrid((SIZE,), comm=sub)
        x = dt.zeros(5)
        with pytest.raises(ValueError, match="different communicators"):
            x.redistribute(grid=g)
        g.free()
    finally:
        sub.Free()
    in_step("communicators")
