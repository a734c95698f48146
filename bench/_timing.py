"""Timing helpers shared by the benchmarks: collective wall times of the slowest rank, and
medians of interleaved repetitions.  mpi4py is imported on the first collective timing only,
so single-process benchmarks run in environments without it (e.g. one with PyTorch for a
comparison)."""
from __future__ import annotations

import os
import statistics
import time

IDLE_SPIN_NS = 2_000_000
"""The idle-sleep shim's spin budget the step benchmarks run with (:func:`spin_before_sleep`)."""


def spin_before_sleep(budget_ns: int = IDLE_SPIN_NS) -> int:
    """Give the MPICH idle-sleep shim (``build/libmpi_idle_sleep.so``, preloaded by
    ``bench/run_all.py``) a spin budget for this process: an MPI wait keeps polling (as MPICH does
    without the shim) for ``budget_ns`` before it yields and sleeps, instead of sleeping
    ~55 us after 16 idle polls.  Call it before ``mpi4py.MPI`` is imported (the shim
    reads ``DISTTENSOR_MPI_IDLE_SPIN_NS`` once).  Set only where the launcher put no more
    ranks on this machine than it has cores (``MPI_LOCALNRANKS`` or ``PMI_SIZE``; one rank
    per core, so a spinning rank takes no core from a rank it waits for) and the variable is
    not set already (the caller's choice wins).  Why: a 2-rank step meets its partner a dozen
    times; with the shim's default each meeting where the partner is a little late costs a
    timer wake-up (~55 us and a context switch), about 1 ms per step of an 8^3 CosmoFlow
    (``bench/README.md``, ``step_floor_bench.py``), which users, who run without the shim,
    do not pay.  Any longer wait polls for ``budget_ns``, then sleeps.
    Returns the budget in force (0: none).  (:func:`wall_and_cpu` makes a rank that sits a
    case out wait outside MPI, so the budget is spent in the timed steps' own waits.)"""
    name = "DISTTENSOR_MPI_IDLE_SPIN_NS"
    if name in os.environ:
        try:
            return int(os.environ[name])
        except ValueError:
            return 0
    ranks = next((os.environ[v] for v in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                          "PMI_SIZE") if os.environ.get(v)), "1")
    try:
        oversubscribed = int(ranks) > (os.cpu_count() or 1)
    except ValueError:
        oversubscribed = True
    if oversubscribed:
        return 0
    os.environ[name] = str(int(budget_ns))
    return int(budget_ns)


def timed(fn) -> float:
    """Seconds of one collective call, the slowest rank's, after a barrier."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    dt_ = time.perf_counter() - t0
    return comm.allreduce(dt_, op=MPI.MAX)


def quiet_wait(comm, nap: float = 2e-4) -> None:
    """Wait until every rank of ``comm`` is here without waiting inside MPI: a non-blocking
    barrier tested every ``nap`` seconds, asleep in between.  A rank that sits a timed case
    out (the other rank's 1-rank or PyTorch case) waits here instead of in MPI, where MPICH
    polls (and the idle-sleep shim polls within its spin budget, then wakes every ~55 us):
    it leaves the cores to the case being timed, PyTorch's second thread included."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(nap)


def wall_and_cpu(fns: dict, cpu: dict, walls: dict | None = None):
    """A ``compare`` timer for the functions ``fns`` (name -> function, called collectively
    on COMM_WORLD): returns the slowest rank's wall seconds of one call, after a barrier, and
    appends the CPU seconds summed over the ranks to ``cpu[name]`` (the work, insensitive to
    other jobs taking the cores) and, when given, the wall seconds to ``walls[name]``.  After
    the call the ranks meet in :func:`quiet_wait`, so a rank with nothing to do in a case
    sleeps while the others are timed."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    owner = {id(f): name for name, f in fns.items()}

    def timer(fn) -> float:
        comm.Barrier()
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        spent, used = time.perf_counter() - t0, time.process_time() - c0
        quiet_wait(comm)  # (a rank sitting the case out sleeps here, off the cores)
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


def cpu_per_call(fns: dict, comm, reps: int, calls: int, warmup: int = 2) -> dict:
    """Per function, the list of ``reps`` CPU seconds per call (``calls`` calls in a row after
    a barrier, ``time.process_time``), each the largest over the ranks of ``comm``
    (collective); the functions take turns within each repetition, and the first ``warmup``
    repetitions (compilation, plans, pools) are dropped."""
    from mpi4py import MPI
    times = {k: [] for k in fns}
    for rep in range(reps + warmup):
        for name, fn in fns.items():
            comm.Barrier()
            t0 = time.process_time()
            for _ in range(calls):
                fn()
            t = (time.process_time() - t0) / calls
            if rep >= warmup:
                times[name].append(comm.allreduce(t, op=MPI.MAX))
    return times


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
