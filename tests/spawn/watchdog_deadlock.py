"""A deliberate deadlock for the watchdog test (``test_watchdog.py``); run under mpiexec with
``DISTTENSOR_COLLECTIVE_TIMEOUT`` set.

``two-comms``: two grids over the same ranks but different communicators; the last rank sums
an array on the second grid while the others sum one on the first, so each waits in an
all-reduce the other never joins.  ``user-barrier``: the last rank skips the library call and
waits in a bare ``MPI_Barrier`` of its own (a wait the library does not see)."""
import sys

from mpi4py import MPI

import disttensor as dt

scenario = sys.argv[1]
comm = MPI.COMM_WORLD
last = comm.rank == comm.size - 1
ga = dt.ProcessGrid((comm.size,), comm=comm)
gb = dt.ProcessGrid((comm.size,), comm=comm.Dup())
a = dt.arange(8 * comm.size, dtype="float64", grid=ga)
b = dt.arange(8 * comm.size, dtype="float64", grid=gb)
print(f"rank {comm.rank} ready", flush=True)
if scenario == "two-comms":
    (b if last else a).sum(axis=0)
elif scenario == "user-barrier":
    if last:
        comm.Barrier()
    else:
        a.sum(axis=0)
print(f"rank {comm.rank} returned (should not happen)", flush=True)
