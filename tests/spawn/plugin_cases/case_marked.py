"""Tests marked @pytest.mark.mpi(n=...) mixed with a serial one, for
tests/spawn/test_pytest_plugin.py (plain pytest launches the marked ones in mpiexec)."""
import os

import pytest


def test_serial():
    assert "PMI_RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ


@pytest.mark.mpi(n=2)
def test_two_ranks_pass(tmp_path):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    assert comm.size == 2
    assert comm.allreduce(comm.rank + 1) == 3
    (tmp_path / "ok").write_text(str(comm.rank))  # each rank has its own tmp_path


@pytest.mark.mpi(n=2)
def test_two_ranks_fail_on_rank_1():
    from mpi4py import MPI
    assert MPI.COMM_WORLD.rank == 0, "deliberate failure on rank 1"


@pytest.mark.mpi(n=3)
def test_needs_three_ranks():
    from mpi4py import MPI
    assert MPI.COMM_WORLD.size == 3


@pytest.mark.mpi(n=[1, 2])
def test_one_or_two_ranks():
    from mpi4py import MPI
    assert MPI.COMM_WORLD.allreduce(1) == MPI.COMM_WORLD.size
