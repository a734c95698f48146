"""Timing helpers shared by the benchmarks: collective wall times of the slowest rank, and
medians of interleaved repetitions.  mpi4py is imported on the first collective timing only,
so single-process benchmarks run in environments without it (e.g. one with PyTorch for a
comparison)."""
from __future__ import annotations

import statistics
import time


def timed(fn) -> float:
    """Seconds of one collective call, the slowest rank's, after a barrier."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    dt_ = time.perf_counter() - t0
    return comm.allreduce(dt_, op=MPI.MAX)


def wall(fn) -> float:
    """Seconds of one call on this process alone (no MPI)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def compare(fns: dict, reps: int, warmup: int, timer=timed) -> dict:
    """Median seconds of each function, called interleaved (rotating who goes first) so that
    drift of this noisy machine hits all of them alike.  ``timer``: :func:`timed` (collective,
    slowest rank) or :func:`wall` (this process)."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    times = {k: [] for k in fns}
    keys = list(fns)
    for i in range(reps):
        for k in keys[i % len(keys):] + keys[:i % len(keys)]:
            times[k].append(timer(fns[k]))
    return {k: statistics.median(v) for k, v in times.items()}


def gpu_module():
    """CuPy where it imports and sees a CUDA device, else None (the GPU benchmarks then exit
    0 with a message)."""
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device
        pass
    return None
