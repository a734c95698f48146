"""Run under mpiexec by tests/spawn/test_pytest_plugin.py: the first test fails on the last
rank only (a rank-local assert); the second passes everywhere (the ranks stay in step)."""
from mpi4py import MPI


def test_fails_on_last_rank_only():
    comm = MPI.COMM_WORLD
    assert comm.rank != comm.size - 1, f"deliberate failure on rank {comm.rank}"


def test_after_the_failure():
    assert MPI.COMM_WORLD.allreduce(1) == MPI.COMM_WORLD.size
