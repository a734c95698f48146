"""Smoke tests of the MPI test harness itself (conftest helpers and strategies), collectively."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from conftest import assert_all_ranks, assert_allclose_all
from disttensor.testing.strategies import all_grid_dims, explicit_sizes, grids, shapes, splits

SIZE = MPI.COMM_WORLD.Get_size()


def test_comm_fixture_is_world(comm):
    assert comm is MPI.COMM_WORLD
    assert_all_ranks(comm, comm.Get_size() == SIZE, "comm size")


def test_hypothesis_profile_is_deterministic():
    s = settings.default
    assert s.derandomize and s.database is None and s.deadline is None
    assert s.max_examples == int(os.environ.get("DISTTENSOR_HYPOTHESIS_EXAMPLES", "25"))


@given(dims=grids(SIZE, 3), shape=shapes(0, 4, 5), data=st.data())
def test_all_ranks_draw_the_same_examples(comm, dims, shape, data):
    split = data.draw(splits(len(shape), len(dims)))
    sizes = data.draw(explicit_sizes(shape[0] if shape else 0, dims[0]))
    mine = (dims, shape, split, sizes)
    everyone = comm.allgather(mine)
    assert_all_ranks(comm, all(x == mine for x in everyone),
                     f"rank {comm.Get_rank()} drew {mine}, others {everyone}")


@given(dims=grids(SIZE, 3), ndim=st.integers(0, 5), data=st.data())
def test_strategy_invariants(comm, dims, ndim, data):
    assert math.prod(dims) == SIZE and 1 <= len(dims) <= 3
    split = data.draw(splits(ndim, len(dims)))
    used = [a for a in split if a is not None]
    assert len(split) == ndim and len(used) == len(set(used))
    assert all(0 <= a < len(dims) for a in used)
    if ndim >= len(dims):
        covered = data.draw(splits(ndim, len(dims), cover=True))
        assert sorted(a for a in covered if a is not None) == list(range(len(dims)))
    n = data.draw(st.integers(0, 7))
    p = data.draw(st.integers(1, 5))
    sizes = data.draw(explicit_sizes(n, p))
    assert len(sizes) == p and sum(sizes) == n and min(sizes) >= 0
    shape = data.draw(shapes(1, 3, 4))
    assert 1 <= len(shape) <= 3 and all(0 <= s <= 4 for s in shape)


def test_all_grid_dims_enumeration():
    assert all_grid_dims(1, 2) == ((1,), (1, 1))
    assert all_grid_dims(4, 2) == ((4,), (1, 4), (2, 2), (4, 1))
    assert set(all_grid_dims(12, 2)) == {(12,), (1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)}
    assert len(all_grid_dims(6, 3)) == 1 + 4 + 9  # (6,); 4 ordered pairs; 9 ordered triples


def test_assert_all_ranks_passes(comm):
    assert_all_ranks(comm, True, "never shown")


def test_assert_all_ranks_raises_everywhere_when_only_rank0_fails(comm):
    with pytest.raises(AssertionError, match=r"failed on rank 0 of") as info:
        assert_all_ranks(comm, comm.Get_rank() != 0, "rank 0 says no")
    assert "rank 0 says no" in str(info.value)


def test_assert_allclose_all_raises_everywhere_when_last_rank_differs(comm):
    desired = np.arange(1.0, 5.0)
    actual = desired.copy()
    if comm.Get_rank() == comm.Get_size() - 1:
        actual[1] += 1.0
    with pytest.raises(AssertionError, match=rf"Mismatched elements: 1 / 4 on rank {comm.Get_size() - 1}\n"):
        assert_allclose_all(comm, actual, desired, rtol=1e-12, atol=0)
    assert_allclose_all(comm, desired + 1e-13, desired, rtol=1e-12, atol=0)


def test_shared_tmp_path_is_shared(comm, shared_tmp_path):
    paths = comm.allgather(str(shared_tmp_path))
    assert_all_ranks(comm, len(set(paths)) == 1, f"paths differ: {paths}")
    if comm.Get_rank() == 0:
        (shared_tmp_path / "hello.txt").write_text("from rank 0")
    comm.Barrier()
    text = (shared_tmp_path / "hello.txt").read_text()
    assert_all_ranks(comm, text == "from rank 0", f"read {text!r}")
