"""Probe how an MPI library behaves when oversubscribed (more ranks than cores).

    mpiexec -n 4 .venv/bin/python -m mpi4py scripts/mpi_oversub_probe.py

Prints (rank 0) three timings:
  pingpong_us   round trip of an 8-byte message between pairs (0,1), (2,3), ...
  allreduce_us  one 8-byte MPI_Allreduce over all ranks
  compute_ms    a fixed NumPy workload on rank 0 while the other ranks wait in a Barrier
                (busy-polling waiters steal the CPU from the rank that does the work)
(compare compute_ms with an -n 1 run: the same workload with nobody waiting).
Used to choose the MPICH settings exported by scripts/test.sh.
"""
import sys
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
iters = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
buf = np.zeros(1)
out = np.zeros(1)


def work():
    a = np.random.default_rng(0).random((300, 300))
    t = time.perf_counter()
    for _ in range(20):
        a = np.tanh(a @ a / 300.0)
    return time.perf_counter() - t


comm.Barrier()
# ping-pong
peer = rank ^ 1
t0 = time.perf_counter()
if peer < size:
    for _ in range(iters):
        if rank % 2 == 0:
            comm.Send(buf, peer)
            comm.Recv(buf, peer)
        else:
            comm.Recv(buf, peer)
            comm.Send(buf, peer)
pp = (time.perf_counter() - t0) / iters * 1e6
comm.Barrier()
t0 = time.perf_counter()
for _ in range(iters):
    comm.Allreduce(buf, out)
ar = (time.perf_counter() - t0) / iters * 1e6
comm.Barrier()
# compute on rank 0 while the others wait
comp = work() if rank == 0 else 0.0
comm.Barrier()
pps = comm.gather(pp)
ars = comm.gather(ar)
if rank == 0:
    print(f"n={size} pingpong_us={max(pps):.1f} allreduce_us={max(ars):.1f} "
          f"compute_ms={comp * 1e3:.1f}", flush=True)
