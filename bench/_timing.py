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


def wall_and_cpu(fns: dict, cpu: dict, walls: dict | None = None):
    """A ``compare`` timer for the functions ``fns`` (name -> function, called collectively
    on COMM_WORLD): returns the slowest rank's wall seconds of one call, after a barrier, and
    appends the CPU seconds summed over the ranks to ``cpu[name]`` (the work, insensitive to
    other jobs taking the cores) and, when given, the wall seconds to ``walls[name]``."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    owner = {id(f): name for name, f in fns.items()}

    def timer(fn) -> float:
        comm.Barrier()
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        spent, used = time.perf_counter() - t0, time.process_time() - c0
        cpu[owner[id(fn)]].append(comm.allreduce(used, op=MPI.SUM))
        spent = comm.allreduce(spent, op=MPI.MAX)
        if walls is not None:
            walls[owner[id(fn)]].append(spent)
        return spent
    return timer


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


def on_rank0(fn):
    """``fn`` wrapped to run on rank 0 alone while the other ranks wait at a barrier: a
    one-process baseline (NumPy) that :func:`timed` can time next to a collective call."""
    def run():
        from mpi4py import MPI
        if MPI.COMM_WORLD.rank == 0:
            fn()
        MPI.COMM_WORLD.Barrier()
    return run


def as_numpy(result):
    """A DistArray result gathered to NumPy on every rank (tuples and lists element-wise)."""
    import numpy as np
    if isinstance(result, (tuple, list)):
        return tuple(as_numpy(r) for r in result)
    return result.to_numpy() if hasattr(result, "to_numpy") else np.asarray(result)


def results_agree(got, want, rtol: float, scale_floor: float = 0.0) -> bool:
    """Whether ``got`` equals NumPy's ``want``: float results within ``rtol`` relative and
    ``rtol * max(max|want|, scale_floor)`` absolute, the others exactly (tuples element-wise)."""
    import numpy as np
    if isinstance(want, (tuple, list)):
        return all(results_agree(g, w, rtol, scale_floor) for g, w in zip(got, want))
    w = np.asarray(want)
    if w.dtype.kind == "f":
        atol = rtol * max(np.abs(w).max(), scale_floor)
        return bool(np.allclose(got, w, rtol=rtol, atol=atol))
    return bool(np.array_equal(got, w))


def versus_numpy(ours, theirs, reps: int, warmup: int, rtol: float,
                 scale_floor: float = 0.0) -> tuple[float, float, bool]:
    """``(seconds of ours, seconds of NumPy's theirs on one process, results agree)``: ``ours``
    (collective) against ``theirs`` run on rank 0 alone, timed interleaved by :func:`compare`,
    then the results compared (:func:`results_agree`)."""
    t = compare({"ours": ours, "numpy": on_rank0(theirs)}, reps, warmup)
    ok = results_agree(as_numpy(ours()), theirs(), rtol, scale_floor)
    return t["ours"], t["numpy"], ok


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
