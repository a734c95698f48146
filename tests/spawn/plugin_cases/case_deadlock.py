"""Run under mpiexec by tests/spawn/test_pytest_plugin.py with --mpi-test-timeout: the last
rank skips a collective sum the other ranks enter, so they wait for it forever."""
from mpi4py import MPI

import disttensor as dt


def test_last_rank_skips_the_sum():
    comm = MPI.COMM_WORLD
    grid = dt.ProcessGrid((comm.size,), comm=comm)
    a = dt.arange(4 * comm.size, dtype="float64", grid=grid)
    if comm.rank != comm.size - 1:
        a.sum(axis=0)
